"""FP8 training as Transformer Engine runs it (`--dtype fp8`): what it adds to a bf16 step.

Recipe (TE's "hybrid" format with delayed scaling, workload.FP8_RECIPE: TE's DelayedScaling with an amax history
of 16 steps, amax_compute_algo "max", margin 0; the executor runs the same, executor/layers/fp8.py): parameters,
activations, the residual stream, norms, softmax and every collective stay
bf16 (Dims.c = 2), with fp32 gradients and fp32 AdamW masters and moments (memory.py's 16-bit layout): fp8
with fp16 master state cannot be asked for. The four linears of every block run their three GEMMs on FP8
inputs, e4m3 for X and W (forward), e5m2 for dY (backward), at the device's fp8 peak on a GEMM curve of their
own (device_model.gemm_model: calibration gemm.fp8_eff_max / fp8_m0, else the 16-bit curve). Attention's core (flash,
bf16) and the head (Megatron-core's output layer is not an FP8 module) stay bf16.

Casts, memory-bound at HBM bandwidth x mem_eff, per element of an operand (local GEMM shapes X [m, k], W [k, n],
dY [m, n], compute.local_shape; `cast_bytes`): a cast-transpose reads bf16 (2) and writes FP8 in both layouts
(1 + 1: Hopper's FP8 GEMMs take K-major operands only, so wgrad / dgrad need the transposed copies; TE
`cast_transpose`). With delayed scaling the scale comes from the amax history and the kernel records the tensor's
amax as it casts (TE's cast_transpose / fused kernels take an amax output): DELAYED_CAST_BYTES = 4. And TE's
modules fuse some casts into the kernel before them (TE_CASTS, per linear (X, dY)): LayerNormLinear's norm writes
qkv's and fc's X in FP8 and LayerNormMLP's activation writes fc2's X in FP8 (the transposed copy for wgrad left:
read 1, write 1 = 2); the activation's backward (dgelu / dswiglu / dsrelu cast-transpose) writes fc's dY in FP8
with its transpose, in the pass it makes anyway (0); proj's X (the attention output) and the dY of qkv, proj
and fc2 are cast-transposed (4). Until 2026-12-03 every cast was priced at 6 (an amax pass first): that is what
dynamic scaling costs (below, CAST_BYTES = 6). Per micro-batch: X in the forward (again in a full recompute), dY
in the backward. Per step: the weights, cast once at DELAYED_CAST_BYTES (TE keeps the FP8 weight across
micro-batches, `is_first_microbatch`; Megatron-core's --fp8-param-gather casts them right after the optimizer
step), priced with the optimizer step by both engines (`step_time`). MoE experts' GEMMs (moe.py) still cast at
CAST_BYTES (block_linear_gemms' default; not revisited with the dense linears). paracube's own executor casts
unfused (executor/layers/fp8.py); it is priced with TE's fusions too (no run of it on an FP8 GPU separates them).
Amax reduction (`amax_collectives`, traffic.stage_events): once per step the stage's amaxes (X, W, dY of every
block linear, fp32) are max-reduced in one fused all_reduce over TE's amax reduction group, Megatron-core's
(parallel_state.get_amax_reduction_group: the tensor x data-parallel ranks, here data_axes + tensor_axes), so
every rank of a stage scales alike; 4 bytes per tensor (`amax_bytes`), latency-bound, priced by both engines
(comm.py's per-step entries, the event engine from stage_events). Not priced: TE reduces at every fp8_autocast
exit, forward and backward (Megatron-core opens one per TransformerBlock call: 2 per model chunk and micro-batch);
counted so (a trial, 2026-12-03) the H100 pipeline FP8 rows move 0.4-0.7 points slower.
Memory (`copy_bytes`, held for the whole step, counted in temporaries): each block linear's FP8 weight and its
transpose (WEIGHT_COPY_BYTES = 2 per local weight element) and, per FP8 tensor (X, W, dY of every linear),
its scale, inverse scale and amax history in fp32 (SCALE_BYTES = 4 x (2 + amax_history_len) = 72).
FP8 parameters (Runtime.fp8_param_gather: Megatron-core's --fp8-param-gather, "keep the compute param in fp8 and
perform the param all-gather in fp8", distributed_data_parallel_config.py; NeMo's FP8 recipes turn it on): the block
linears' weights are held as FP8 (1 byte) with no bf16 compute copy, their transposes cached beside them
(`param_bytes_saved`, `copy_bytes`: c + 2 -> 1 + 1 bytes per weight element), and zero=1's all_gather sends them
in FP8 (`gathered_fraction`: of a stage's n local elements its W block linear weight elements at 1 byte, the rest
at Dims.gather_bytes; Megatron-core keeps the FP8 parameters in buffers of their own, here every bucket is scaled
alike, so the bucket count and the byte total are exact, each bucket's share of the FP8 bytes is not). The cast
moves into the optimizer step (each rank casts its shard before the gather), priced as before, once per step on
the stage's weights. FSDP2's float8 all-gather (torchao's tensorwise
recipe) is not a runtime's declaration here: zero=2/3 gathers stay bf16.
Scaling (Dims.fp8_scaling, declared by the runtime: Runtime.fp8_scaling, workload.FP8_SCALINGS). Everything above
is "delayed" (Transformer Engine, Megatron-core, paracube's executor). "dynamic" is torchao's Float8Linear as
torchtitan 0.3.0 runs it (recipe "rowwise": each tensor scaled from its own amax at every cast; torchao
float8/README.md): no amax history and no amax all-reduce (`amax_collectives` empty), no FP8 weight copies or
scales held across micro-batches (`copy_bytes` 0; the copy one GEMM casts lives only during that GEMM, at most
2 bytes per element of one linear's local weight, not counted), and the weights cast at every use: CAST_BYTES per
local weight element every micro-batch, priced with the forward GEMM (`weight_cast_per_micro_batch`; again in a
full recompute, which re-runs the forward) instead of once per step (`step_time` 0). X and dY are cast at CAST_BYTES
= 6: the tensor's own amax first (read 2), then the cast-transpose (4) (`cast_bytes`: DYNAMIC_CASTS).
"""

