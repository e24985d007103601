"""Mixture-of-experts blocks and latent / wide-head attention priced on top of the dense engines.

Decomposition (one formula set for both engines; analytic.py and event.py each call it from one hook):
- the dense engines price `dense_part(model)`: the model without its routed experts, every block's MLP the
  blocks' mean of the dense MLP width and the shared expert's (shared experts run on the dense tensor group,
  as in Megatron-core), at least 128 wide so tensor splits divide it, attention's linears at their true widths
  (a head width other than hidden / heads and q / k norms: Dims.linears, qk_norm_params); each stage's blocks
  then take their own MLP width back (mlp_delta.py: the dense blocks' ffn_hidden, the shared expert's, none
  without one), in both engines;
- this module adds, per MoE block and micro-batch on one rank (modes/experts.py declares its collectives):
  router GEMM [T, h] x [h, E]; the routed experts' grouped GEMM, E / ep local experts each a SwiGLU of width
  f_e / etp on m = R / (E / ep) tokens, R = T k etp x load the most loaded rank's tokens (MoESpec.load: the
  routing imbalance; with a capacity factor, the capacity under a runtime that pads to it, Runtime.moe_capacity,
  else the imbalance capped at it; grouped-GEMM
  efficiency: each expert's GEMM at its own shape on the device's GEMM curve, compute.GemmModel.eff, so few
  tokens per expert or narrow experts run at low efficiency); dispatch and combine all_to_all over ep (and
  the etp all_gather / reduce_scatter; the routing weights' all_to_all beside the dispatch where the runtime's
  dispatcher sends them so, moe_dispatch.sends_probs), each priced on the folded group's ranks (in-node or across
  nodes by the placement, LinkCache; an all_to_all as every rank's flows to its peers, moe_a2a.py), the most loaded
  rank's share x load; memory-bound passes at the device's memory rate (moe_passes.py: the token permute, the
  sort by local expert and back, the unpermute, the experts' SwiGLU; Megatron-core's moe_utils.permute /
  sort_chunks_by_idxs / unpermute); with fp8 and a runtime that runs them so (Runtime.fp8_experts, Dims), the
  experts' GEMMs at the FP8 model with their casts (compute.GemmModel.block_linear_gemms) and, where the tokens per
  expert are not all multiples of 16, Transformer Engine's quantization padding copies (moe_passes.fp8_padded);
  backward: GEMMs 2x, the same four collectives; full recomputation runs the forward again (dispatch included, as
  Megatron-core recomputes); a dropless block's forward also idles while its host waits for the expert counts
  (host_sync.py, where the runtime waits), and between two waits runs no faster than its host issues the block's ops
  (host_issue.py: max(GPU work, host issue time) per segment, the GPU work the dense block's and this module's);
- per step: the expert gradients' all_reduce over edp (fp32; exposed, or under the last backward as
  grad_overlap.py hides the dense buckets when the layout overlaps); the optimizer step of expert parameters;
  zero=2/3 instead: each block's experts an FSDP unit of its own over edp, its gathers and reduce-scatters in line
  (moe_fsdp.py: per micro-batch with pp = 1, the reduce-scatter once a step with pipelines; zero=2's gather after
  the optimizer step);
- attention correction (attention_correction.py; MLA, DeepSeek-V2 arXiv 2405.04434; a head width other than hidden /
  heads, Qwen3):
  MLA's: the difference between the true attention linears and the dense part's (qkv [h, h + 2 kv], proj [h, h]);
  both: the attention core with qk / v head widths instead of hidden / heads, at the dense part's shapes;
- GPT-OSS: experts' biases with their weights (b1 split like w1 over etp), the router's a dense parameter; the
  clamped SwiGLU and the bias adds change no bytes of the passes priced (moe_passes.py; fused: gpt_oss_spec.py);
- memory: expert parameters (c bytes), fp32 gradients, AdamW state (sharded over edp with zero >= 1,
  gradients with zero >= 2, parameters with zero = 3); the attention correction's parameters are dense ones,
  sharded alike over the dense zero group (dp x cp, Layout.zero_axes; MLA's not where a part is the dense FSDP
  units', which hold its true widths: zero >= 2 gradients and optimizer, zero=3 parameters; tests/test_mla_run.py
  measures them on the executor), as Megatron-core's distributed optimizer
  shards every non-expert parameter over the data-parallel group and the experts over the expert-data-parallel
  one (megatron/core/optimizer/__init__.py: intra_expt_dp_group), and each rank's optimizer step updates its
  shards; saved activations per in-flight micro-batch and MoE
  block: the permuted tokens (R h), the expert intermediates (3 R f_e / etp: gate, up, activation) and the
  router's probabilities (T E, fp32); temporaries: one block's dispatch send and receive buffers, alive inside
  the block only: on the stage holding the head, beyond what the loss holds then (moe_step._heaviest).
T = mb s / (cp t) tokens per rank (the tensor group's tokens split before dispatch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from paracube.cost_models.attention_correction import attention_delta, delta_again
from paracube.cost_models.collective import collective_time
from paracube.cost_models.compute import GemmModel, optimizer_time
from paracube.cost_models.dims import Dims
from paracube.cost_models.host_issue import block_idle
from paracube.cost_models.host_sync import sync_seconds
from paracube.cost_models.memory import optimizer_bytes
from paracube.cost_models.mlp_delta import block_deltas, mlp_delta
from paracube.cost_models.moe_a2a import A2A
from paracube.cost_models.moe_counts import block_count_events, norm_events
from paracube.cost_models.moe_dispatch import sends_probs
from paracube.cost_models.moe_fsdp import Chain, expert_unit
from paracube.cost_models.moe_mlp_again import stage_again
from paracube.cost_models.moe_passes import fp8_padded, pass_bytes
from paracube.cost_models.moe_unshared import dropped_events, dropped_time, ring_hidden_seconds
from paracube.cost_models.recompute_modules_cost import MOE_REGION, moe_rcm_saved, moe_rerun, moe_side
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes.experts import PROBS, ROUTER, ExpertSizes, before_experts, block_bwd, block_fwd, router_dtype
from paracube.modes.stages import stage_chunks
from paracube.moe_spec import MoESpec
from paracube.workload import ModelSpec

MIN_WIDTH = 128


def dense_part(model: ModelSpec) -> ModelSpec:
    """What the dense engines price (module docstring); a dense model unchanged."""
    if model.moe is None:  # MLA and head widths kept: Dims prices them as they run (Dims.mla, Dims.linears)
        return model
    k = model.moe.moe_layers(model.layers)
    mean = ((model.layers - k) * model.ffn_hidden + k * model.moe.shared_ffn) / model.layers
    return replace(model, ffn_hidden=max(MIN_WIDTH, MIN_WIDTH * round(mean / MIN_WIDTH)), moe=None)


def tokens_per_rank(layout: Layout, mb: int, s: int) -> int:
    """T of a rank for sequences of s tokens (the whole sequence's: a cp rank's view holds d.s = s / cp, so callers
    pass d.s x d.cp, context_dims.context_local)."""
    return max(1, mb * s // (layout.cp * layout.tensor_size))


def moe_layers_of(model: ModelSpec, layout: Layout, stage: int) -> int:
    """MoE blocks on pipeline stage `stage`."""
    if model.moe is None:
        return 0
    return _moe_layers(model.moe, model.layers, layout.pp, layout.interleave, stage)


@lru_cache(maxsize=4096)  # asked per layout and stage; a function of the split only
def _moe_layers(moe: MoESpec, layers: int, pp: int, v: int, stage: int) -> int:
    return sum(moe.is_moe_layer(i) for c in stage_chunks(layers, pp, v, stage) for i in c)


@dataclass(frozen=True)
class BlockCost:
    """One MoE block, one micro-batch, one rank: compute seconds and the collectives, forward and backward."""

    fwd: float
    bwd: float
    events_fwd: tuple[CommEvent, ...]
    events_bwd: tuple[CommEvent, ...]
    tokens: int
    received: float
    events_pre: tuple[CommEvent, ...] = ()  # the forward's counts before dispatch (moe_counts)
    wait: float = 0.0  # of `fwd`, the seconds the GPU idles on its host's waits (host_sync.py)


def _events(colls: list, d: Dims, z: ExpertSizes, layout: Layout, phase: str, block: int) -> list[CommEvent]:
    sizes = {"ep": layout.ep, "etp": layout.etp, "edp": layout.expert_data}
    out = []
    for c in colls:
        n = math.prod(sizes[a] for a in c.axes)
        dtype = router_dtype(d.dtype)[0] if c.dtype == ROUTER else d.dtype  # the weights': the router's
        if n > 1:
            out.append(CommEvent(c.kind, c.axes, n, int(c.payload(z)), dtype, phase, f"layers.{block}.{c.label}"))
    return out


@lru_cache(maxsize=1024)  # the stages of a layout, and both engines, price the same block: once (its args hash)
def block_cost(model: ModelSpec, d: Dims, layout: Layout, mb: int, g: GemmModel, block: int = 0) -> BlockCost:
    moe = model.moe
    assert moe is not None
    T = tokens_per_rank(layout, mb, d.s * d.cp)  # d: a cp rank's view (both engines), its s the chunks'
    R = T * moe.top_k * layout.etp * moe.load(d.moe_capacity)  # copies at the most loaded rank's experts
    local = moe.experts // layout.ep
    m = max(R / local, 1.0)
    fe = moe.expert_ffn // layout.etp
    # FP8 where the runtime runs the experts' GEMMs so (Dims.fp8_experts): the fp8 model and its casts, as a block
    # linear's; the router stays bf16 (Megatron-core keeps it out of fp8_autocast)
    gemms = g.block_linear_gemms if d.fp8 and d.fp8_experts else g.gemms
    up = gemms(m, 2 * fe, d.h)  # gate and up fused [h, 2 f_e / etp]
    down = gemms(m, d.h, fe)
    router = g.gemms(T, moe.experts, d.h)
    pf, pb = pass_bytes(d, layout, moe.expert_ffn, local, T, R, fp8_padded(d, layout, moe, T), moe)
    bw = g.mem_bw * g.mem_eff
    wait = sync_seconds(moe, d, g)  # the GPU's idle while its host waits for the expert counts (host_sync.py)
    fwd = local * float(up[0] + down[0]) + float(router[0]) + pf / bw + wait
    bwd = local * float(up[1] + up[2] + down[1] + down[2]) + float(router[1] + router[2]) + pb / bw \
        + moe_rerun(d, layout, mb, R, fe, bw)  # rcm=moe_act, layernorm (recompute_modules_cost.py)
    z = ExpertSizes(T=T, k=moe.top_k, received=R / layout.etp)
    probs = sends_probs(moe, d.moe_dispatch, d.moe_probs)  # the weights' own all_to_all (moe_dispatch.py)
    return BlockCost(fwd, bwd, tuple(_events(block_fwd(d, layout.etp, probs), d, z, layout, "fwd", block)),
                     tuple(_events(block_bwd(d, layout.etp, probs), d, z, layout, "bwd", block)), T, R,
                     tuple(block_count_events(layout, moe, mb, d.dtype, "fwd", f"layers.{block}.")), wait)


def routed(e: CommEvent) -> bool:
    """A dispatch / combine all_to_all (or the weights' beside the dispatch): its time scales with the routing
    imbalance (the counts' does not)."""
    return e.kind == "all_to_all" and e.label.endswith(("moe.dispatch", "moe.combine", PROBS))


def comm_time(e: CommEvent, links: dict, imbalance: float, g: GemmModel | None = None) -> float:
    """One MoE collective's seconds on its group's links, plus the device's per-call wait (GemmModel.call_wait,
    0 on accelerators; the event engine's Sim adds the same per call)."""
    bw, lat = links[A2A + e.axes] if e.kind == "all_to_all" else links[e.axes]
    t = float(collective_time(e.kind, e.group_size, 1, e.payload_bytes, bw, lat))
    wait = float(np.asarray(g.call_wait(e.kind, e.group_size, e.payload_bytes, e.dtype)).ravel()[0]) \
        if g is not None and g.waits else 0.0
    return t * (imbalance if routed(e) else 1.0) + wait  # the most loaded receiver finishes last


def expert_params_per_rank(model: ModelSpec, layout: Layout, stage: int) -> int:
    moe = model.moe
    if moe is None:
        return 0
    fe = moe.expert_ffn // layout.etp
    bias = 2 * fe + model.hidden if moe.expert_bias else 0  # GPT-OSS: b1 [2 f_e / etp], b2 [h]
    per_block = (moe.experts // layout.ep) * (3 * model.hidden * fe + bias)
    return moe_layers_of(model, layout, stage) * per_block


def grad_event(model: ModelSpec, layout: Layout, stage: int, d: Dims | None = None) -> CommEvent | None:
    n = expert_params_per_rank(model, layout, stage)
    if n == 0 or layout.expert_data == 1 or layout.zero >= 2:  # zero >= 2: the expert units' (moe_fsdp.py)
        return None
    # zero=1 reduce-scatters and gathers back instead: the same bytes and ring steps as this all_reduce; in the
    # runtime's gradient element (Dims.grad_bytes; fp32 without dims)
    size, dtype = (d.grad_bytes, d.grad_dtype) if d is not None else (4, "float32")
    return CommEvent("all_reduce", ("edp",), layout.expert_data, size * n, dtype, "grad_sync", "expert_gradients")


@dataclass
class StageCost:
    """What one stage adds per micro-batch (work: compute + exposed collectives) and per step."""

    compute: float = 0.0  # per micro-batch
    comm: float = 0.0  # per micro-batch
    comm_bwd: float = 0.0  # per micro-batch, its backward's collectives, a recomputed forward's included (moe_step)
    step_comm: float = 0.0  # expert gradient reduction (s)
    norm_comm: float = 0.0  # the experts' squared-norm all_reduce (s, exposed: after the gradients)
    optim: float = 0.0
    sent: float = 0.0  # bytes per step
    memory: dict[str, float] = field(default_factory=dict)
    events: list[CommEvent] = field(default_factory=list)  # one micro-batch's + the step's
    buffers: float = 0.0  # one block's dispatch send and receive buffers (bytes; alive inside a MoE block only)
    a2a_fwd: float = 0.0  # per micro-batch, its forward's dispatch / combine all_to_alls (s; moe_a2a_overlap.py)
    a2a_bwd: float = 0.0  # per micro-batch, its backward's
    a2ao_eff: float = 1.0  # of what `a2ao`'s two streams hide, the share a run hides (GemmModel.a2ao_eff)
    waits: float = 0.0  # per micro-batch, of `compute`, the host waits (host_sync.py; no compute to overlap with)
    issue_fwd: float = 0.0  # per MoE block and micro-batch, the forward's wait for its host's issue (host_issue.py)
    issue_bwd: float = 0.0  # per MoE block and micro-batch, the backward's (its recomputed forward's included)
    again: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)  # of `comm`, by (kind, axes): the
    # MLP collectives rcm= issues again (moe_mlp_again.py; moe_step books them under their own kind and axes)
    units: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)  # of `comm`, by (kind, axes): the
    # expert units' zero=2/3 collectives in line (moe_fsdp.py; moe_step books them under their own kind and axes)
    chain: Chain | None = None  # zero=2/3 prefetched (pp = 1): the MoE parts of the expert units' Chain (moe_fsdp.py;
    # moe_step adds the dense blocks' work and prices its stalls), their seconds then not in `comm`
    dropped: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)  # of `comm`, by (kind, axes),
    # negative: the dense part's MLP collectives blocks without a shared expert do not run (moe_unshared.py), their
    # serialized seconds; `dropped_hidden` of them (tpo) the step had not paid (their GEMM chunks hid them)
    dropped_hidden: float = 0.0
    after: dict[tuple[str, tuple[str, ...]], float] = field(default_factory=dict)  # per step, exposed, by (kind,
    # axes): the expert units' pipelined reduce-scatter and zero=2's parameter gather (moe_fsdp.py)


