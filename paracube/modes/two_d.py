"""2D tensor parallelism (SUMMA; Xu et al. 2021, Optimus). Mesh axes row, col of a q x q grid.

`TwoD` ("2d", what paracube's executor runs: operands gathered once per GEMM). Its SUMMA variant, the 2D that
Bian et al. 2021 compare against (q broadcast steps per GEMM operand, `tp=2d:QxQ,summa`), is two_d_summa.py.

Activations [T, h]: tokens split over `row`, hidden over `col`; every weight [h_in, h_out] is split in
q x q blocks (rows of A over `col`, columns over `row`). A linear gathers X over `col` and its weight
block over `row` (compute dtype) and its bias over `row` (fp32); backward reduce-scatters dX over `col`
and dA, dbias over `row`. A LayerNorm all-reduces its statistics over `col` and gathers gamma (beta)
over `row`. The embedding reduce-scatters its fp32 output over `row` (pos_emb gathered over `row`); the
vocabulary is split q ways and the cross-entropy all-reduces max and sum over `col`. `depth` stays 1
here; 2.5D (two_half_d.py) runs this on each of its depth layers.

Tied embeddings: the head's weight IS the table, used in place. Rank (i, j) holds E[V block i, h block j] and
X[tokens block i, h block j]: both split the contraction (h) over `col`, and the table's vocabulary block shares
X's token index i, so no weight gather can bring rank (i, j) a vocabulary block of its own tokens. Instead the
head gathers X over `row` ([T, h/q], the bytes of the untied X gather), multiplies it by E_local^T ([T, V/q],
partial over the hidden split) and reduce-scatters that over `col` along the tokens: logits of tokens block j
x vocabulary block i (the cross-entropy reduces over `row`). Backward: dY gathered over `col`, dX reduce-
scattered over `row`, dE = dY^T X local (summed with the lookup's gradient by autograd, once). Against the
untied head this trades the weight gather and its gradient's reduce-scatter (c h V / q each) for the logits'
reduce-scatter and dY's gather (c T V / q each, T the micro-batch's tokens / depth): cheaper where T < h
(and it is what a 2D layout of one table costs without a transposing exchange between ranks (i, j), (j, i)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from paracube.modes.base import (
    COMPUTE,
    F32,
    TOKEN_RULE,
    Collective,
    IntOrArr,
    TensorMode,
    attention_width_rules,
    chunks,
    coll,
    divides,
    split,
    split_embedding,
    tokens_split_ok,
)
from paracube.modes.executor_support import ExecutorSupport
from paracube.modes.head_norm import gamma_grads

ROW, COL = ("row",), ("col",)


def tokens_per_rank(z: Any) -> Any:
    """Tq: tokens of one rank (each depth layer works on T/d, split q ways over row)."""
    return z.T // z.depth // z.q


def norm_collectives(d: Any, label: str, backward: bool) -> list[Collective]:
    phase = "bwd" if backward else "fwd"
    out = [coll("all_reduce", COL, F32, lambda z: 4 * d.stat_width * tokens_per_rank(z), f"{label}.stats", phase)]
    kind = "reduce_scatter" if backward else "all_gather"
    out += [coll(kind, ROW, F32, lambda z: 4 * d.h // z.q, f"{label}.param", phase)] * d.norm_vectors
    return out


def summa_ring(n: int, paired: bool) -> tuple[float, ...]:
    """X's and A's lock-step rings of a 2D forward (collective_matmul_2d.py) on their slowest rank: rank (i, j),
    d = i - j, holds both blocks of term k from step min(d, q - d) on and of a second term from max(d, q - d) on
    (one term a step on the diagonal), so its exchanges carry 0, then 1, then 2 terms of 1/q of the GEMM; the
    exposed time grows with min(d, q - d), the slowest rank has d = q // 2: floor(q/2) exchanges with no term
    (at q = 2 the one exchange), then q - 2 floor(q/2) with one, floor(q/2) - 1 with two. Not paired (kw=1, the
    weight gathered earlier in the step): X's ring alone, each step with its term (`chunks`)."""
    if not paired:
        return chunks(n, paired)
    m = n // 2
    return (0.0,) * m + (1.0 / n,) * (n - 2 * m) + (2.0 / n,) * (m - 1)


