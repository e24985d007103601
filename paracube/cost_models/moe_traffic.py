"""The explicit CommEvents of one training step of a model with MoE blocks, as paracube's executor issues them
(executor/model/moe.py, executor/layers/experts.py, data_parallel/grad_sync.py): traffic.stage_events of the
dense part, corrected where a MoE block differs. tests/test_moe_run.py holds the whole list equal to what the
executor records (a multiset of (kind, axes, payload, dtype): zero difference).

Per MoE block on the stage and micro-batch, a rank holding T = b s / (cp x tp with sp) tokens, k experts per token:
- forward (and again in a full recomputation or under rcm=moe, phase "recompute"): with ep > 1 `moe.counts`, an
  all_to_all over ep of the E int64 copy counts (ep x E / ep, Megatron-core's dispatcher exchanges the same),
  `moe.dispatch`, beside it `moe.dispatch_probs` (the copies' routing weights, T k elements of the router's dtype:
  fp32, fp64 for an fp64 model; not with MoESpec.probs_on_input, whose weights multiply the copies before the
  dispatch: modes/experts.EXECUTOR_PROBS) and `moe.combine`
  (modes/experts.block_fwd: c T k h under balanced routing; `with_routing` puts in the bytes of the routing a run
  took); with an aux loss where a sequence is split (cp > 1, sp over tp > 1), `moe.aux_counts`, an all_reduce over
  cp x the tensor axes of the [b, E] copy counts in the statistics dtype (fp32; fp64 for an fp64 model);
- backward: the all_to_alls mirrored (modes/experts.block_bwd). The shared expert's collectives are the dense
  MLP's (the mode's linears, same T h payloads), so the mode's layer lists stay as they are (without a shared
expert the block's MLP collectives are dropped); rcm= re-issues a dense block's MLP collectives (mlp) and a shared
expert's (shared_experts, moe) up to their region's last saved tensor, moe_mlp_again.py.
Per step: the dense gradient buckets hold the block's router, shared expert and gate instead of the dense MLP
(experts excluded); the sequence-parallel all_reduce adds the router and gate (replicated over tp; GPT-OSS's router
bias with them, its experts' biases in the experts' buckets: moe_spec.MoESpec.expert_bias); the experts'
own zero=0 buckets all_reduce over edp (ep = 1: over the data and tensor axes) after the dense ones; the
experts' squared norm is summed over ep (`grad_norm.experts`, one fp32) before the step's grad-norm all_reduce.
"""

from __future__ import annotations

from dataclasses import replace

from paracube.cost_models.dims import Dims
from paracube.cost_models.local_parameters import local_parameter_sizes
from paracube.cost_models.moe_counts import block_count_events, norm_events
from paracube.cost_models.moe_dispatch import sends_probs
from paracube.cost_models.moe_fsdp_traffic import fsdp_unit_events
from paracube.cost_models.moe_mlp_again import again_blocks, again_events, relabel
from paracube.cost_models.moe_unshared import mlp_tensor
from paracube.cost_models.recompute_modules_cost import moe_side
from paracube.cost_models.traffic import stage_events, unit_labels
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes import MODES
from paracube.modes.buckets import BUCKET_BYTES, bucket_numels, padded_numel
from paracube.modes.experts import ETP_PROBS, EXECUTOR_PROBS, PROBS, router_dtype
from paracube.modes.stages import stage_chunks
from paracube.moe_spec import MoESpec

STAGES = {"first": 0, "middle": 1, "last": -1}


def stage_moe_layers(layout: Layout, d: Dims, moe: MoESpec, stage: str) -> list[int]:
    """Global indices of the MoE blocks on pipeline stage `stage`, in order."""
    return [i for chunk in stage_chunks(d.L, layout.pp, layout.interleave, _stage_index(layout, stage))
            for i in chunk if moe.is_moe_layer(i)]


def chunks_of(layout: Layout, d: Dims, stage: str) -> list[int]:
    """Global indices of the blocks on stage `stage`, in order."""
    return [i for c in stage_chunks(d.L, layout.pp, layout.interleave, _stage_index(layout, stage)) for i in c]


def _stage_index(layout: Layout, stage: str) -> int:
    return 0 if layout.pp == 1 else (layout.pp - 1 if stage == "last" else STAGES[stage])


def _group(layout: Layout, axes: tuple[str, ...]) -> int:
    expert = {"edp": layout.expert_data, "ep": layout.ep, "etp": layout.etp}  # the folded axes (layout.py)
    n = 1
    for a in axes:
        n *= expert[a] if a in expert else layout.axis_size(a)
    return n


