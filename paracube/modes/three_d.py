"""3D tensor parallelism (Bian et al. 2021). Mesh axes z, y, x of a q x q x q cube.

Activations [T, h]: tokens split over x (major) and y, hidden over z. A linear with roles (I, W, O)
(qkv, fc: (y, x, z); proj, fc2: (z, x, y), so consecutive linears alternate) gathers its input over I
and its weight block over W (compute dtype), reduce-scatters its output over O, and gathers its bias over
(W, O) (fp32); backward gathers dY over O, reduce-scatters dX over I, dA over W, dbias over (W, O).
A LayerNorm all-reduces its statistics over z and gathers gamma (beta) over the (x, y) plane. The token
embedding's table is split q ways by vocabulary (x) and q^2 ways by hidden (z major, y minor): each rank
looks up the micro-batch in its [V/q, h/q^2] block ([T, h/q^2]), reduce-scatters it over x (the vocab
partial sums, keeping sequence block x: [T/q, h/q^2]) and all-gathers that over y along the hidden
([T/q, h/q], of which it keeps its block (x, y)): 2 x 4 T h / q^2 bytes instead of one 4 T h / q
reduce-scatter over the plane (a linear's input gather is c T h / q^2). The vocabulary is padded to a
multiple of q^2; the head's columns are split over y and the cross-entropy all-reduces max and sum over y.
Every parameter is stored once per cube: total / q^3.

Tied embeddings: the head's weight IS the table, E^T [h, V] whose block on rank (x, y, z) is hidden block
(z major, y minor) x vocab block x: exactly a 3D linear's weight block for roles (I, W, O) = (x, y, z). So the
tied head is that linear on the table's own blocks: X gathered over x, E^T over y, the partial logits
reduce-scattered over z (backward: dY gathered over z, dX reduce-scattered over x, dE^T over y, where it is
added to the lookup's gradient by autograd, once); the same bytes as the untied head's (y, x, z), one table
stored. Its logits hold tokens block (z major, y minor) x vocab block x: the cross-entropy reduces over x.
"""

from __future__ import annotations

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
from paracube.modes.two_d import block

PLANE = ("x", "y")
ROLES = ("yxz", "zxy", "yxz", "zxy")  # qkv, proj, fc, fc2: (I, W, O)
HEAD_ROLES = "yxz"
TIED_HEAD_ROLES = "xyz"  # the table's own block layout (module docstring)


