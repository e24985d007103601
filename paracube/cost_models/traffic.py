"""The explicit list of CommEvents of one training step, collective by collective.

Expanded from the mode's declaration (paracube/modes: embedding, layer_fwd / layer_bwd, head and
per-step collectives; docs/algorithms.md), in the order one rank issues them. cost_models/comm.py sums
the same declaration in closed form; tests/test_cost_model.py holds the two equal and tests/test_fidelity.py
holds this list equal to what the executor records. Generic parts:
- full recomputation issues a layer's forward collectives twice (phases fwd and recompute); rc=selective by module
  its MLP's again under mlp, and the core's cp exchange where the runtime re-runs the core with it
  (Runtime.cp_core_recompute; recompute_modules_cost.again_collectives);
- kept weights (Layout kw=1): a `kept` collective (a weight gather / its gradient's reduce-scatter) is
  issued once per step: forward in the first micro-batch's forward (not in recompute), backward in the
  last micro-batch's backward;
- pipeline (pp > 1): the events of ONE stage (layers / pp blocks; embedding on the first stage, final
  norm, head and loss on the last). Per micro-batch, a `send` of the stage's local activation shard
  [T, h] / act_split (compute dtype) over ("pp",) at every virtual-stage boundary it owns: first stage
  v fwd + (v-1) bwd, middle v + v, last (v-1) fwd + v bwd;
- per step: the mode's own (1D + sp: the sequence-parallel parameters), then the gradient buckets
  (paracube/modes/buckets.py: the local parameters `local_parameter_sizes` in reverse registration order,
  fp32, at most `bucket_bytes` each): zero=0 one all_reduce per bucket over the mode's grad_axes; zero=1
  one reduce_scatter over grad_axes (dp; 2.5D: dp, dep) of the bucket padded to a multiple of that group's
  size and, after the optimizer step, one all_gather over grad_axes of the updated parameters (fp32) per
  bucket; tied embeddings with pp > 1 (first and last stage): one all_reduce of the local embedding block's
  gradient (fp32) over the embedding group (("pp",), group size 2: Megatron's first + last stage; zero=0 after
  the buckets' all_reduce, zero=1 before the buckets' reduce_scatter, grad_sync.py); then the
  grad-norm all_reduce over
  ("pp", *tensor axes) (zero=1: ("pp", "dp", *tensor axes): the norm is summed over dp shards) and the
  metrics all_reduce.
  With pp > 1 the metrics all_reduce runs over ("pp", "dp", *tensor axes): the loss is on the last stage.
- zero=2 / zero=3 (executor/data_parallel/sharded.py, fsdp.py): buckets are FSDP units
  (modes/buckets.plan_units: embedding, each block, final norm + head; `zero_unit_numels`: padded to a
  multiple of the zero group Layout.zero_axes, dp or HSDP's dp_shard). Per micro-batch: zero=3 all-gathers
  every unit (compute dtype) before its forward and all but the last unit again before its backward; every
  unit's fp32 gradient is reduce-scattered over the zero group. Per step: with HSDP each unit's shard is
  all-reduced over dp_replicate (fp32, padded / n); zero=2 all-gathers the updated fp32 shards after the
  optimizer; the grad norm runs over the zero group and the tensor axes (`norm_axes`). With pipelines (pp > 1,
  one stage's units, untied): every unit's gradient is reduce-scattered in the LAST micro-batch's backward only
  (accumulated unsharded before), and zero=3 gathers every unit before each micro-batch's forward and backward
  (no unit held: other micro-batches run in between).
- context parallelism (Layout.cp > 1; modes/context.py): every layer's forward (and recompute) and backward lists
  gain the key / value exchange over ("cp",) (p2p: cp - 1 sends forward, 2 cp - 1 backward; ag: all_gather
  forward, all_gather + reduce_scatter backward); T is a cp rank's b s / cp tokens throughout; the gradient
  buckets (and zero's shards) use Layout.data_axes (dp, cp) instead of the mode's grad_axes, the metrics
  all_reduce dp, cp and the tensor axes.
Blocks per stage: modes/stages.py (uneven splits: one block less on the first and / or last stage).
A group of size 1 issues nothing.
"""

from __future__ import annotations