def expert_axes(layout: Layout) -> tuple[str, ...]:
    """The group the experts' gradients are reduced over (executor/model/moe.Experts)."""
    if layout.ep * layout.etp > 1:
        return ("edp",)
    return tuple(dict.fromkeys((*layout.data_axes, *layout.tensor_axes)))


def _dense_sizes(layout: Layout, d: Dims, moe: MoESpec, stage: str, moe_layers: list[int]) -> list[int]:
    """The stage's parameters outside the experts in registration order: a MoE block's fc, fc2 (and biases)
    replaced by router [h, E], shared fc [h, 2 f_s] / fc2 [f_s, h] (the mode's shards), gate [h, 1]."""
    return [n for unit in _dense_units(layout, d, moe, stage, moe_layers) for _, n in unit]


def _dense_units(layout: Layout, d: Dims, moe: MoESpec, stage: str,
                 moe_layers: list[int]) -> list[list[tuple[int, int]]]:
    """_dense_sizes grouped by FSDP unit (embedding on the first stage, each block, final norm + head on the last),
    each entry (global block index or -1, numel)."""
    mode, t, q, h = MODES[layout.mode], layout.tensor_size, layout.q, d.h
    sizes = local_parameter_sizes(layout, d, stage)
    mlp = sum(1 + bias for _, _, _, bias in d.linears[2:])  # entries of fc, fc2 (and their biases) per block
    first = layout.pp == 1 or stage == "first"
    last = layout.pp == 1 or stage == "last"
    head = d.norm_vectors + (1 if d.head_count(int(first), 1) else 0) if last else 0
    emb = (1 + (1 if d.family == "gpt" and d.pos_params // d.h else 0)) if first else 0
    chunks = [i for c in stage_chunks(d.L, layout.pp, layout.interleave, _stage_index(layout, stage)) for i in c]
    body = sizes[emb:len(sizes) - head]
    width = len(body) // len(chunks)
    out = [[(-1, n) for n in sizes[:emb]]] if first else []
    for b, g in enumerate(chunks):
        block = body[b * width:(b + 1) * width]
        if g in moe_layers:
            block = block[:-mlp] + [h * moe.experts] + ([moe.experts] if moe.expert_bias else [])  # GPT-OSS bias
            if moe.shared_ffn:
                block += [int(mode.linear_shard(h, 2 * moe.shared_ffn, False, False, t, q)),
                          int(mode.linear_shard(moe.shared_ffn, h, False, True, t, q))]
            if moe.shared_gate:
                block.append(h)
        out.append([(g, n) for n in block])
    return out + ([[(-1, n) for n in sizes[len(sizes) - head:]]] if last else [])


def _expert_sizes(local: int, h: int, moe: MoESpec, etp: int = 1) -> list[int]:
    """A block's local expert parameters in registration order: w1, w2 (GPT-OSS: then b1, b2); fc1's columns and
    fc2's rows split over etp."""
    f = moe.expert_ffn // etp
    return [local * h * 2 * f, local * f * h] + ([local * 2 * f, local * h] if moe.expert_bias else [])


def moe_stage_events(layout: Layout, d: Dims, moe: MoESpec, mb: int, stage: str = "first",
                     bucket_bytes: int = BUCKET_BYTES) -> list[CommEvent]:
    """All collectives of one step on one rank of `stage` for a model with MoE blocks (module docstring)."""
    events = stage_events(layout, d, mb, stage, bucket_bytes)
    layers = stage_moe_layers(layout, d, moe, stage)
    if not layers:
        return events
    ep, sp = layout.ep, layout.sequence_parallel
    ways = layout.tensor_size if sp else 1
    T, k, E = mb * d.s * d.cp // (layout.cp * ways), moe.top_k, moe.experts  # a cp rank's chunks (d: either view)
    n_micro = d.global_batch // (layout.dp * mb)
    # full recomputation and rcm=moe re-run the MoE layer's forward, its counts and all_to_alls (recompute_modules_cost)
    phases = ("fwd", "recompute") if d.recompute == "full" or "moe" in moe_side(layout) else ("fwd",)
    a2a = d.c * T * k * d.h
    probs = sends_probs(moe, "alltoall", EXECUTOR_PROBS)  # the executor dispatches by one plain all_to_all
    pdtype, pbytes = router_dtype(d.dtype)

    def ev(kind: str, axes: tuple[str, ...], payload: int, dtype: str, phase: str, label: str) -> list[CommEvent]:
        n = _group(layout, axes)
        return [CommEvent(kind, axes, n, int(payload), dtype, phase, label)] if n > 1 else []

    def etp_events(i: int, phase: str) -> list[CommEvent]:  # modes/experts.block_fwd: the etp group's T k etp copies
        rows = T * k * layout.etp
        gather, scatter = ("reduce_scatter", "all_gather") if phase == "bwd" else ("all_gather", "reduce_scatter")
        return (ev(gather, ("etp",), d.c * rows * d.h, d.dtype, phase, f"layers.{i}.moe.experts.in")
                + (ev(gather, ("etp",), pbytes * rows, pdtype, phase, f"layers.{i}.{ETP_PROBS}") if probs else [])
                + ev(scatter, ("etp",), pbytes * rows * d.h, pdtype, phase, f"layers.{i}.moe.experts.out"))

    extra: list[CommEvent] = []
    # a dense block's mlp, a shared expert's under shared_experts / moe: its MLP's collectives again (moe_mlp_again.py)
    again = [e for b in again_blocks(moe, d.L, layout, _stage_index(layout, stage))
             for e in relabel(again_events(d, layout, mb), b)]
    for _ in range(n_micro):
        extra += again
        for i in layers:
            for ph in phases:
                extra += block_count_events(layout, moe, mb, d.dtype, ph, f"layers.{i}.")  # counts, aux counts
                extra += ev("all_to_all", ("ep",), a2a, d.dtype, ph, f"layers.{i}.moe.dispatch")
                if probs:
                    extra += ev("all_to_all", ("ep",), pbytes * T * k, pdtype, ph, f"layers.{i}.{PROBS}")
                extra += etp_events(i, ph)
                extra += ev("all_to_all", ("ep",), a2a, d.dtype, ph, f"layers.{i}.moe.combine")
            extra += ev("all_to_all", ("ep",), a2a, d.dtype, "bwd", f"layers.{i}.moe.combine")
            extra += etp_events(i, "bwd")
            if probs:
                extra += ev("all_to_all", ("ep",), pbytes * T * k, pdtype, "bwd", f"layers.{i}.{PROBS}")
            extra += ev("all_to_all", ("ep",), a2a, d.dtype, "bwd", f"layers.{i}.moe.dispatch")
    # The buckets (grad_sync.py): dense without the experts over the data axes, then the experts' over their group;
    # zero=0 all-reduced (the experts' squared norm then summed over ep), zero=1 reduce-scattered (padded to the
    # group) and, after the optimizer step, all-gathered (training/step.py sums the experts' shards in the norm
    # over (pp, dp, tp): every expert element once, the stage's ranks being edp x ep).
    local = E // ep
    step: list[CommEvent] = []  # after the dense buckets, before the grad norm (grad_sync.py, training/step.py)
    gathers: list[CommEvent] = []
    if layout.zero >= 2:  # FSDP units, an MoE block's experts one of their own (moe_fsdp_traffic.py)
        units: list[tuple[tuple[str, ...], int]] = []
        for unit in _dense_units(layout, d, moe, stage, layers):
            units.append((tuple(layout.zero_axes), sum(n for _, n in unit)))
            if unit and unit[0][0] in layers:
                units.append((expert_axes(layout), sum(_expert_sizes(local, d.h, moe, layout.etp))))
        first, last = layout.pp == 1 or stage == "first", layout.pp == 1 or stage == "last"
        gathers = fsdp_unit_events(layout, d, units, n_micro, first, last, lambda a: _group(layout, a))
        names = {f"{label}.{op}" for pair in unit_labels(layout, first, last, len(chunks_of(layout, d, stage)))
                       for label in pair for op in ("rs", "gather")}
        events = [e for e in events if not (e.label in names and e.axes == tuple(layout.zero_axes))]
    dense = bucket_numels(_dense_sizes(layout, d, moe, stage, layers), bucket_bytes)
    groups = [] if layout.zero >= 2 else [(tuple(layout.data_axes), dense, "gradients"),
              (expert_axes(layout),
               bucket_numels(_expert_sizes(local, d.h, moe, layout.etp) * len(layers), bucket_bytes),
               "gradients.experts")]
    for axes, numels, label in groups:
        shards = _group(layout, axes)
        for n in numels:
            if layout.zero == 1:
                step += ev("reduce_scatter", axes, 4 * padded_numel(n, shards), "float32", "grad_sync", label)
                gathers += ev("all_gather", axes, 4 * padded_numel(n, shards), "float32", "optimizer", "params")
            else:
                step += ev("all_reduce", axes, 4 * n, "float32", "grad_sync", label)
    step += norm_events(layout, layers)
    # replicated over tp, summed with sp (GPT-OSS: the router's bias too)
    router = len(layers) * (d.h * (E + (1 if moe.shared_gate else 0)) + (E if moe.expert_bias else 0))
    chunks = [i for c in stage_chunks(d.L, layout.pp, layout.interleave, _stage_index(layout, stage)) for i in c]
    # no shared expert: a MoE block runs no dense MLP, so none of the mode's MLP collectives (1D + sp: its
    # sequence gather / reduce-scatter); labels carry the stage-local block index (traffic._micro_batch)
    no_mlp = () if moe.shared_ffn else tuple(f"layers.{b}.mlp." for b, g in enumerate(chunks) if g in layers)
    out: list[CommEvent] = []
    for e in events:
        if mlp_tensor(e.label, e.axes, no_mlp, layout):
            continue
        if e.label in ("gradients", "params"):
            continue  # the dense buckets without the experts: `step`, `gathers`
        if e.label == "sequence_parallel_params":
            e = replace(e, payload_bytes=e.payload_bytes + 4 * router)
        if step and e.phase in ("optimizer", "metrics"):
            out, step = out + step, []
        out.append(e)
    return out + step + gathers + extra


def with_routing(events: list[CommEvent], sent: list[tuple[int, ...]]) -> list[CommEvent]:
    """`events` with the dispatch / combine all_to_alls' payloads those of a routing a run took: `sent[f]` =
    (bytes this rank's f-th MoE forward dispatches, bytes it combines back[, bytes of the copies its etp group
    gathers]), forwards in issue order; the backward's mirror sends the swapped sizes (combine's gradient the
    dispatch's bytes and vice versa). The weights' all_to_all (moe.dispatch_probs) sends one element per copy the
    dispatch sends, its backward one per copy the combine sends back; the etp gathers of the copies and their
    weights and the reduce_scatter of their partial outputs (forward and backward alike) one row per gathered copy.
    Only the multiset matters (tests compare as such)."""
    etp_labels = ("moe.experts.in", ETP_PROBS, "moe.experts.out")
    labels = ("moe.dispatch", "moe.combine", PROBS, *etp_labels)
    rest = [e for e in events if not e.label.endswith(labels)]
    moe = [e for e in events if e.label.endswith(labels)]
    if not moe:  # ep = etp = 1: no exchange
        return list(events)
    template = {(e.label.rsplit(".", 1)[-1], e.phase): e for e in moe}
    phases = sorted({e.phase for e in moe if e.phase != "bwd"})
    probs = ("dispatch_probs", "bwd") in template
    # bytes of the weights per byte of the dispatched copies (the template's: an exact ratio, rows x element size)
    per = (template["dispatch_probs", "bwd"].payload_bytes, template["dispatch", "bwd"].payload_bytes) if probs \
        else (0, 1)
    gathered = [(name, template[name, "bwd"].payload_bytes) for name in ("in_probs", "out")
                if (name, "bwd") in template]
    out = list(rest)
    for dispatch, combine, *etp in sent:
        for ph in [*phases, "bwd"]:  # the etp exchanges: the same rows in every phase (bytes per gathered byte)
            if etp and ("in", ph) in template:
                copies = template["in", "bwd"].payload_bytes  # the template's gathered bytes, b per exchange
                out += [replace(template["in", ph], payload_bytes=etp[0])]
                out += [replace(template[name, ph], payload_bytes=etp[0] * b // copies) for name, b in gathered]
        if ("dispatch", "bwd") not in template:  # ep = 1: the etp exchanges alone
            continue
        for ph in phases:
            out += [replace(template["dispatch", ph], payload_bytes=dispatch),
                    replace(template["combine", ph], payload_bytes=combine)]
            if probs:
                out.append(replace(template["dispatch_probs", ph], payload_bytes=dispatch * per[0] // per[1]))
        # backward: combine's gradient sends dY home-to-experts (dispatch's sizes), dispatch's sends dX back
        out += [replace(template["combine", "bwd"], payload_bytes=dispatch),
                replace(template["dispatch", "bwd"], payload_bytes=combine)]
        if probs:
            out.append(replace(template["dispatch_probs", "bwd"], payload_bytes=combine * per[0] // per[1]))
    return out


__all__ = ["expert_axes", "moe_stage_events", "stage_moe_layers", "with_routing"]