from __future__ import annotations

import numpy as np

from paracube.cost_models.mla import fp8_block_weights, fp8_linears
from paracube.layout import Layout
from paracube.modes import MODES, LayoutBatch
from paracube.modes.base import F32
from paracube.modes.stages import stage_layers
from paracube.workload import FP8_RECIPE

CAST_BYTES = 6.0  # dynamic scaling: an amax pass, then the cast-transpose (module docstring)
DYNAMIC_CASTS = (CAST_BYTES, CAST_BYTES)  # (X, dY) bytes per element of a linear's casts, dynamic scaling
DELAYED_CAST_BYTES = 4.0  # delayed scaling: the cast-transpose alone, recording the amax as it goes
# Delayed scaling, per block linear (X, dY) bytes per element, as Transformer Engine's modules fuse the casts
# (module docstring): the norm writes qkv's and fc's X in FP8 and the activation fc2's (a transpose left: 1 + 1),
# the activation's backward writes fc's dY in FP8 with its transpose (nothing left); the others cast-transpose.
TE_CASTS = {"qkv": (2.0, DELAYED_CAST_BYTES), "proj": (DELAYED_CAST_BYTES, DELAYED_CAST_BYTES),
            "fc": (2.0, 0.0), "fc2": (2.0, DELAYED_CAST_BYTES)}
WEIGHT_COPY_BYTES = 2.0
SCALE_BYTES = 4.0 * (2 + FP8_RECIPE.amax_history_len)  # scale, scale_inv, amax history (fp32)
TENSORS_PER_LINEAR = 3  # X, W, dY

Arr = np.ndarray


def weight_elements(d: object, mode: str, b: LayoutBatch, first: Arr | int, last: Arr) -> Arr:
    """Elements of the block linears' weights as one rank's GEMMs see them (k x n), summed over its stage."""
    m = MODES[mode]
    T = (b.mb * d.s).astype(float)  # type: ignore[attr-defined]
    per_block = np.zeros_like(T)
    for n, (_, h_in, h_out, _) in enumerate(d.linears):  # type: ignore[attr-defined]
        _, cols, rows = m.gemm_shape(T, h_in, h_out, n in (0, 2), b.t, b.q, b.depth)
        per_block = per_block + np.asarray(rows, dtype=float) * cols
    if getattr(d, "mla", None) is not None:  # latent attention's linears instead (cost_models/mla.py)
        per_block = np.zeros_like(T) + fp8_block_weights(m, d, T, b.t, b.q, b.depth)  # type: ignore[arg-type]
    Ls = stage_layers(d.L, b.pp, b.v, np.where(b.pp == 1, 1, first), last)  # type: ignore[attr-defined]
    return Ls * per_block


def dynamic(d: object) -> bool:
    """FP8 with dynamic scaling (module docstring): no amax reduction or held copies, weights cast every use."""
    return bool(getattr(d, "fp8", False)) and getattr(d, "fp8_scaling", "delayed") == "dynamic"


def cast_bytes(d: object, linear: str) -> tuple[float, float]:
    """(X, dY) HBM bytes per element of the block linear `linear`'s FP8 casts (module docstring): with dynamic
    scaling CAST_BYTES each (the tensor's own amax first: one more read); with delayed scaling (the scale comes
    from the amax history, the cast records the tensor's amax in the same pass) TE_CASTS, DELAYED_CAST_BYTES for
    a linear it does not name (MLA's)."""
    if dynamic(d):
        return DYNAMIC_CASTS
    return TE_CASTS.get(linear, (DELAYED_CAST_BYTES, DELAYED_CAST_BYTES))