from paracube.cost_models import fp8
from paracube.cost_models.context_dims import context_local
from paracube.cost_models.dims import Dims, padded_vocab
from paracube.cost_models.local_parameters import local_parameter_sizes, parameter_units
from paracube.cost_models.recompute_again import again_collectives
from paracube.cost_models.validity import layout_arrays
from paracube.estimate import CommEvent
from paracube.layout import Layout
from paracube.modes import MODES, context
from paracube.modes.base import COMPUTE, F32, Collective, Sizes
from paracube.modes.buckets import BUCKET_BYTES, bucket_numels, padded_numel
from paracube.modes.sinks import sink_collectives
from paracube.modes.stages import stage_layers


class _Log:
    def __init__(self, layout: Layout, d: Dims, sizes: Sizes) -> None:
        self.layout, self.d, self.sizes = layout, d, sizes
        self.events: list[CommEvent] = []

    def add(self, kind: str, axes: tuple[str, ...], payload: int, dtype: str, phase: str, label: str) -> None:
        n = 1
        for a in axes:
            n *= self.layout.axis_size(a)
        if n > 1:
            self.events.append(CommEvent(kind, axes, n, int(payload), dtype, phase, label))

    def issue(self, colls: list[Collective], phase: str | None = None, prefix: str = "",
              micro: tuple[int, int] = (0, 1)) -> None:
        """Every collective that applies to this layout (`when`, kept weights on micro-batch k of n),
        with its own phase unless `phase` is given."""
        sp = self.layout.sequence_parallel
        for c in colls:
            if (c.when == "sp" and not sp) or (c.when == "no_sp" and sp):
                continue
            if c.kept and self.layout.keep_weights and _kept_elsewhere(phase or c.phase, *micro):
                continue
            if c.applies is not None and not c.applies(self.sizes):
                continue
            dtype = self.d.dtype if c.dtype == COMPUTE else c.dtype
            for _ in range(1 if c.calls is None else int(c.calls(self.sizes))):  # SUMMA: q steps
                self.add(c.kind, c.axes, c.payload(self.sizes), dtype, phase or c.phase, prefix + c.label)


def _kept_elsewhere(phase: str, k: int, n: int) -> bool:
    """A kept weight's collective (kw=1) is issued on another micro-batch than k of n (or not at all)."""
    return not ((phase == "fwd" and k == 0) or (phase == "bwd" and k == n - 1))


def _phases(d: Dims) -> tuple[str, ...]:
    return ("fwd", "recompute") if d.recompute == "full" else ("fwd",)


def act_split(layout: Layout) -> int:
    """Ways one rank's share of the block-boundary activations [T, h] is split."""
    return int(MODES[layout.mode].act_split(layout.tensor_size, int(layout.sequence_parallel)))


def layout_sizes(layout: Layout, d: Dims, mb: int, layers: int = 0, first: bool = False,
                 last: bool = False) -> Sizes:
    mode = MODES[layout.mode]
    t, q = layout.tensor_size, layout.q
    d = context_local(d, layout.cp, layout.cp_comm)  # T: a cp rank's tokens
    return Sizes(T=mb * d.s, t=t, q=q, depth=layout.depth, sp=int(layout.sequence_parallel),
                 V=padded_vocab(d.V, mode.vocab_split(t, q)), layers=layers, first=int(first), last=int(last),
                 cp=layout.cp)


def context_collectives(layout: Layout, d: Dims) -> tuple[list[Collective], list[Collective]]:
    """(forward, backward) key / value exchange of one layer over cp (modes/context.py); none at cp = 1."""
    if layout.cp == 1:
        return [], []
    unit = context.attention_unit(MODES[layout.mode])
    return context.layer_fwd(d, layout.cp_comm, unit), context.layer_bwd(d, layout.cp_comm, unit)


def _micro_batch(log: _Log, first: bool, last: bool, layers: int, micro: tuple[int, int]) -> None:
    """The collectives of micro-batch k of n (`micro`) on one stage."""
    mode, d = MODES[log.layout.mode], log.d
    if first:
        log.issue(mode.embedding(d), micro=micro)
    cp_fwd, cp_bwd = context_collectives(log.layout, d)
    fwd, bwd = mode.layer_fwd(d) + cp_fwd, mode.layer_bwd(d) + cp_bwd + sink_collectives(d, mode)
    # rcm=mlp (recompute_modules_cost.py; with tpo the output's ring reduce-scatter too)
    again = again_collectives(d, fwd, log.layout.tpo) if d.recompute == "selective" else []
    for i in range(layers):
        for ph in _phases(d):
            log.issue(fwd, ph, f"layers.{i}.", micro)
        log.issue(again, "recompute", f"layers.{i}.", micro)
        log.issue(bwd, "bwd", f"layers.{i}.", micro)
    if last:
        log.issue(mode.head(d), micro=micro)
    if log.layout.zero >= 2:
        _zero_micro_batch(log, first, last, layers, micro)