def _norm(d: Any, label: str, backward: bool) -> list[Collective]:
    phase = "bwd" if backward else "fwd"
    out = [coll("all_reduce", "z", F32, lambda z: 4 * d.stat_width * z.T // (z.q * z.q), f"{label}.stats", phase)]
    kind = "reduce_scatter" if backward else "all_gather"
    out += [coll(kind, PLANE, F32, lambda z: 4 * d.h // z.q, f"{label}.param", phase)] * d.norm_vectors
    return out


def cube_ring(n: int, paired: bool) -> tuple[float, ...]:
    """X's and A's lock-step rings of a 3D forward (collective_matmul_3d.py): at step s the rank holds s + 1
    blocks of each, so 2 s + 1 new terms X_k[:, a] A_a (1/q^2 of the GEMM each) run alongside exchange s; the
    last step's 2 q - 1 terms are deferred to Y's ring. Not paired (kw=1): X's ring alone, a row X_k A (1/q) per
    exchange, the last row deferred."""
    if not paired:
        return chunks(n, paired)
    return tuple((2.0 * s + 1) / n**2 for s in range(n - 1))


def cube_out_ring(n: int, paired: bool) -> tuple[float, ...]:
    """Y's reduce-scatter over O: its chunk b is row block b finished by the deferred terms (row k_last all q
    of them, 1/q of the GEMM; every other row one, 1/q^2). Ring step i produces chunk r_O - 1 - i, so where
    k_last comes first (r_O = r_I + 2 mod q, the slowest ranks) it runs with no exchange in flight and each
    exchange has a 1/q^2 term (none when not paired: the other rows were finished with X's ring)."""
    return (1.0 / n**2 if paired else 0.0,) * (n - 1)


def cube_wgrad_ring(n: int, paired: bool) -> tuple[float, ...]:
    """dA's reduce-scatter over W: its chunk a is the sub-block a of dA finished by the term of dY's last block
    (deferred by dY's ring), X_last[:, a]^T dY_last: 1/q^2 of the dA GEMM per exchange."""
    return (1.0 / n**2,) * (n - 1)


def _linear(d: Any, label: str, h_in: int, h_out: int | None, bias: bool, roles: str,
            backward: bool, tpo: bool = False) -> list[Collective]:
    """h_out None: the vocabulary (head). tpo (a block's linears), as collective_matmul_3d.py runs them: X's
    gather over I and the weight's over W in lock step with the forward GEMM's terms (`cube_ring`), Y's
    reduce-scatter over O with the deferred ones (`cube_out_ring`); backward dY's gather with the dA GEMM's
    X_k^T dY_k (`chunks`, its last term deferred to dA's ring, `cube_wgrad_ring`) and dX's reduce-scatter with
    the row blocks dY_k A^T (`chunks`). The bias collectives are not overlapped."""
    I, W, O = roles  # noqa: N806 (the paper's names)
    f, dx, da = (f"{label}.f", f"{label}.dx", f"{label}.da") if tpo else ("", "", "")

    def width(z: Any) -> Any:
        return z.V if h_out is None else h_out

    def x_bytes(z: Any) -> Any:
        return d.c * z.T * h_in // (z.q * z.q)

    def a_bytes(z: Any) -> Any:
        return d.c * h_in * width(z) // (z.q * z.q)

    def y_bytes(z: Any) -> Any:
        return d.c * z.T * width(z) // (z.q * z.q)

    def b_bytes(z: Any) -> Any:
        return 4 * width(z) // z.q

    if not backward:
        out = [coll("all_gather", I, COMPUTE, x_bytes, f"{label}.X", tpo=f, ring=cube_ring, lockstep=True),
               coll("all_gather", W, COMPUTE, a_bytes, f"{label}.A", kept=True, tpo=f, ring=cube_ring,
                    lockstep=True),
               coll("reduce_scatter", O, COMPUTE, y_bytes, f"{label}.Y", tpo=f, ring=cube_out_ring)]
        return out + ([coll("all_gather", (W, O), F32, b_bytes, f"{label}.bias", kept=True)] if bias else [])
    out = [coll("all_gather", O, COMPUTE, y_bytes, f"{label}.dY", "bwd", tpo=da, ring=chunks),
           coll("reduce_scatter", I, COMPUTE, x_bytes, f"{label}.dX", "bwd", tpo=dx, ring=chunks),
           coll("reduce_scatter", W, COMPUTE, a_bytes, f"{label}.dA", "bwd", kept=True, tpo=da,
                ring=cube_wgrad_ring)]
    return out + ([coll("reduce_scatter", (W, O), F32, b_bytes, f"{label}.dbias", "bwd", kept=True)] if bias else [])


def _block_linear(d: Any, n: int, label: str, h_in: int, h_out: int, bias: bool, backward: bool) -> list[Collective]:
    return _linear(d, label, h_in, h_out, bias, ROLES[n], backward, tpo=True)


class ThreeD(TensorMode):
    name = "3d"
    axes = ("z", "y", "x")
    shape_rule = "tp=3d:qxqxq, a cube (q^3 = 8, 27, 64, 512, ...)"
    no_shape = "3d needs a cube number of tensor ranks (8, 27, 64, ...) dividing the GPU count: {n} has none"
    alternating = True
    keeps_weights = True
    paper = "Bian et al. 2021 (3D)"
    collective_axes = (("x",), ("y",), ("z",), ("x", "z"), ("x", "y"))
    mesh_groups = (("x", "y"), ("x", "z"))  # planes: LayerNorm / embedding (x, y); linear biases (W, O)
    executor = ExecutorSupport("paracube.executor.layers.three_d:Mode3D", pipeline=True, zero_stages=(0, 1, 2, 3),
                               tpo=True)
    ops_layer, ops_edge = 323, 175
    replicates_activations = False
    token_axes = PLANE  # the block layout's tokens: x major, y minor
    attention_token_axes = ("x", "z")  # qkv's output (roles y, x, z) and the head's: x major, z minor
    ties_embeddings = True
    tied_head_roles = ("x", "y", "z")  # TIED_HEAD_ROLES
    tied_token_axes, tied_vocab_axes = ("z", "y"), ("x",)  # gathered over x, reduce-scattered over z
    rules = (
        (TOKEN_RULE, lambda d, b: tokens_split_ok(b.mb, d.s, b.q**2)),
        ("heads % q != 0", lambda d, b: divides(d.heads, b.q)),
        ("kv heads % q != 0", lambda d, b: divides(d.kv_heads, b.q)),
        ("hidden % q^3 != 0", lambda d, b: divides(d.h, b.q**3)),
        *attention_width_rules("q^3", lambda b: b.q**3),
        ("3 * hidden % q^3 != 0", lambda d, b: divides(3 * d.h, b.q**3)),
        ("ffn hidden % q^3 != 0", lambda d, b: divides(d.f, b.q**3)),
        ("seq % q^2 != 0", lambda d, b: divides(d.s, b.q**2)),
    )

    def shape_ok(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == 3 and shape[0] == shape[1] == shape[2] >= 1

    def shapes(self, gpus: int) -> list[tuple[int, ...]]:
        return [(q, q, q) for q in range(2, round(gpus ** (1 / 3)) + 2) if gpus % q**3 == 0]

    def axis_sizes(self, q: IntOrArr, t: IntOrArr, depth: IntOrArr) -> dict[str, IntOrArr]:
        return {"z": q, "y": q, "x": q}

    def token_split(self, q: int, depth: int) -> int:
        return q * q

    def vocab_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        return q * q

    def head_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        return q

    def paper_layer_bytes(self, T: float, linears: Sequence[tuple[str, int, int]], shape: tuple[int, ...],
                          e: float) -> float:
        """p = q^3: per linear all-gather X over the input group (T h_in / q^2), all-gather A over the weight
        group (h_in h_out / q^2), reduce-scatter Y over the output group (T h_out / q^2), and the three
        mirrored collectives backward:  2 * (q-1)/q * sum(T h_in + T h_out + h_in h_out) / q^2 * e
        = O((bsh + h^2)/p^(2/3))."""
        q = shape[0]
        return 2 * (q - 1) / q * sum(T * i + T * o + i * o for _, i, o in linears) / q**2 * e

    # --- parameters: every parameter once per cube ----------------------------------------------------------
    def local_params(self, d: Any, t: IntOrArr, q: IntOrArr, layers: IntOrArr, first: IntOrArr,
                     last: IntOrArr) -> IntOrArr:
        return super().local_params(d, t, q, layers, first, last) // q**3

    def linear_shard(self, h_in: int, h_out: int, bias: bool, row: bool, t: int, q: int) -> int:
        return (h_in // (q * q)) * (h_out // q) + ((h_out // q) // (q * q) if bias else 0)

    def vector_shard(self, h: int, t: int, q: int) -> int:
        return h // q // (q * q)

    def embedding_shard(self, V: int, pos: int, h: int, t: int, q: int) -> int:
        return V // (q * q) * (h // q) + pos // (q * q) * (h // q)

    def head_shard(self, h: int, V: int, t: int, q: int) -> int:
        return (h // (q * q)) * (V // q)

    # --- collectives ----------------------------------------------------------------------------------------
    def embedding(self, d: Any) -> list[Collective]:
        def tok(z: Any) -> Any:  # [T, h/q^2] fp32 looked up, then [T/q, h/q] gathered
            return 4 * z.T * d.h // (z.q * z.q)

        return split_embedding(d, ("x",), tok, PLANE, ("y",))

    def layer_fwd(self, d: Any) -> list[Collective]:
        return block(d, False, _norm, _block_linear, self.kv_gathers(d) + gamma_grads(d, self))

    def layer_bwd(self, d: Any) -> list[Collective]:
        return block(d, True, _norm, _block_linear, self.kv_gathers(d) + gamma_grads(d, self))

    def head(self, d: Any) -> list[Collective]:
        """ln_f, the head (tied: the linear of roles x, y, z on the table's blocks) and the cross-entropy's
        max and sum over the logits' vocabulary axis (untied y, tied x)."""
        roles, vocab = (TIED_HEAD_ROLES, "x") if d.tied else (HEAD_ROLES, "y")
        out: list[Collective] = []
        for backward in (False, True):
            out += _norm(d, "ln_f", backward) + _linear(d, "head", d.h, None, False, roles, backward)
        return out + [coll("all_reduce", vocab, F32, lambda z: 4 * z.T // (z.q * z.q), "loss.max"),
                      coll("all_reduce", vocab, F32, lambda z: 8 * z.T // (z.q * z.q), "loss.sum")]

    # --- compute and memory ---------------------------------------------------------------------------------
    def gemm_shape(self, T: IntOrArr, h_in: IntOrArr, h_out: IntOrArr, column: bool, t: IntOrArr,
                   q: IntOrArr, depth: IntOrArr) -> tuple[IntOrArr, IntOrArr, IntOrArr]:
        return split(T, q), split(h_out, q), split(h_in, q)

    def activation_split(self, t: Any, q: Any, depth: Any) -> dict[str, Any]:
        return {"tok": q * q, "all": t, "gx": q * q, "gw": q * q, "vocab": q}

    def megatron_block(self, d: Any, X: Any, att: Any, sbh: Any, T: Any, t: Any, q: Any, depth: Any,
                       sp: Any, scale: float) -> Any:
        """(X + att)/t + c (T/q sum(h_in)/q (1 - 1/q) + sum(h_in h_out)/q^2) gathered and saved."""
        gathered = d.c * (T / q * d.sum_hin() / q * (1 - 1 / q) + d.sum_w() / q**2)
        return scale * (X + att) / t + gathered

    def linear_temporaries(self, c: int, T: Any, h_in: int, h_out: Any, t: Any, q: Any, depth: Any) -> Any:
        return c * (T / q * h_in / q + 2 * h_in * h_out / q**2 + T / q * h_out / q)

    def executor_rules(self, s: int, h: int, f: int, V: int, heads: int, q: int,
                       micro_batch: int | None) -> list[tuple[str, int, int]]:
        return [("heads", heads, q), ("hidden", h, q**3),
                ("3*hidden", 3 * h, q**3), ("ffn_hidden", f, q**3), ("seq_len", s, q * q)]


MODE = ThreeD()