def weight_cast_per_micro_batch(d: object) -> bool:
    """The block linears' weights are cast in every micro-batch's forward (dynamic), not once per step."""
    return dynamic(d)


def step_time(d: object, mode: str, b: LayoutBatch, first: Arr | int, last: Arr, bandwidth: float) -> Arr:
    """Seconds per step casting the stage's weights to FP8 (0 without FP8, and with dynamic scaling: cast every
    micro-batch instead, compute.GemmModel.block_linear_gemms); `bandwidth` = mem_bw x mem_eff."""
    if not getattr(d, "fp8", False) or dynamic(d):
        return np.zeros(len(b.dp))
    return weight_elements(d, mode, b, first, last) * DELAYED_CAST_BYTES / bandwidth


def copy_bytes(d: object, mode: str, b: LayoutBatch, first: Arr | int, last: Arr) -> Arr:
    """Bytes of the FP8 weight copies and the scales a stage holds (0 without FP8 and with dynamic scaling)."""
    if not getattr(d, "fp8", False) or dynamic(d):
        return np.zeros(len(b.dp))
    Ls = stage_layers(d.L, b.pp, b.v, np.where(b.pp == 1, 1, first), last)  # type: ignore[attr-defined]
    scales = Ls * block_linears(d) * TENSORS_PER_LINEAR * SCALE_BYTES
    copies = WEIGHT_COPY_BYTES - (1.0 if fp8_params(d) else 0.0)  # FP8 params: transpose
    return copies * weight_elements(d, mode, b, first, last) + scales


def fp8_params(d: object) -> bool:
    """The block linears' weights are held and zero=1-gathered in FP8 (Dims.fp8_param_gather with delayed scaling,
    module docstring)."""
    return bool(getattr(d, "fp8", False)) and not dynamic(d) and bool(getattr(d, "fp8_param_gather", False))


def gathered_fraction(d: object, mode: str, b: LayoutBatch, first: Arr | int, last: Arr, n_local: Arr) -> Arr:
    """zero=1's parameter all_gather bytes as a fraction of the same gather at Dims.gather_bytes per element: 1,
    or with FP8 parameters 1 - (e - 1) / e x W / n (module docstring; e = gather_bytes, W the stage's block linear
    weight elements of its `n_local`)."""
    e = float(d.gather_bytes)  # type: ignore[attr-defined]
    return 1.0 - (e - 1.0) / e * weight_elements(d, mode, b, first, last) / np.maximum(n_local, 1)


def param_bytes_saved(d: object, mode: str, b: LayoutBatch, first: Arr | int, last: Arr) -> Arr:
    """Bytes of a stage's parameters less with FP8 parameters (Runtime.fp8_param_gather, module docstring): its
    block linears' weights held as their 1-byte FP8 copy instead of the c-byte compute copy."""
    if not fp8_params(d):
        return np.zeros(len(b.dp))
    return (d.c - 1.0) * weight_elements(d, mode, b, first, last)  # type: ignore[attr-defined]


def block_linears(d: object) -> int:
    """FP8 linears per block: the four of docs/algorithms.md; MLA's own (cost_models/mla.fp8_linears)."""
    return len(fp8_linears(d) if getattr(d, "mla", None) is not None else d.linears)  # type: ignore[arg-type,attr-defined]


def amax_axes(layout: Layout) -> tuple[str, ...]:
    """TE's amax reduction group (Megatron-core's: tensor x data-parallel ranks of a stage)."""
    return (*layout.data_axes, *layout.tensor_axes)


def amax_reduced(d: object) -> bool:
    """The stage's amaxes are all-reduced once per step: FP8 with delayed scaling."""
    return bool(getattr(d, "fp8", False)) and not dynamic(d)


def amax_bytes(d: object, layers: Arr | int) -> Arr | int:
    """Bytes of a stage's amaxes (fp32; X, W, dY of the block linears of its `layers` blocks)."""
    return 4 * layers * block_linears(d) * TENSORS_PER_LINEAR


def amax_collectives(layout: Layout, d: object, layers: int) -> list[tuple[str, tuple[str, ...], int, str, str, str]]:
    """The per-step amax all_reduce (max) of a stage holding `layers` blocks, as (kind, axes, payload bytes, dtype,
    phase, label) for traffic.stage_events (which drops it where the group has one rank); none without FP8 or with
    dynamic scaling (each rank scales from its own tensors' amaxes)."""
    if not amax_reduced(d) or layers == 0:
        return []
    return [("all_reduce", amax_axes(layout), int(amax_bytes(d, layers)), F32, "optimizer", "fp8_amax")]
