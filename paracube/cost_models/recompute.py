"""What `rc=selective` recomputes, by runtime (Runtime.selective, workload.SELECTIVE_RULES, Dims.selective): the
forward seconds it re-runs in backward (`selective_time`: compute.stage_compute_time adds it to a block; the event
engine takes the block's time from there, event_compute.unit_compute, and spreads it with the block's non-GEMM rest,
1/3 forward : 2/3 backward, the shares the analytic engine's overlap models use for every rule but full
recomputation; by module, what re-runs besides the attention core is the block's recompute op before its backward
instead, recompute_modules_cost.dense_time) and the tensors it keeps (`op_saved_bytes`, activations.block_terms).

By module (Dims.recompute_modules, Layout `rcm=`): recompute_modules_cost.py, whose "core_attn" is the "attention" rule.
"attention" (Megatron-core's --recompute-granularity selective, Korthikanti et al. 2022 sec. 5; DeepSpeed,
paracube's executor): the attention core re-run (compute.attention_core_time's forward); activations.py drops the
core's own tensors. Under cp only where the runtime re-runs the core with its exchange (Runtime.cp_core_recompute:
Megatron-core; recompute_modules_cost.core_recomputed, its exchange again: context_parallel.ring_again); paracube's
executor keeps the cp core (executor/layers/context_parallel.py): no re-run, its tensors kept.

"op" (torchtitan 0.3.0's SelectiveAC, torchtitan/distributed/activation_checkpoint.py): each transformer block is
one non-reentrant checkpoint region whose policy MUST_SAVEs the outputs of the compute-intensive ops (torch's
partitioner list: aten.mm, addmm, bmm, _scaled_mm, the flash / efficient / cuDNN SDPA kernels; plus aten.max,
linear and the reduce_scatter / all_to_all collectives), except every second aten.mm / linear of the block's
forward (counted from 1, the counter restarting with each block), which is PREFER_RECOMPUTE like every other op:
- the matmuls in torchtitan's order (`matmuls`: paracube's linears, Dims.linears, split as torchtitan runs them:
  qkv into wq [h], wk [kv], wv [kv], llama's fc into w1 [f] and w3 [f]; then Llama wq, wk, wv, wo, w1, w3, w2, gpt
  q, k, v, proj, fc, fc2): the 2nd, 4th, ... are recomputed (Llama: wk, wo, w3), each its forward GEMM at its own
  local shape. In every dtype: under FP8 torchao's Float8Linear multiplies Float8TrainingTensors with aten.mm, and
  the policy (a TorchDispatchMode) sees that aten.mm before the subclass turns it into torch._scaled_mm, so the
  count runs as in bf16 (checked with torchao 0.18 on CPU: the policy's calls are aten.mm on Float8TrainingTensor,
  MUST_SAVE / PREFER_RECOMPUTE alternating; _scaled_mm never reaches it). A recomputed FP8 matmul re-runs at the
  FP8 model with its operands' casts (fp8.CAST_BYTES per element of X and, dynamic scaling, of W); the casts
  feeding a saved matmul are not re-run (nothing in backward reads them: torch.compile's partitioner drops them).
- the attention core (SDPA) is saved: none of it re-runs (Megatron's rule re-runs exactly that).
- every other forward op (norms, rotary, SwiGLU / GELU, residual adds, dropout: compute.py's elementwise forward
  bytes, `elem_f`) re-runs.
Memory kept per block, one micro-batch, one rank (`op_saved_bytes`; T tokens, t tensor ranks, k = t with sp else
1; none / 1D, the layouts torchtitan runs): the region's input c T h / k; each saved matmul's output, c T width / t
for a column-parallel one (q, k, v, w1, w3), c T h for a row-parallel one (wo, w2: its [T, h] partial sums before the
reduce_scatter); with sp and t > 1 the two reduce_scatters' outputs c T h / t each (always saved); the attention
output c T h / t and the core's own saved tensors (activations.attention_core_bytes: flash its fp32 log-sum-exp).
Not priced: with tensor parallelism the sequence-parallel all-gathers inside the region re-run in backward (not on
the save list); the published rows priced with this rule are FSDP-only (benchmarks/published_runs.py).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models import fp8
from paracube.cost_models import recompute_modules_cost as rmc
from paracube.cost_models.dims import Dims
from paracube.modes import MODES, LayoutBatch

Arr = np.ndarray


def matmuls(d: Dims) -> list[tuple[int, int]]:
    """The block's forward matmuls in torchtitan's order: (index of the paracube linear it is part of, its output
    width)."""
    qkv, fc = d.linears[0][2], d.linears[2][2]
    kv = (qkv - d.q_width) // 2
    gated = d.family == "llama"  # fc is the fused gate + up projection (w1, w3)
    return ([(0, d.q_width), (0, kv), (0, kv), (1, d.linears[1][2])]
            + ([(2, fc // 2), (2, fc // 2)] if gated else [(2, fc)]) + [(3, d.linears[3][2])])


def recomputed(d: Dims) -> list[bool]:
    """Per matmul (`matmuls`): re-run in backward under the op rule (every second one, in every dtype)."""
    return [i % 2 == 1 for i in range(len(matmuls(d)))]


def op_gemm_time(d: Dims, mode: str, b: LayoutBatch, g: object) -> Arr:
    """Forward seconds of one block's recomputed matmuls under the op rule, one micro-batch, one rank: each at its
    own local shape, with FP8 at the FP8 model plus its operands' casts (compute.block_linear_gemms)."""
    T = (b.mb * d.s).astype(float)
    m = MODES[mode]
    weight_cast = fp8.weight_cast_per_micro_batch(d)
    total = np.zeros_like(T)
    for (n, width), again in zip(matmuls(d), recomputed(d), strict=True):
        if again:
            shape = m.gemm_shape(T, d.linears[n][1], width, n in (0, 2), b.t, b.q, b.depth)
            total = total + g.block_linear_gemms(*shape, weight_cast,  # type: ignore[attr-defined]
                                                 fp8.cast_bytes(d, d.linears[n][0]))[0]  # type: ignore[attr-defined]
    return total