def _linear(d: Any, label: str, h_in: int, h_out: int | None, bias: bool, backward: bool,
            tpo: bool = False) -> list[Collective]:
    """h_out None: the vocabulary (head). tpo (a block's linears), as collective_matmul_2d.py runs them: X's
    gather over col and the weight's over row in lock step with the forward GEMM's terms X_k A_k (`summa_ring`),
    dX's reduce-scatter with the dX GEMM's chunks dY A_k^T and dA's with the dA GEMM's X_k^T dY (`chunks`; kw=1:
    dA's once per step, on the last micro-batch's chunks). The bias collectives are not overlapped."""
    f, dx, da = (f"{label}.f", f"{label}.dx", f"{label}.da") if tpo else ("", "", "")

    def width(z: Any) -> Any:
        return z.V if h_out is None else h_out

    def x_bytes(z: Any) -> Any:
        return d.c * tokens_per_rank(z) * h_in

    def a_bytes(z: Any) -> Any:
        return d.c * h_in * width(z) // z.q

    def b_bytes(z: Any) -> Any:
        return 4 * width(z) // z.q

    phase = "bwd" if backward else "fwd"
    if not backward:
        out = [coll("all_gather", COL, COMPUTE, x_bytes, f"{label}.X", tpo=f, ring=summa_ring, lockstep=True),
               coll("all_gather", ROW, COMPUTE, a_bytes, f"{label}.A", kept=True, tpo=f, ring=summa_ring,
                    lockstep=True)]
        return out + ([coll("all_gather", ROW, F32, b_bytes, f"{label}.bias", kept=True)] if bias else [])
    out = [coll("reduce_scatter", COL, COMPUTE, x_bytes, f"{label}.dX", phase, tpo=dx, ring=chunks),
           coll("reduce_scatter", ROW, COMPUTE, a_bytes, f"{label}.dA", phase, kept=True, tpo=da, ring=chunks)]
    return out + ([coll("reduce_scatter", ROW, F32, b_bytes, f"{label}.dbias", phase, kept=True)] if bias else [])


