"""1D tensor parallelism (Megatron-LM, Shoeybi et al. 2019), optionally with sequence parallelism (sp,
Korthikanti et al. 2022). Mesh axis `tp` of p ranks.

Column-parallel qkv and fc (weights and biases split by columns), row-parallel proj and fc2 (weights
split by rows, biases replicated); LayerNorms and pos_emb replicated; the vocabulary split p ways.
Per block half (attn, mlp): f = identity fwd / all_reduce bwd before the column linear, g = all_reduce
fwd / identity bwd after the row linear, [T, h] in the compute dtype. With sp every g becomes a
reduce_scatter (bwd all_gather) and every f an all_gather (bwd reduce_scatter, plus an all_gather of the
saved input shard: like Megatron the column linear keeps only its shard and re-gathers it in backward); the
embedding's fwd all_reduce becomes a reduce_scatter (bwd all_gather, fp32); the head's input is gathered as
a column linear's; parameters used on sequence shards (norms, row biases, pos_emb) get one fused fp32
gradient all_reduce over tp per step. The executor runs 1D with and without sp.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from paracube.modes.base import (
    COMPUTE,
    F32,
    Collective,
    IntOrArr,
    TensorMode,
    coll,
    divides,
    divisors,
    padded,
    split,
)
from paracube.modes.executor_support import ExecutorSupport
from paracube.modes.head_norm import gamma_grads

TP = ("tp",)


LINEARS = {"attn": ("qkv", "proj"), "mlp": ("fc", "fc2")}  # each half's column, row linear (Dims.linears)


def _block_half(d: Any, name: str, backward: bool) -> list[Collective]:
    """With sp, each gather / reduce-scatter is tpo-overlappable with the GEMM it feeds or drains (Megatron's
    --tp-comm-overlap, Transformer Engine userbuffers; Wang et al. 2023): forward, the input all-gather with the
    column linear's GEMM and the output reduce-scatter with the row linear's; backward, dY's all-gather with the
    row linear's dX GEMM, the input's re-gather with the column linear's dA GEMM (its chunks X_k^T dY_k as the
    blocks arrive) and dX's reduce-scatter with its dX GEMM (its chunks dY_k A^T drained into the ring), as the
    executor runs them (executor/layers/collective_matmul.py; dX and dA of one linear take the same FLOPs). The
    all-reduces without sp are not (Megatron overlaps only with sp; `tpo_needs_sp`)."""
    def thc(z: Any) -> Any:
        return d.c * z.T * d.h

    latent = name == "attn" and d.mla is not None  # MLA: its latent enters the heads' group (executor/layers/mla.py)
    width = d.attn_in_width if name == "attn" else d.h

    def thw(z: Any) -> Any:
        return d.c * z.T * width

    col, row = LINEARS[name]
    first, second = ("reduce_scatter", "all_gather") if backward else ("all_gather", "reduce_scatter")
    plain = "f" if backward else "g"
    regather = [coll("all_gather", TP, COMPUTE, thc, f"{name}.in.regather", when="sp", tpo=f"{col}.da")
                ] if backward and not latent else []
    return regather + [
        coll(first, TP, COMPUTE, thw, f"{name}.in", when="sp", tpo=f"{col}.dx" if backward else f"{col}.f"),
        coll(second, TP, COMPUTE, thc, f"{name}.out", when="sp", tpo=f"{row}.dx" if backward else f"{row}.f"),
        coll("all_reduce", TP, COMPUTE, thw if backward else thc, f"{name}.{plain}", when="no_sp"),
    ]


class OneD(TensorMode):
    name = "1d"
    axes = TP
    shape_rule = "tp=1d:p, any p >= 1"
    no_shape = "1d needs at least 2 tensor ranks: {n} GPUs leave none"
    sequence_parallel = True
    tpo_needs_sp = True  # without sp its collectives are all-reduces: none is overlappable (`_block_half`)
    context_parallel = True
    megatron_style = True
    ties_embeddings = True
    paper = "Megatron-LM (Shoeybi et al. 2019, section 3)"
    collective_axes = (TP,)
    executor = ExecutorSupport("paracube.executor.layers.one_d:Mode1D", pipeline=True, sequence_parallel=True,
                               zero_stages=(0, 1, 2, 3), tpo=True, context_parallel=("p2p", "ag"),
                               dtypes=("fp32", "fp16", "bf16", "fp8"), mla=True)
    ops_layer, ops_edge = 99, 85  # 1D with sp assumed to dispatch like 1D
    program_units = ("attn", "mlp")
    merged_units = (("attn", ("qkv", "proj")), ("mlp", ("fc", "fc2")))
    rules = (
        ("heads % p != 0", lambda d, b: divides(d.heads, b.t)),
        ("ffn hidden % p != 0", lambda d, b: divides(d.f, b.t)),
        ("kv heads % p != 0", lambda d, b: divides(d.kv_heads, b.t)),
        ("sequence parallel: seq % p != 0", lambda d, b: ~b.sp.astype(bool) | divides(d.s, b.t)),
    )

    def shape_ok(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == 1 and shape[0] >= 1

    def shapes(self, gpus: int) -> list[tuple[int, ...]]:
        return [(p,) for p in divisors(gpus) if p >= 2]

    def axis_sizes(self, q: IntOrArr, t: IntOrArr, depth: IntOrArr) -> dict[str, IntOrArr]:
        return {"tp": t}

    def vocab_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        return t

    def head_split(self, t: IntOrArr, q: IntOrArr) -> IntOrArr:
        return t

    def paper_layer_bytes(self, T: float, linears: Sequence[tuple[str, int, int]], shape: tuple[int, ...],
                          e: float) -> float:
        """Two `g` all-reduces forward and two `f` all-reduces backward per layer, each of the [T, h] block
        output (h: the first linear's input width), ring all-reduce 2(p-1)/p n:  4 * 2(p-1)/p * T h e = O(bsh)."""
        p, h = shape[0], linears[0][1]
        return 4 * 2 * (p - 1) / p * T * h * e

    def act_split(self, t: IntOrArr, sp: IntOrArr) -> IntOrArr:
        if isinstance(sp, np.ndarray):
            return np.where(sp > 0, t, 1)
        return t if sp else 1

    # --- parameters ------------------------------------------------------------------------------------------
    def local_params(self, d: Any, t: IntOrArr, q: IntOrArr, layers: IntOrArr, first: IntOrArr,
                     last: IntOrArr) -> IntOrArr:
        """Weights and column biases / p; LayerNorms, row-parallel biases and pos_emb replicated."""
        V, h = padded(d.V, t), d.h
        rep_layer = 2 * d.norm_vectors * h + d.row_bias
        rep = layers * rep_layer + first * d.pos_params + last * d.norm_vectors * h
        split_total = layers * (d.layer_params() - rep_layer) + (first + d.head_count(first, last)) * V * h
        return rep + split_total // t

    def linear_shard(self, h_in: int, h_out: int, bias: bool, row: bool, t: int, q: int) -> int:
        return h_in * h_out // t + ((h_out if row else h_out // t) if bias else 0)

    def embedding_shard(self, V: int, pos: int, h: int, t: int, q: int) -> int:
        return V // t * h + pos * h

    def head_shard(self, h: int, V: int, t: int, q: int) -> int:
        return h * V // t

    # --- collectives ----------------------------------------------------------------------------------------
    def embedding(self, d: Any) -> list[Collective]:
        def tokens(z: Any) -> Any:
            return 4 * z.T * d.h

        return [
            coll("reduce_scatter", TP, F32, tokens, "embedding", "fwd", when="sp"),
            coll("all_gather", TP, F32, tokens, "embedding", "bwd", when="sp"),
            coll("all_reduce", TP, F32, tokens, "embedding", "fwd", when="no_sp"),
        ]

    def layer_fwd(self, d: Any) -> list[Collective]:
        return _block_half(d, "attn", False) + _block_half(d, "mlp", False)

    def layer_bwd(self, d: Any) -> list[Collective]:
        return _block_half(d, "attn", True) + gamma_grads(d, self) + _block_half(d, "mlp", True)

    def head(self, d: Any) -> list[Collective]:
        def thc(z: Any) -> Any:
            return d.c * z.T * d.h

        return [
            coll("all_gather", TP, COMPUTE, thc, "head.in", "fwd", when="sp"),
            coll("reduce_scatter", TP, COMPUTE, thc, "head.in", "bwd", when="sp"),
            coll("all_gather", TP, COMPUTE, thc, "head.in.regather", "bwd", when="sp"),
            coll("all_reduce", TP, COMPUTE, thc, "head.f", "bwd", when="no_sp"),
            coll("all_reduce", TP, F32, lambda z: 4 * z.T, "loss.max"),
            coll("all_reduce", TP, F32, lambda z: 8 * z.T, "loss.sum"),
        ]

    def step_collectives(self, d: Any) -> list[Collective]:
        def sp_params(z: Any) -> Any:
            shared = z.layers * (2 * d.norm_vectors * d.h + d.row_bias + d.attn_replicated)  # + MLA's down projections
            return 4 * (shared + z.first * d.pos_params + z.last * d.norm_vectors * d.h)

        return [coll("all_reduce", TP, F32, sp_params, "sequence_parallel_params", "grad_sync", when="sp")]

    # --- compute and memory ---------------------------------------------------------------------------------
    def gemm_shape(self, T: IntOrArr, h_in: IntOrArr, h_out: IntOrArr, column: bool, t: IntOrArr,
                   q: IntOrArr, depth: IntOrArr) -> tuple[IntOrArr, IntOrArr, IntOrArr]:
        return (T, split(h_out, t), h_in) if column else (T, h_out, split(h_in, t))

    def activation_split(self, t: Any, q: Any, depth: Any) -> dict[str, Any]:
        one = np.ones_like(t)
        return {"tok": one, "all": t, "gx": one, "gw": t, "vocab": t}

    def megatron_block(self, d: Any, X: Any, att: Any, sbh: Any, T: Any, t: Any, q: Any, depth: Any,
                       sp: Any, scale: float) -> Any:
        """W + (X - W)/t + 5 a s^2 b/t; with sp everything / t. W, what every rank keeps whole: the two norms'
        inputs (4 sbh), their outputs entering QKV and fc1 (4; 2 with FP8, saved as 1-byte casts), the two
        dropout masks (2; none in llama-family recipes, which run without dropout and which X leaves out too)."""
        whole = (10 - 2 * bool(d.fp8) - 2 * (d.family == "llama")) * sbh
        return scale * np.where(sp > 0, (X + att) / t, whole + (X - whole) / t + att / t)

    def linear_temporaries(self, c: int, T: Any, h_in: int, h_out: Any, t: Any, q: Any, depth: Any) -> Any:
        return c * T * (h_in + h_out / t)

    def executor_rules(self, s: int, h: int, f: int, V: int, heads: int, q: int,
                       micro_batch: int | None) -> list[tuple[str, int, int]]:
        return [("heads", heads, q), ("ffn_hidden", f, q)]


MODE = OneD()