def _zero_micro_batch(log: _Log, first: bool, last: bool, layers: int, micro: tuple[int, int] = (0, 1)) -> None:
    """zero=2/3, per micro-batch (executor/data_parallel/sharded.py): zero=3 all-gathers every unit's
    parameters (compute dtype) before its forward and, all but the last unit (kept: torchtitan's
    reshard_after_forward=False for it; with tied embeddings on the stage the embedding unit too: the head
    reads its table), again before its backward; every unit's fp32 gradient is
    reduce-scattered over the zero group once its backward has produced it. Pipelines (pp > 1): gathered before
    every forward and backward, reduce-scattered in the last micro-batch of the step (`micro` = (k, n)) only."""
    layout, d = log.layout, log.d
    pipelined = layout.pp > 1
    units = zero_unit_numels(layout, d, layers, first, last)
    names = _unit_labels(layout, first, last, layers)
    axes = layout.zero_axes
    if layout.zero == 3:
        for n, (fwd, _) in zip(units, names, strict=True):
            log.add("all_gather", axes, d.c * n, d.dtype, "fwd", f"{fwd}.gather")
        held = 1 if d.tied and first and last else 0  # tied: the head reuses the gathered embedding (fsdp.py)
        kept = None if pipelined else -1  # pp = 1: the last unit stays gathered
        for n, (_, bwd) in list(zip(units, names, strict=True))[held:kept]:
            log.add("all_gather", axes, d.c * n, d.dtype, "bwd", f"{bwd}.gather")
    if pipelined and micro[0] != micro[1] - 1:
        return  # accumulated unsharded until the last micro-batch (data_parallel/sharded.py)
    for n, (fwd, _) in zip(units, names, strict=True):
        log.add("reduce_scatter", axes, 4 * n, F32, "bwd", f"{fwd}.rs")


def _unit_labels(layout: Layout, first: bool, last: bool, layers: int) -> list[tuple[str, str]]:
    """Per unit (registration order), the program units of its first forward and first backward op (the event
    engine places a unit's gather before them: event_program.py)."""
    units = MODES[layout.mode].program_units
    out = [("embedding", "embedding")] if first else []
    out += [(f"layers.{i}.{units[0]}", f"layers.{i}.{units[-1]}") for i in range(layers)]
    return out + ([("ln_f", "head")] if last else [])


unit_labels = _unit_labels  # public: cost_models/moe_traffic.py replaces these units with an MoE model's


def zero_unit_numels(layout: Layout, d: Dims, layers: int, first: bool, last: bool) -> list[int]:
    """zero=2/3: every FSDP unit's flat length (registration order), padded to a multiple of the zero group."""
    n = layout.axis_size_of(layout.zero_axes)
    return [padded_numel(sum(u), n)
            for u in parameter_units(layout.mode, d, layout.tensor_size, layout.q, layers, first, last)]


def _stage_log(layout: Layout, d: Dims, mb: int, stage: str) -> tuple[_Log, bool, bool, int]:
    first, last = layout.pp == 1 or stage == "first", layout.pp == 1 or stage == "last"
    layers = int(stage_layers(d.L, layout.pp, layout.interleave, int(first), int(last)))
    return _Log(layout, d, layout_sizes(layout, d, mb, layers, first, last)), first, last, layers


def micro_batch_events(layout: Layout, d: Dims, mb: int, stage: str = "first",
                       micro: tuple[int, int] = (0, 1)) -> list[CommEvent]:
    """The tensor-parallel collectives of micro-batch k of n (`micro`) on one rank of stage `stage` (no
    pipeline sends, no per-step collectives): the event engine's per-micro-batch programs."""
    log, first, last, layers = _stage_log(layout, context_local(d, layout.cp, layout.cp_comm), mb, stage)
    _micro_batch(log, first, last, layers, micro)
    return log.events


