"""Memory per device at the peak of a step, vectorized over layouts.

Static, per local parameter (the exact local count of comm.stage_layers_params: 3d total/q^3, 2d/2.5d
total/q^2, 1d replicated norms, row biases and pos_emb), as the executor holds it (executor/layers/functional.py,
"Precision"; Megatron's mixed precision): the parameters in the compute dtype (c bytes: the compute copy),
their gradients in fp32 buckets (4; grad_sync.py, Megatron's main_grad; Dims.grad_bytes: 2 for a runtime keeping
16-bit gradients, DeepSpeed's ZeRO), and AdamW's fp32 state: two moments
(8) plus, for a 16-bit compute dtype, the fp32 master weights (4; optim.MasterAdamW). fp32: 4 + 4 + 8 = 16
bytes; bf16/fp16: 2 + 4 + 12 = 18 (Megatron's figure). zero=1 (distributed optimizer,
executor/data_parallel/distributed_adamw.py): optimizer 12 ceil(n / z) = fp32 master shard + two moments, in every
dtype (the reduce-scatter writes the shard in place, into the bucket: no extra gradient buffer), so c + 4 + 12/z
(one bucket padded to a multiple of z; with several buckets each is padded, < z elements more per bucket).
z = `zero_shards`: the
ranks of the mode's grad_axes, dp (2.5D: dp x depth, its weights' replicas over depth shard too).
zero=2 / zero=3 (`with_zero`, executor/data_parallel/sharded.py): FSDP units padded to a multiple of the zero
group; gradients and optimizer state (zero=3: parameters too) per rank are the shards, 16-bit 2 + 16/d and 18/d
bytes per parameter (fp32 gradients; the ZeRO paper's 2 + 14/d and 16/d assume 16-bit ones), plus two units'
fp32 gradient buffers and (zero=3) two gathered units in temporaries.

Activations of one block for one micro-batch (Korthikanti et al. 2022, bytes for 16-bit activations, scaled
by c/2 so fp32 doubles them; s sequence, b micro-batch, h hidden, a heads, t tensor ranks). The paper's
34 sbh = 18 sbh + 4 sbf at f = 4h, so for any f we use X = 18 sbh + 4 sbf (llama SwiGLU: 18 sbh + 6 sbf),
less 4 (1 - kv/h) sbh with grouped-query attention (K, V) and, llama family, the 2 sbh of the dropout masks; a
head width other than h / heads (Qwen3) or latent attention (MLA) adds its true widths' terms (`attention_widths`:
queries, keys, values, the core's output, q / k norms' inputs, MLA's latents; sb per-token bytes whole and split):
  none:            X + 5 a s^2 b
  1d:              10 sbh + (X - 10 sbh)/t + 5 a s^2 b/t       (= sbh(10 + 24/t + 5as/(ht)) at f = 4h)
  1d + sp:         (X + 5 a s^2 b)/t                            (= sbh/t (34 + 5as/h))
  2d, 2.5d, 3d:    (X + 5 a s^2 b)/t + G    every activation is split over all t ranks (tokens x hidden)
  selective, or flash attention (fa=1, Transformer Engine's fused kernel): drop the 5 a s^2 b terms (34 sbh/t
                   with sp)
  full recompute:  2 sbh / t_act per block (input only; t_act = 1 for 1d without sp), G = 0
  selective by torchtitan's per-op rule (Dims.selective "op", recompute.py): what that rule saves, in both counts
G = gathered tensors the 2d/3d linears save for their backward (the executor's backward re-gathers
nothing): 2d/2.5d: c (T/(dq) sum(h_in) (1 - 1/q) + sum(h_in h_out)/q); 3d: c (T/q sum(h_in)/q (1 - 1/q)
+ sum(h_in h_out)/q^2).
Pipeline: blocks on a stage x micro-batches in flight: 1 without pipelining; 1F1B first stage min(pp, N);
interleaved first stage min(N, pp + (pp-1)/v) (Narayanan factor); last stage 1 (1F1B) or min(N, pp - (pp-1)/v)
interleaved (its (v-1) pp warm-up chunk forwards plus one: the interleaved schedule's later stages hold nearly
as much as the first, `in_flight`). Embedding output 4 T h / t_act on the first stage. Blocks of a stage:
modes/stages.py (uneven splits). The first stage's embedding tensors are held by its chunk-0 forwards only
(interleaved: at most min(N, 2 pp) alive), the head's by the last chunk of the last stage (one alive).
Temporaries: the largest linear's gathered operands and output (2d/3d), or gathered input + widest output
(1d), plus fp32 logits and their gradient on the last stage (Megatron-core: one fp32 copy, `logit_bytes`),
plus one block's full activations while it
is recomputed (full recompute; torchtitan's per-op selective rule: the block's rc=none tensors it did not save,
`op_remade_bytes`). Gradients are accumulated into their fp32 buckets (executor/data_parallel/grad_sync.py),
which ARE the gradients counted above: no extra flat buffer.
Kept weights (Layout kw=1; 2d, 2.5d, 3d): every `kept` forward gather of the stage (linears' weights and
biases, the position table) stays gathered for the whole step, with an fp32 accumulator of its gradient in
gathered form (executor/layers/kept.py): payload (1 + 4/e) bytes each (e bytes per element of its dtype), counted
in temporaries.
FP8 (`--dtype fp8`, fp8.py): the 16-bit layout above (bf16 parameters, fp32 masters) plus the block linears' FP8
weight copies (weight and transpose, 1 byte each per local weight element) and their scales, in temporaries; with
FP8 parameters (Runtime.fp8_param_gather) those weights are held in FP8 only (1 byte in parameters, the transpose in
temporaries). Megatron's count with FP8: the linears' saved inputs are their FP8 casts (_FP8_SAVED). The per-block
counts: block_acts.py. Activation offloading (off=N) takes the offloaded blocks off the fl Ls: offload.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paracube.cost_models import activations, fp8
from paracube.cost_models.block_acts import megatron_block_bytes, saved_block_bytes
from paracube.cost_models.comm import stage_layers_params
from paracube.cost_models.context_parallel import kv_buffer_bytes
from paracube.cost_models.dims import Dims
from paracube.cost_models.offload import resident_blocks
from paracube.modes import MODES, LayoutBatch
from paracube.modes.base import COMPUTE, Collective, Sizes, padded
from paracube.modes.stages import stage_layers

Arr = np.ndarray


def op_remade_bytes(d: Dims, mode: str, b: LayoutBatch) -> Arr:
    """Under torchtitan's per-op selective rule (recompute.py), what one block's recompute makes again for its
    backward: the block's rc=none tensors beyond those the rule saved (as full recomputation's block, below)."""
    every = activations.block_bytes(replace(d, recompute="none"), mode, b)
    return np.maximum(every - activations.block_bytes(d, mode, b), 0.0)


def in_flight(b: LayoutBatch, N: Arr, first: bool, stage: Arr | int | None = None) -> Arr:
    """Micro-batches of the stage's blocks alive at once: the schedule's warm-up forwards plus one, in chunks of
    1 / v of the stage (modes/stages.schedule, Megatron-core's get_pp_rank_microbatches: stage r warms up with
    2 (pp - r - 1) + (v - 1) pp chunk forwards interleaved, pp - r - 1 without); of stage `stage` where given,
    else of the first (r = 0) or the last (r = pp - 1)."""
    pp, v = b.pp.astype(float), b.v.astype(float)
    r = np.asarray(stage, dtype=float) if stage is not None else (0.0 if first else pp - 1)
    return np.minimum(N, np.where(v > 1, (2 * (pp - r - 1) + (v - 1) * pp + 1) / v, pp - r))


def _temporaries(d: Dims, mode: str, b: LayoutBatch, T: Arr, V: Arr, H: Arr) -> Arr:
    """The largest linear's gathered operands and output; the head's (its output the padded vocabulary) on the
    stage that holds the head only (H > 0): a pipeline's other stages never run it."""
    m = MODES[mode]
    t, q, depth = b.t, b.q, b.depth
    temp = np.zeros_like(T)
    for _, h_in, h_out, _ in d.linears:
        temp = np.maximum(temp, m.linear_temporaries(d.c, T, h_in, h_out, t, q, depth))
    head = m.tied_head_temporaries if d.tied and m.tied_head_roles else m.linear_temporaries  # the mode's tied head
    return np.maximum(temp, np.where(H > 0, head(d.c, T, d.h, V, t, q, depth), 0.0))