def selective_time(d: Dims, mode: str, b: LayoutBatch, g: object, attn_f: Arr, elem_f: Arr) -> Arr:
    """Forward seconds rc=selective re-runs per block, one micro-batch, one rank: by module (the "attention" rule or
    rcm=, recompute_modules_cost.py) the attention core's forward (`attn_f`, core_attn) and the other modules'; or the
    op rule's matmuls / casts plus the block's elementwise forward (`elem_f`)."""
    if rmc.by_module(d):
        core = attn_f if rmc.core_recomputed(d) else 0.0
        return core + rmc.dense_time(d, mode, b, g) if rmc.modules(d) != rmc.DEFAULT else core
    return op_gemm_time(d, mode, b, g) + elem_f


def op_saved_bytes(d: Dims, mode: str, b: LayoutBatch, core: Arr) -> dict[str, Arr]:
    """What one block keeps under the op rule (module docstring), one micro-batch, one rank; `core`: the attention
    core's own saved tensors (activations.attention_core_bytes)."""
    T = (b.mb * d.s).astype(float)
    t = b.t.astype(float)
    c, h = float(d.c), float(d.h)
    shards = np.where(b.sp > 0, t, 1.0)
    saved = np.zeros_like(T)
    for (n, width), again in zip(matmuls(d), recomputed(d), strict=True):
        if not again:
            saved = saved + (c * T * width / t if n in (0, 2) else c * T * h)
    scatters = np.where((b.sp > 0) & (t > 1), 2 * c * T * h / t, 0.0)
    return {"block input": c * T * h / shards, "saved matmul outputs": saved + scatters,
            "attention": c * T * h / t + core}


__all__ = ["matmuls", "op_gemm_time", "op_saved_bytes", "recomputed", "selective_time"]