def stage_events(layout: Layout, d: Dims, mb: int, stage: str = "first",
                 bucket_bytes: int = BUCKET_BYTES) -> list[CommEvent]:
    """All collectives of one step on one rank of pipeline stage `stage` (first | middle | last)."""
    pp, v = layout.pp, layout.interleave
    d = context_local(d, layout.cp, layout.cp_comm)  # a cp rank's tokens (modes/context.py)
    log, first, last, layers = _stage_log(layout, d, mb, stage)
    n_micro = d.global_batch // (layout.dp * mb)
    T = mb * d.s
    for k in range(n_micro):
        _micro_batch(log, first, last, layers, (k, n_micro))
        if pp > 1:
            shard = d.c * T * d.h // act_split(layout)
            for _ in range(v - (1 if last else 0)):
                log.add("send", ("pp",), shard, d.dtype, "pipeline", "activations")
            for _ in range(v - (1 if first else 0)):
                log.add("send", ("pp",), shard, d.dtype, "pipeline", "activation_grads")
    # Per step.
    mode = MODES[layout.mode]
    log.issue(mode.step_collectives(d))
    zero, shards = layout.zero, zero_group(layout)
    buckets = bucket_numels(local_parameter_sizes(layout, d, stage), bucket_bytes) if zero < 2 else []
    zero1 = zero == 1
    tied: list[CommEvent] = []
    if pp > 1 and d.tied and (first or last):  # the tied embedding's two copies (executor/pipeline/schedule.py)
        V = padded_vocab(d.V, mode.vocab_split(layout.tensor_size, layout.q))
        shard = mode.embedding_shard(V, 0, d.h, layout.tensor_size, layout.q)
        tied.append(CommEvent("all_reduce", ("pp",), 2, 4 * int(shard), F32, "grad_sync", "embedding_grads"))
    if zero1:  # summed before the reduce-scatter of the bucket holding them (data_parallel/grad_sync.py)
        log.events += tied
    for n in buckets:
        if zero == 1:
            log.add("reduce_scatter", layout.data_axes, d.grad_bytes * padded_numel(n, shards), d.grad_dtype,
                    "grad_sync", "gradients")
        else:
            log.add("all_reduce", layout.data_axes, d.grad_bytes * n, d.grad_dtype, "grad_sync", "gradients")
    units = zero_unit_numels(layout, d, layers, first, last) if zero >= 2 else []
    for n in units:  # HSDP: each shard summed over the replicas, once per step
        log.add("all_reduce", layout.replica_axes, 4 * n // shards, F32, "grad_sync", "gradients.replicas")
    if not zero1:  # summed after the data-parallel all-reduce (pipeline/schedule.py)
        log.events += tied
    for c in fp8.amax_collectives(layout, d, layers):  # --dtype fp8: the amaxes, before the norm (step.py)
        log.add(*c)
    log.add("all_reduce", norm_axes(layout), 4, F32, "optimizer", "grad_norm")
    # FP8 parameters: every bucket's gather scaled by the stage's fraction (fp8.gathered_fraction), as comm.py
    frac = (float(fp8.gathered_fraction(d, layout.mode, layout_arrays(layout, mb), int(first), int(last),  # type: ignore[arg-type]
                                        float(sum(buckets)))[0]) if zero1 and fp8.fp8_params(d) else 1.0)
    for n in buckets if zero1 else []:
        log.add("all_gather", layout.data_axes, round(d.gather_bytes * padded_numel(n, shards) * frac),
                F32 if d.gather_bytes == 4 else d.dtype, "optimizer", "params")
    for n in units if zero == 2 else []:
        log.add("all_gather", layout.zero_axes, 4 * n, F32, "optimizer", "params")
    metric_axes = ("pp", *metric_data_axes(layout)) if pp > 1 else metric_data_axes(layout)
    log.add("all_reduce", metric_axes, 8, F32, "metrics", "loss")
    return log.events


def metric_data_axes(layout: Layout) -> tuple[str, ...]:
    """The loss metric's all_reduce group without pp: dp (with context parallelism dp, cp: each cp rank holds a
    share of every sequence's tokens) and the tensor axes."""
    return ("dp", *(("cp",) if layout.cp > 1 else ()), *layout.tensor_axes)


def zero_group(layout: Layout) -> int:
    """Ranks zero shards over: Layout.zero_axes (the mode's grad_axes, dp; 2.5D: dp x depth; HSDP: dp_shard)."""
    return layout.axis_size_of(layout.zero_axes)


def norm_axes(layout: Layout) -> tuple[str, ...]:
    """The grad-norm all_reduce's group: ("pp" with pipelines) + the zero group (zero >= 1: the norm is summed
    over its shards) + the tensor axes, canonical order."""
    zero = layout.zero_axes if layout.zero else ()
    return tuple(dict.fromkeys((*(("pp",) if layout.pp > 1 else ()), *zero, *layout.tensor_axes)))