def kept_bytes(d: Dims, mode: str, b: LayoutBatch, F: Arr, H: Arr) -> Arr:
    """Bytes of the gathered weights and their fp32 gradient accumulators a stage keeps for a step (kw=1)."""
    m = MODES[mode]
    if not m.keeps_weights:
        return np.zeros(len(b.dp))
    z = Sizes(T=b.mb * d.s, t=b.t, q=b.q, depth=b.depth, sp=b.sp, V=padded(d.V, m.vocab_split(b.t, b.q)))

    def held(colls: list[Collective]) -> Arr:
        out = np.zeros(len(b.dp))
        for c in colls:
            if c.kept and c.kind == "all_gather" and c.phase == "fwd":
                out = out + c.payload(z) * (1 + 4 / (d.c if c.dtype == COMPUTE else 4))
        return out

    Ls = stage_layers(d.L, b.pp, b.v, F, H)
    return Ls * held(m.layer_fwd(d)) + F * held(m.embedding(d)) + H * held(m.head(d))


def stage_memory(d: Dims, mode: str, b: LayoutBatch, first: bool, last: bool, zero: int = 0,
                 kw: Arr | int = 0) -> dict[str, Arr]:
    """Bytes per device of a stage (first / last flags as Python bools) for every layout in `b`; neither flag: the
    fullest middle stage, stage 1 (modes/stages.stage_layers: it holds the most blocks of the middle stages and the
    most micro-batches in flight), the first stage where pp <= 2 (stage_scores.stage_flags). A middle stage can be
    the heaviest: an uneven split takes a block off the first stage (stage 1 holds b (pp - 1) block activations
    against the first's (b - 1) pp), and a model's dense first blocks leave the middle stages more experts."""
    m = MODES[mode]
    dp, pp, t, mb = b.dp, b.pp, b.t, b.mb
    ones = np.ones(len(dp), dtype=np.int64)
    F, H = (first or False) * ones, (last or False) * ones
    F = np.where((pp == 1) | ((pp == 2) & (F + H == 0)), 1, F)
    H = np.where(pp == 1, 1, H)
    n_local = stage_layers_params(d, mode, b, F, H).astype(float)
    N = (d.global_batch // (dp * mb)).astype(float)
    Ls = stage_layers(d.L, pp, b.v, F, H)
    T = (mb * d.s).astype(float)
    fl = np.where(F > 0, in_flight(b, N, True), np.where(H > 0, in_flight(b, N, False), in_flight(b, N, False, 1)))
    # Edge tensors live in one chunk only: the embedding's in chunk 0 of the first stage (interleaved: up to
    # min(N, 2 pp) of its forwards alive), the head's in the last chunk of the last stage (1 alive).
    fl_first = np.where(b.v > 1, np.minimum(N, 2.0 * pp), fl)
    V = padded(d.V, m.vocab_split(t, b.q))
    blocks = resident_blocks(d, Ls, fl) * saved_block_bytes(d, mode, b)  # fl Ls blocks, less those offloaded (off=N)
    if d.activations == "paracube":
        acts = (blocks + F * fl_first * activations.first_stage_bytes(d, mode, b)
                + H * np.minimum(fl, 1.0) * activations.last_stage_bytes(d, mode, b, V))
    else:
        acts = blocks + F * fl_first * 4 * T * d.h / m.act_split(t, b.sp)
    temp = _temporaries(d, mode, b, T, V, H) + H * logit_bytes(d) * T * V / t
    if d.recompute == "full":
        full = d if d.activations == "megatron" else replace(d, recompute="none")
        temp = temp + (megatron_block_bytes(d, mode, b, "none") if d.activations == "megatron"
                       else activations.block_bytes(full, mode, b))
    if d.recompute == "selective" and d.selective == "op":  # one block's re-made tensors live during its backward
        temp = temp + op_remade_bytes(d, mode, b)
    if np.any(kw):
        temp = temp + np.asarray(kw) * kept_bytes(d, mode, b, F, H)
    temp = temp + kv_buffer_bytes(d, mode, b)  # context parallelism's key / value buffers (context_parallel.py)
    if d.fp8:  # the FP8 weight copies and scales (fp8.py), held for the whole step
        temp = temp + fp8.copy_bytes(d, mode, b, F, H)
    optimizer = 12 * np.ceil(n_local / zero_shards(mode, b, d.cp)) if zero == 1 else optimizer_bytes(d.c) * n_local
    return {
        "parameters": d.c * n_local - fp8.param_bytes_saved(d, mode, b, F, H),  # FP8 parameters (fp8.py)
        "gradients": d.grad_bytes * n_local,
        "optimizer": optimizer,
        "activations": acts,
        "temporaries": temp,
    }


def logit_bytes(d: Dims) -> float:
    """Bytes per local logit the loss holds beyond the head's 16-bit output (_temporaries): paracube's executor an
    fp32 copy and its fp32 gradient (8); Megatron-core one fp32 copy (4), which its vocabulary-parallel cross
    entropy turns into the softmax it saves and then into the gradient in place (tensor_parallel/cross_entropy.py,
    fusions/fused_cross_entropy.py: exp_ / div_ on the fp32 logits, grad_input = softmax), cast to 16 bits for
    the head (the 16-bit output's bytes, counted already)."""
    return 4.0 if d.activations == "megatron" else 8.0


def total(mem: dict[str, Arr]) -> Arr:
    return mem["parameters"] + mem["gradients"] + mem["optimizer"] + mem["activations"] + mem["temporaries"]


def optimizer_bytes(c: int) -> int:
    """AdamW state per parameter without zero=1: two fp32 moments, plus an fp32 master for a 16-bit compute
    dtype (c bytes per parameter)."""
    return 8 if c >= 4 else 12


def zero_shards(mode: str, b: LayoutBatch, cp: int = 1) -> Arr:
    """Ranks the distributed optimizer shards over, per layout: the mode's grad_axes (dp; 2.5D: dp x depth),
    times cp with context parallelism (Layout.data_axes), as traffic.zero_group for one layout."""
    sizes = {"dp": b.dp * cp, **MODES[mode].axis_sizes(b.q, b.t, b.depth)}
    n = np.ones_like(b.dp)
    for a in MODES[mode].grad_axes:
        n = n * sizes[a]
    return n


def with_zero(mem: dict[str, Arr], shards: Arr, zero: Arr | int,
              units: tuple[Arr, ...] | None = None, grad_bytes: int = 4) -> dict[str, Arr]:
    """Memory parts with the zero stage `zero` (per layout, or one int for all) over `shards` ranks
    (zero_shards: dp, 2.5D dp x depth; HSDP: the shard group), from the zero=0 parts `mem` (c bytes per
    parameter, fp32 gradients, Adam + fp32 masters for 16-bit: Rajbhandari et al. 2020 with fp32 gradients):
    - zero=1: the fp32 master weights and Adam's two moments sharded, 12 ceil(n / shards) bytes per rank for n
      local parameters (executor/data_parallel/distributed_adamw.py), instead of 8 n (fp32) or 12 n (16-bit);
    - zero=2 (`units` = (P, Q): the stage's FSDP units' lengths padded to a multiple of `shards`, summed, and
      the largest sum of two consecutive ones; fsdp_units.unit_totals): gradients 4 P / shards and optimizer
      12 P / shards, plus two fp32 unit gradient buffers 4 Q (the one being reduce-scattered, the one filling)
      in temporaries: 16-bit 2 + 16 / d bytes per parameter;
    - zero=3: parameters c P / shards too, plus the gathered units c G (`units`' third, default Q: two; tied
      embeddings on the stage: the embedding unit plus two others, fsdp_units.unit_totals): 18 / d (fp32: 16 / d).
    (executor/data_parallel/sharded.py, fsdp.py; the tests measure these bytes on the executor's tensors.)
    `grad_bytes` (Dims.grad_bytes, the runtime's gradient dtype): 4 above; 2 for a stack keeping 16-bit
    gradients (DeepSpeed's ZeRO: the paper's 16, 4 + 12/d, 2 + 14/d, 16/d bytes per parameter)."""
    n_local = mem["gradients"] / grad_bytes  # the gradient buckets: grad_bytes per local parameter
    z = np.asarray(zero)
    sharded_bytes = 12 * np.ceil(n_local / np.asarray(shards, dtype=float))
    out = {**mem, "optimizer": np.where(z == 1, sharded_bytes, mem["optimizer"])}
    if units is None or not np.any(z >= 2):
        return out
    P, Q, G = (np.asarray(u, dtype=float) for u in (*units, units[-1])[:3])  # G: gathered at once (default Q)
    c = mem["parameters"] / np.maximum(n_local, 1)
    per = P / np.asarray(shards, dtype=float)
    out["gradients"] = np.where(z >= 2, grad_bytes * per, out["gradients"])
    out["optimizer"] = np.where(z >= 2, 12 * per, out["optimizer"])
    out["parameters"] = np.where(z == 3, c * per, out["parameters"])
    out["temporaries"] = out["temporaries"] + np.where(z >= 2, grad_bytes * Q, 0.0) + np.where(z == 3, c * G, 0.0)
    return out