def _tied_head(d: Any, mode: TensorMode, backward: bool) -> list[Collective]:
    """The tied head on the table's blocks (module docstring; roles `mode.tied_head_roles`, no weight gather):
    X [T/d, h/q] gathered over I, the [T/d, V/q] partial logits reduce-scattered over O; backward dY gathered
    over O, dX reduce-scattered over I (compute dtype)."""
    i_ax, _, o_ax = mode.tied_head_roles  # type: ignore[misc]

    def x_bytes(z: Any) -> Any:
        return d.c * (z.T // z.depth) * d.h // z.q

    def y_bytes(z: Any) -> Any:
        return d.c * (z.T // z.depth) * z.V // z.q

    if not backward:
        return [coll("all_gather", i_ax, COMPUTE, x_bytes, "head.X"),
                coll("reduce_scatter", o_ax, COMPUTE, y_bytes, "head.Y")]
    return [coll("all_gather", o_ax, COMPUTE, y_bytes, "head.dY", "bwd"),
            coll("reduce_scatter", i_ax, COMPUTE, x_bytes, "head.dX", "bwd")]


def block(d: Any, backward: bool, norm: Any, linear: Any, kv: list[Collective]) -> list[Collective]:
    """A block's collectives in forward order: ln1, qkv, the attention's `kv` (the key / value gather of a sequence
    split over ranks: TensorMode.kv_gathers, its forward or backward half; the q / k norms' gamma gradients:
    head_norm.gamma_grads), proj, ln2, fc, fc2 (shared with 3D). norm(d, label, backward); linear(d, index,
    label, h_in, h_out, bias, backward)."""
    out: list[Collective] = []
    for n, (name, h_in, h_out, bias) in enumerate(d.linears):
        if n in (0, 2):
            out += norm(d, f"ln{n // 2 + 1}", backward)
        out += linear(d, n, name, h_in, h_out, bias, backward)
        if n == 0:
            out += [c for c in kv if (c.phase == "bwd") == backward]
    return out


def _block_linear(d: Any, n: int, label: str, h_in: int, h_out: int, bias: bool, backward: bool) -> list[Collective]:
    return _linear(d, label, h_in, h_out, bias, backward, tpo=True)


class TwoD(TensorMode):
    name = "2d"
    axes = ("row", "col")
    shape_rule = "tp=2d:qxq, a square grid (q x q = 4, 9, 16, 64, ...)"
    no_shape = "2d needs a square number of tensor ranks (4, 9, 16, ...) dividing the GPU count: {n} has none"
    alternating = True
    keeps_weights = True
    paper = "Optimus (Xu et al. 2021), SUMMA"
    collective_axes = (ROW, COL)
    executor = ExecutorSupport("paracube.executor.layers.two_d:Mode2D", pipeline=True, zero_stages=(0, 1, 2, 3),
                               tpo=True)
    ops_layer, ops_edge = 287, 162
    replicates_activations = False
    token_axes = attention_token_axes = ROW
    ties_embeddings = True
    tied_head_roles = ("row", "", "col")  # X gathered over row, the table used in place, logits scattered over col
    tied_token_axes, tied_vocab_axes = COL, ROW
    rules = (
        (TOKEN_RULE, lambda d, b: tokens_split_ok(b.mb, d.s, b.q * b.depth)),
        ("heads % q != 0", lambda d, b: divides(d.heads, b.q)),
        ("kv heads % q != 0", lambda d, b: divides(d.kv_heads, b.q)),
        ("hidden % q^2 != 0", lambda d, b: divides(d.h, b.q**2)),
        *attention_width_rules("q^2", lambda b: b.q**2),
        ("ffn hidden % q^2 != 0", lambda d, b: divides(d.f, b.q**2)),
        ("seq % q != 0", lambda d, b: divides(d.s, b.q)),
    )

    def shape_ok(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == 2 and shape[0] == shape[1] >= 1

    def shapes(self, gpus: int) -> list[tuple[int, ...]]:
        return [(q, q) for q in range(2, math.isqrt(gpus) + 1) if gpus % (q * q) == 0]

    def axis_sizes(self, q: IntOrArr, t: IntOrArr, depth: IntOrArr) -> dict[str, IntOrArr]:
        return {"row": q, "col": q}

    def token_split(self, q: int, depth: int) -> int:
        return q * depth

    def vocab_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        return q

    def head_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        return q

    def paper_layer_bytes(self, T: float, linears: Sequence[tuple[str, int, int]], shape: tuple[int, ...],
                          e: float) -> float:
        """SUMMA on a q x q grid (p = q^2): forward C = AB takes q steps, each a broadcast of an activation
        block (T h_in / q^2) along the row and of a weight block (h_in h_out / q^2) along the column; backward
        runs the two SUMMA variants (dX = dY B^T: broadcast B, reduce dX; dB = X^T dY: broadcast X, reduce
        dB), twice the forward volume:  3 * (q-1)/q * sum(T h_in + h_in h_out) / q * e = O((bsh + h^2)/p^(1/2))."""
        q = shape[0]
        return 3 * (q - 1) / q * sum(T * i + i * o for _, i, o in linears) / q * e

    # --- parameters: every parameter once per q x q grid ------------------------------------------------------
    def local_params(self, d: Any, t: IntOrArr, q: IntOrArr, layers: IntOrArr, first: IntOrArr,
                     last: IntOrArr) -> IntOrArr:
        return super().local_params(d, t, q, layers, first, last) // (q * q)

    def linear_shard(self, h_in: int, h_out: int, bias: bool, row: bool, t: int, q: int) -> int:
        return (h_in // q) * (h_out // q) + ((h_out // q) // q if bias else 0)

    def vector_shard(self, h: int, t: int, q: int) -> int:
        return h // q // q

    def embedding_shard(self, V: int, pos: int, h: int, t: int, q: int) -> int:
        return V // q * (h // q) + pos // q * (h // q)

    def head_shard(self, h: int, V: int, t: int, q: int) -> int:
        return (h // q) * (V // q)

    # --- collectives ----------------------------------------------------------------------------------------
    def embedding(self, d: Any) -> list[Collective]:
        def tok(z: Any) -> Any:
            return 4 * (z.T // z.depth) * d.h // z.q

        return split_embedding(d, ROW, tok)

    def layer_fwd(self, d: Any) -> list[Collective]:
        return block(d, False, norm_collectives, _block_linear, self.kv_gathers(d) + gamma_grads(d, self))

    def layer_bwd(self, d: Any) -> list[Collective]:
        return block(d, True, norm_collectives, _block_linear, self.kv_gathers(d) + gamma_grads(d, self))

    def head(self, d: Any) -> list[Collective]:
        """ln_f, the head (tied: `_tied_head`) and the cross-entropy's max and sum over the logits' vocabulary
        axis (untied col, tied row)."""
        out: list[Collective] = []
        for backward in (False, True):
            out += norm_collectives(d, "ln_f", backward)
            out += _tied_head(d, self, backward) if d.tied else _linear(d, "head", d.h, None, False, backward)
        vocab = self.tied_vocab_axes if d.tied else COL
        return out + [coll("all_reduce", vocab, F32, lambda z: 4 * tokens_per_rank(z), "loss.max"),
                      coll("all_reduce", vocab, F32, lambda z: 8 * tokens_per_rank(z), "loss.sum")]

    # --- compute and memory ---------------------------------------------------------------------------------
    def gemm_shape(self, T: IntOrArr, h_in: IntOrArr, h_out: IntOrArr, column: bool, t: IntOrArr,
                   q: IntOrArr, depth: IntOrArr) -> tuple[IntOrArr, IntOrArr, IntOrArr]:
        return split(T, depth * q), split(h_out, q), h_in

    def activation_split(self, t: Any, q: Any, depth: Any) -> dict[str, Any]:
        return {"tok": q * depth, "all": t, "gx": q * depth, "gw": q, "vocab": q}

    def megatron_block(self, d: Any, X: Any, att: Any, sbh: Any, T: Any, t: Any, q: Any, depth: Any,
                       sp: Any, scale: float) -> Any:
        """(X + att)/t + the gathered inputs and weights the linears save: c (T/(dq) sum(h_in) (1 - 1/q)
        + sum(h_in h_out)/q)."""
        gathered = d.c * (T / (depth * q) * d.sum_hin() * (1 - 1 / q) + d.sum_w() / q)
        return scale * (X + att) / t + gathered

    def linear_temporaries(self, c: int, T: Any, h_in: int, h_out: Any, t: Any, q: Any, depth: Any) -> Any:
        tq = T / (depth * q)
        return c * (tq * h_in + 2 * h_in * h_out / q + tq * h_out)

    def tied_head_temporaries(self, c: int, T: Any, h: int, V: Any, t: Any, q: Any, depth: Any) -> Any:
        """X gathered over row [T/d, h/q], the partial logits [T/d, V/q] and their reduce-scattered block."""
        return c * (T / depth * h / q + T / depth * V / q + T / (depth * q) * V / q)

    def executor_rules(self, s: int, h: int, f: int, V: int, heads: int, q: int,
                       micro_batch: int | None) -> list[tuple[str, int, int]]:
        return [("heads", heads, q), ("hidden", h, q * q),
                ("ffn_hidden", f, q * q), ("seq_len", s, q)]


MODE = TwoD()