def stage_cost(model: ModelSpec, d: Dims, layout: Layout, mb: int, g: GemmModel, stage: int,
               links: dict, in_flight: float, events: bool = True) -> StageCost:
    """One stage's MoE and attention terms; `events` False: every MoE block's bytes (`sent`) without its events."""
    out = StageCost(memory={"parameters": 0.0, "gradients": 0.0, "optimizer": 0.0, "activations": 0.0,
                            "temporaries": 0.0}, a2ao_eff=g.a2ao_eff)
    held = [i for c in stage_chunks(model.layers, layout.pp, layout.interleave, stage) for i in c]
    layers = len(held)
    af, ab, aparams = attention_delta(model, d, layout, mb, g)
    rec = d.recompute == "full"
    mods = moe_side(layout)  # rcm= of the MoE blocks (recompute_modules_cost.py): moe re-runs their whole forward
    rerun = rec or MOE_REGION in mods
    again = delta_again(model, d, layout, mb, g, af)
    out.compute += layers * (af + ab + again)
    out.compute += mlp_delta(model, d, layout, mb, g, held)  # each block's MLP at its own width (mlp_delta.py)
    out.again, again_events = stage_again(model, d, layout, mb, stage, links, g)  # rcm=: MLPs' (moe_mlp_again.py)
    out.comm, out.comm_bwd, out.events = (out.comm + sum(out.again.values()), out.comm_bwd + sum(out.again.values()),
                                          out.events + again_events)
    k = moe_layers_of(model, layout, stage)
    n_exp = expert_params_per_rank(model, layout, stage)
    bias = k * (model.moe.experts if model.moe and model.moe.expert_bias else 0)  # GPT-OSS's router bias
    # zero shards the experts over edp, the attention's extra parameters (dense ones) over the dense zero group. MLA's
    # correction (true widths less the stand-in's) only where a part is not the dense FSDP units' (memory.with_zero:
    # zero >= 2 gradients and optimizer, zero=3 parameters): the units already hold MLA's true widths (cost_models/
    # mla.mla_layer_sizes), its down projections whole on every tensor rank, as the executor shards them
    z3, z2, z1 = (_shards(layout, layout.expert_data, s) for s in (3, 2, 1))
    d3, d2, d1 = (_shards(layout, layout.axis_size_of(layout.zero_axes), s) for s in (3, 2, 1))
    mla = layers * aparams if model.mla is not None else 0  # MLA's correction; Qwen3's head widths: none (aparams 0)
    n_att = bias if model.mla is not None else layers * aparams + bias
    out.memory["parameters"] += d.c * (n_exp / z3 + n_att / d3 + (mla if layout.zero < 3 else 0))
    out.memory["gradients"] += d.grad_bytes * (n_exp / z2 + n_att / d2 + (mla if layout.zero < 2 else 0))
    out.memory["optimizer"] += optimizer_bytes(d.c) * (n_exp / z1 + n_att / d1 + (mla / d1 if layout.zero < 2 else 0))
    if k:
        moe = model.moe
        assert moe is not None
        b = block_cost(model, d, layout, mb, g)
        load = moe.load(d.moe_capacity)  # the busiest receiver's share (MoESpec.load)
        tf = [comm_time(e, links, load, g) for e in b.events_fwd]
        tb = [comm_time(e, links, load, g) for e in b.events_bwd]
        cf = sum(comm_time(e, links, load, g) for e in b.events_pre) + sum(tf)
        cb = sum(tb)
        # the host's issue beyond the block's GPU work: the dense block's (host_issue.py), this module's and its own
        # MLP width's (mlp_delta.py); the backward's without a full recomputation's forward (host_issue.idle_seconds)
        first = next(i for i in held if moe.is_moe_layer(i))
        mf, mbw = block_deltas(model, d, layout, mb, g, [first])[0]
        gpu_b = ab + b.bwd + cb + (mbw - mf if rec else mbw + again)
        out.issue_fwd, out.issue_bwd = block_idle(moe, d, layout, mb, g, af + b.fwd - b.wait + cf + mf, gpu_b)
        out.compute += k * (b.fwd * (2 if rerun else 1) + b.bwd + out.issue_fwd + out.issue_bwd)
        out.waits = k * (b.wait * (2 if rerun else 1) + out.issue_fwd + out.issue_bwd)
        out.comm += k * (cf * (2 if rerun else 1) + cb)
        out.comm_bwd += k * (cb + (cf if rerun else 0.0))
        unit = expert_unit(moe, d, layout)  # zero=2/3: the experts' FSDP unit of each block (moe_fsdp.py)
        for e in (*unit.fwd, *unit.bwd_gather, *unit.bwd_scatter):
            key = (e.kind, e.axes)
            out.units[key] = out.units.get(key, 0.0) + k * comm_time(e, links, 1.0, g)
        unit_bwd = sum(comm_time(e, links, 1.0, g) for e in (*unit.bwd_gather, *unit.bwd_scatter))
        if layout.pp == 1 and d.fsdp_prefetch and out.units:  # prefetched: moe_step prices the stalls (Chain)
            half_f = before_experts([e.label for e in b.events_fwd], False)
            half_b = before_experts([e.label for e in b.events_bwd], True)
            pre_f = b.wait + out.issue_fwd + sum(comm_time(e, links, load, g) for e in b.events_pre) \
                + sum(tf[:half_f])
            rerun_f = (b.fwd + cf) if rerun else 0.0
            out.chain = Chain(k, pre_f, af + mf + b.fwd + out.issue_fwd + cf,
                              rerun_f + out.issue_bwd + sum(tb[:half_b]),
                              ab + again + mbw + rerun_f + b.bwd + out.issue_bwd + cb, b.bwd, sum(tb[half_b:]),
                              sum(comm_time(e, links, 1.0, g) for e in unit.fwd),
                              sum(comm_time(e, links, 1.0, g) for e in unit.bwd_scatter), layout.overlap,
                              a2a_head=sum(t for e, t in zip(b.events_bwd[half_b:], tb[half_b:], strict=True)
                                           if routed(e)),
                              a2a_tail=sum(t for e, t in zip(b.events_bwd[:half_b], tb[:half_b], strict=True)
                                           if routed(e)))
        else:  # in line
            out.comm += sum(out.units.values())
            out.comm_bwd += k * unit_bwd
        for e in (*unit.step, *unit.after):
            out.after[(e.kind, e.axes)] = out.after.get((e.kind, e.axes), 0.0) + k * comm_time(e, links, 1.0, g)
        out.a2a_fwd = k * sum(t for e, t in zip(b.events_fwd, tf, strict=True) if routed(e))
        out.a2a_bwd = k * sum(t for e, t in zip(b.events_bwd, tb, strict=True) if routed(e))
        # no shared expert: the dense part's MLP collectives of these blocks are not run (moe_unshared.py)
        unrun = dropped_events(model, d, layout, mb)
        alt = layout.tensor_mode.alternating
        for e in unrun:  # booked under their own kind and axes (moe_step)
            key = (e.kind, e.axes)
            out.dropped[key] = out.dropped.get(key, 0.0) - k * dropped_time((e,), links, g, alt)
        # tpo: the step paid each ring's alpha-beta time less what its GEMM chunks hid (as the dense part priced it)
        out.dropped_hidden = k * ring_hidden_seconds(unrun, d, layout, mb, links, g)
        out.comm += sum(out.dropped.values()) + out.dropped_hidden
        blocks = [i for ch in stage_chunks(model.layers, layout.pp, layout.interleave, stage) for i in ch
                  if moe.is_moe_layer(i)]
        out.sent += sum(e.sent_bytes() for e in out.events)  # rcm='s MLP collectives (stage_again)
        sent_f = sum(e.sent_bytes() for e in b.events_pre + b.events_fwd)
        out.sent += len(blocks) * (sent_f * (2 if rerun else 1) + sum(e.sent_bytes() for e in b.events_bwd)
                                   + sum(e.sent_bytes() for e in (*unit.fwd, *unit.bwd_gather, *unit.bwd_scatter)))
        for i in blocks if events else ():  # one micro-batch's, in issue order per block (the forward, then backward)
            out.events += [replace(e, label=e.label.replace("layers.0.", f"layers.{i}."))
                           for e in (*unit.fwd, *b.events_pre, *b.events_fwd)]
            if rerun:
                out.events += [replace(e, phase="recompute", label=e.label.replace("layers.0.", f"layers.{i}."))
                               for e in b.events_pre + b.events_fwd]
        for i in reversed(blocks) if events else ():
            out.events += [replace(e, label=e.label.replace("layers.0.", f"layers.{i}."))
                           for e in (*unit.bwd_gather, *b.events_bwd, *unit.bwd_scatter)]
        acts = d.c * (b.received * d.h + 3 * b.received * moe.expert_ffn / layout.etp) + 4 * b.tokens * moe.experts
        out.memory["activations"] += (1 if rec else k) * in_flight * acts
        # what rcm= no longer keeps (recompute_modules_cost.py; 0 without it)
        out.memory["activations"] -= in_flight * moe_rcm_saved(model, d, layout, mb, held, mods, acts, b.received)
        ahead = unit.gathered if out.chain is not None and k > 1 else 0.0  # the prefetched next unit (moe_fsdp.py)
        out.buffers = 2 * d.c * b.tokens * moe.top_k * d.h + unit.temporaries + ahead
        if d.fp8 and d.fp8_experts:  # each expert weight's FP8 copy and its transpose (fp8.WEIGHT_COPY_BYTES)
            out.memory["temporaries"] += 2.0 * n_exp
    ge = grad_event(model, layout, stage, d)
    if ge is not None:
        bw, lat = links[ge.axes]
        out.step_comm = float(collective_time(ge.kind, ge.group_size, 1, ge.payload_bytes, bw, lat))
        out.events.append(ge)
    if k and model.moe is not None:  # zero=2/3: the units' per-step collectives (moe_fsdp.py)
        unit = expert_unit(model.moe, d, layout)
        blocks = [i for ch in stage_chunks(model.layers, layout.pp, layout.interleave, stage) for i in ch
                  if model.moe.is_moe_layer(i)]
        out.events += [replace(e, label=e.label.replace("layers.0.", f"layers.{i}."))
                       for e in (*unit.step, *unit.after) for i in blocks]
    for ne in norm_events(layout, k):
        out.norm_comm += comm_time(ne, links, 1.0, g)
        out.events.append(ne)
    out.optim = float(np.asarray(optimizer_time(np.asarray([n_exp / z1 + (n_att + mla) / d1]), d.c, g)).ravel()[0])
    return out


def _shards(layout: Layout, group: int, stage: int) -> int:
    """The ranks a part is sharded over at zero stage `stage` (1 optimizer, 2 gradients, 3 parameters): its zero
    group (`group`) where the layout's zero reaches that stage, else 1 (replicated)."""
    return group if layout.zero >= stage else 1


def priced(model: ModelSpec) -> bool:
    return model.moe is not None or model.mla is not None or model.head_size is not None


__all__ = ["BlockCost", "StageCost", "block_cost", "dense_part", "grad_event", "moe_layers_of", "priced", "stage_cost",
           "tokens_per_rank"]
