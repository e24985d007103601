"""The analytic cost model's closed forms, vectorized: `evaluate` scores a LayoutBatch of one tensor mode.

`evaluate` returns `Scores` (the planner's fast path; analytic.estimate prices one layout through it and
attaches its explicit CommEvents, traffic.py); the planner's exact pruning bounds on them: score_bounds.py.
Pipeline (1F1B, interleaved with v chunks; Narayanan et al. 2021): with W the per-step work of the slowest
stage (compute + its per-micro-batch communication over N micro-batches), step = W + the bubble (every other
stage's micro-batch over v chunks, pipeline_bubble.py: W (pp-1)/(v N) with equal stages) + per-step communication
(gradients, grad norm, metrics). The stages considered are first (embedding),
middle and last (head, loss); memory is that of the most loaded stage. Each stage's parts
(communication per micro-batch and per step, compute, optimizer): stage_scores.py. The
data-parallel gradient reduction is exposed whole unless the layout overlaps it (`overlap`, Layout.overlap):
its buckets are reduced, one after the other on the data-parallel communicator's own stream, while the last
micro-batch's backward runs (torch DDP, Megatron's overlap_grad_reduce; the event engine simulates exactly
this); with pp > 1 per stage and model chunk, during that stage's (chunk's) own last backward, and the step
pays the stage whose queue drains last (grad_overlap.py; below: one stage, v = 1, the pipeline's last). A
bucket starts once the backward has produced it (modes/buckets.release_counts, the event engine's rule too):
the first at the end of the block that completes it (a fraction x1 of the backward), the last when the
backward ends, carrying the last block's gradients, the bucket it completes and the embedding's (a fraction
xl of the stage's bucket bytes). With G the gradient time and B the wall time of one micro-batch's backward,
    exposed gradient time = max(0, G - B (1 - x1), xl G, and every release between: grad_overlap.py)
with B lengthened by what the stream beside it costs: the tensor collectives' link share (contention.py) and the
compute's overlap drag c = D f min(G (1 - share left for the end), B (1 - x1)) (overlap_drag.py), which the
step pays (zero=1's gather beside the first forward and FSDP's units: the same drag, below and fsdp_overlap.py)
(the queue's finish time: the stream's last idle moment precedes some release). B = share x (compute +
tensor-parallel communication) of a micro-batch, share = 2/3 of it (3/4 with full recomputation: the
recomputed forward runs inside backward). Everything else per step (grad norm, metrics) stays exposed, and
so does zero=1's parameter all_gather after the optimizer step unless the engine is asked for `param_overlap`
(the runtime declares it: Megatron's distributed optimizer with --overlap-param-gather, whose all_gathers are
issued after the optimizer step and waited on by each bucket's forward pre-hook; Megatron-LM
docs/source/api-guide/dist_optimizer.md, megatron/core/distributed/param_and_grad_buffer.py). With Ga the
stage's gather time and Fw = share_f x (compute + tensor-parallel communication) / (N v), one chunk's forward
of the first micro-batch (share_f = 1/3, 1/4 with full recomputation),
    exposed parameter gather = max(0, Ga - Fw)
assuming every bucket's gather must land before the end of that first forward (a bucket's layers may come
earlier: this is the optimistic bound of waiting once; the event engine waits once at the same point). Every stage
issues its gathers at the step's start: they follow the optimizer step, which the stages end together (the grad-norm
all_reduce spans them), and Megatron-core's interleaved schedule launches them "at the same time across the
pipeline-parallel group" (pipeline_parallel/schedules.py); a later stage's first forward comes (pp-1 of them at
most) forwards later, so stage 0 pays. (Issued as each stage's first input arrives, the stages' gathers would run one
after another along the pipeline: the event engine did so before 2026-12, +42% on n4-340B-fp8-256.) Megatron-core with
virtual stages and align_param_gather gathers each model chunk's buffer apart (chunks 0 and 1 at the start, chunk c
as chunk c-1's first forward starts; a chunk's buckets issued last blocks first, so its first forward waits for all
of them), which would expose only Gc + (v-1) max(0, Gc - pp Fw), Gc = Ga / v; priced so, the NeMo Nemotron-4 340B
rows (v = 12) come out 6-7% under their measured times (n4-340B-fp8-2048: -14%, past test_fit_today's 10%), as if the
gathers held the compute. Megatron-core says why (distributed_data_parallel.py, param_and_grad_buffer.partition_buckets:
"because of the use of CUDA_DEVICE_MAX_CONNECTIONS=1, having multiple back-to-back communications will prevent the
overlap of the communication kernels with computation kernels": one hardware queue for every stream, the compute
kernels launched after a chunk's queued bucket gathers wait behind them; not measured here), so the wait-once form
stays.
zero=2/3 (comm.py, traffic.py): the per-micro-batch unit reduce-scatters and zero=3's gathers are priced in
line with compute unless the engine is asked for `fsdp_prefetch` (gathers prefetched one unit ahead, the
runtime's Runtime.fsdp_prefetch) and / or the layout has `overlap` (reduce-scatters asynchronous, HSDP's
replica all_reduce under the last micro-batch's backward): then per micro-batch what the recursion of
cost_models/fsdp_overlap.py leaves exposed; zero=2's per-step all_gather stays exposed; HSDP's shard and
replica groups get their own links.
The step's barrier over the data-parallel replicas waits for the slowest of them: s sqrt(step) E[max of dp
normals] (cost_models/stragglers.py; s the generation's jitter figure, GemmModel.straggler), added last.
CPU ranks that share cores (GemmModel.ranks_per_core > 1) pay the pipeline bubble at shared_cores.bubble_share:
the idle stages' ranks give their cores to the busy ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from paracube.cost_models.comm import StepTraffic
from paracube.cost_models.compute import GemmModel, block_compute_time
from paracube.cost_models.contention import extra, fsdp_extra, grad_extra, slowdown
from paracube.cost_models.dims import Dims
from paracube.cost_models.fsdp_overlap import prefetched_micro
from paracube.cost_models.fsdp_units import memory_units
from paracube.cost_models.grad_overlap_batch import exposed_by_config, stream_window
from paracube.cost_models.memory import stage_memory, total, with_zero
from paracube.cost_models.overlap_drag import beside, per_layout
from paracube.cost_models.pipeline_bubble import bubble_seconds
from paracube.cost_models.shared_cores import bubble_share
from paracube.cost_models.stage_scores import STAGES, Links, StageScores, same_stage, score_stage, stage_flags
from paracube.cost_models.stragglers import straggler_wait
from paracube.cost_models.window_stages import middle_excess, stages_differ
from paracube.modes import LayoutBatch
from paracube.modes.buckets import BUCKET_BYTES

Arr = np.ndarray
MEM_KEYS = ("parameters", "gradients", "optimizer", "activations", "temporaries")

@dataclass(frozen=True)
class Scores:
    """`evaluate`'s result, one entry per layout: step time and its parts (s), bytes one rank sends, memory
    of the most loaded stage (bytes; `memory_parts` by MEM_KEYS), index of the slowest stage in STAGES."""

    step_time: Arr
    compute: Arr
    comm: Arr
    bubble: Arr
    sent_bytes: Arr
    memory: Arr
    memory_parts: dict[str, Arr]
    stage: Arr
    stages: tuple[StageScores, ...]
    # the first and the last stage's memory by MEM_KEYS (moe_step adds each its own expert parts, then takes the
    # heavier); () where not kept
    memory_stages: tuple[dict[str, Arr], ...] = ()
    # what the middle stages' own windowed blocks take off pp - 2 copies of the middle one (s per step, per layout:
    # window_stages.middle_excess; the bubble's `middle_less`); None where they are alike
    middle_less: Arr | None = None


def evaluate(d: Dims, mode: str, b: LayoutBatch, links: Links, g: GemmModel, rows: Arr | None = None,
             zero: Arr | int | None = None, overlap: bool | Arr = False, kw: Arr | int = 0,
             tpo: bool | Arr = False, shard: int | None = None, param_overlap: bool = False,
             fsdp_prefetch: bool = False, bucket_bytes: int = BUCKET_BYTES, memory: bool = True) -> Scores:
    """Scores of many layouts of one mode. `b`: one entry per configuration (valid ones); `rows[i]`: the
    configuration of layout i (default: one layout per configuration); `links[axes]`: (bandwidth,
    latency) arrays per layout. `overlap` and `tpo`: for every layout, or per layout (bool arrays).
    `param_overlap`: zero=1's parameter all_gather hidden under the next step's first forward (int zero=1 only;
    module docstring). `fsdp_prefetch`: zero=2/3's gathers prefetched and reduce-scatters overlapped
    (int zero >= 2, pp = 1; with pipelines they are priced in line;
    cost_models/fsdp_overlap.py). `bucket_bytes`: the gradient bucket limit
    (modes/buckets.py; default DDP's 25 MiB). `memory=False`: the step time and its parts only (no step time
    reads memory; the planner's scoring passes checked it already): `memory` NaN, no parts."""
    rows = np.arange(len(b)) if rows is None else rows
    tpo_rows = np.broadcast_to(np.asarray(tpo, dtype=bool), rows.shape) if np.any(tpo) else None
    tpo_cfg: bool | Arr = False  # per configuration: the search's tpo is its configuration's (planner/scoring.py)
    if tpo_rows is not None:
        tpo_cfg = np.zeros(len(b), dtype=bool)
        tpo_cfg[rows[tpo_rows]] = True
        assert np.array_equal(tpo_cfg[rows], tpo_rows), "tpo differs between layouts of one configuration"
    # Traffic of zero=1 (bucket reduce_scatter + all_gather) is exact for one layout (an int zero); a per-
    # configuration array (the search) prices every row like zero=0: the same bytes per rank (search.py).
    traffic = StepTraffic(d, mode, b, int(zero) if isinstance(zero, (int, np.integer)) else 0, kw=kw,
                          tpo=tpo_cfg, shard=shard, bucket_bytes=bucket_bytes)
    same = same_stage(b.pp)
    blocks = block_compute_time(d, mode, b, g)  # one block's (forward, backward): every stage's (compute.py)
    stages: tuple[StageScores, ...] = ()
    for k, s in enumerate(STAGES):  # a stage with an earlier one's edge flags is that one (same inputs)
        stages += (stages[same[k]] if same[k] < k else
                   score_stage(d, mode, b, traffic, links, g, s, rows, zero, tpo_rows, overlap, blocks),)
    contend = slowdown(links, len(rows))  # tensor collectives beside the data-parallel stream (contention.py)
    drag = per_layout(links, len(rows), g.overlap_drag)  # compute beside the data-parallel stream (overlap_drag.py)
    if traffic.zero >= 2 and (fsdp_prefetch or np.any(overlap)):  # what prefetch / async reduce-scatters expose
        n_zero = traffic.group_size(traffic.zero_axes)
        ov = np.broadcast_to(np.asarray(overlap, dtype=bool), rows.shape)
        piped = (b.pp > 1)[rows]  # in line: the other stages' streams beside the tensor collectives (contention.py)
        stages = tuple(replace(st, micro=st.micro + np.where(piped, fsdp_extra(
            st.fsdp, st.compute, st.micro, st.tensor_bw, st.tensor_bwd, contend, d.recompute == "full", traffic.zero,
            ov), 0.0)) for st in stages)
        parts: list[tuple[Arr, Arr, Arr]] = []
        for k, (name, st) in enumerate(zip(STAGES, stages, strict=True)):
            parts.append(parts[same[k]] if same[k] < k else prefetched_micro(
                d, mode, b, g, rows, *stage_flags(name, b.pp), n_zero, st.compute, st.micro, st.fsdp, fsdp_prefetch, ov,
                st.tensor_bw, st.tensor_bwd, contend, drag, blocks))
        single = (b.pp == 1)[rows]  # pp > 1: zero's gathers / reduce-scatters priced in line (exposed), both engines
        stages = tuple(replace(st, micro=np.where(single, m, st.micro), step=st.step - np.where(single, rep, 0.0),
                               compute=st.compute + np.where(single, cp, 0.0))
                       for st, (m, rep, cp) in zip(stages, parts, strict=True))
    work = np.stack([s.compute + s.micro for s in stages])
    slow = np.argmax(work, axis=0)
    idx = np.arange(len(slow))

    def pick(key: str) -> Arr:
        return np.stack([getattr(s, key) for s in stages])[slow, idx]

    N = d.global_batch / (b.dp * b.mb)[rows]
    W = work[slow, idx]
    # ranks sharing cores: the idle stages' ranks give their core to the busy ones (shared_cores.py)
    less = middle_excess(d, mode, b, g)[rows] if stages_differ(d) else None  # sliding windows (window_stages.py)
    bubble = bubble_seconds(work, b.pp[rows], b.v[rows], N, bubble_share(b.pp[rows], g.ranks_per_core), less, d.L,
                            d.backward_share)
    step_comm = pick("step")
    if np.any(overlap):  # exposed gradient reduction: what the stages' last backwards do not hide (grad_overlap.py)
        share = d.backward_share
        # Per-configuration zero (the search) prices zero=1's buckets as the all_reduce they replace; only its
        # reduce_scatter half overlaps backward (the all_gather follows the optimizer step).
        half = (np.asarray(zero)[rows] >= 1 if zero is not None and not isinstance(zero, (int, np.integer))
                else np.zeros(len(rows), dtype=bool))
        grads = [np.where(half, st.grad / 2, st.grad) for st in stages]
        bwd = [share * (st.compute + st.micro) / N for st in stages]
        # the last backward's tensor collectives beside the buckets (contention.py), in that backward's time
        shapes = [st.releases[2][rows] for st in stages]  # each layout's stage shape (release_keys)
        windows = [stream_window(st.releases[0], st.releases[1], at) for st, at in zip(stages, shapes, strict=True)]
        late = [grad_extra(np.where(half, st.stream_bw[0] / 2, st.stream_bw[0]), bw, st.tensor_bwd / N, contend,
                           *w) for bw, st, w in zip(bwd, stages, windows, strict=True)]
        # the last backward beside the buckets' stream, from its first release, slowed (overlap_drag.py)
        pulled = [beside(0.0, bw * (1.0 - x1), gr * (1.0 - s_end), drag)
                  for bw, gr, (x1, s_end) in zip(bwd, grads, windows, strict=True)]
        # each stage's index in the pipeline, per configuration (exposed_by_config gathers it per layout)
        index = {"first": np.zeros_like(b.pp), "middle": np.where(b.pp > 2, 1, 0), "last": b.pp - 1}
        exposed = np.max([exposed_by_config(gr, bw + x + c, index[name], b.pp, b.v, st.releases[0], st.releases[2],
                                            rows)
                          for name, st, gr, bw, x, c in zip(STAGES, stages, grads, bwd, late, pulled, strict=True)],
                         axis=0)
        grad = pick("grad")
        hidden = np.where(half, grad / 2, grad) - exposed
        step_comm = step_comm - np.where(overlap, hidden - np.stack(late)[slow, idx] - np.stack(pulled)[slow, idx],
                                         0.0)
    if param_overlap and traffic.zero == 1:  # exposed gather: max(0, gather - one chunk's forward of the stage)
        fwd_share = 0.25 if d.recompute == "full" else 1.0 / 3.0
        fwd = fwd_share * (pick("compute") + pick("micro")) / (N * b.v[rows])
        gather = pick("gather")
        gather_bw = np.stack([st.stream_bw[1] for st in stages])[slow, idx]  # type: ignore[index]
        early = extra(gather_bw, fwd, (pick("tensor_bw") - pick("tensor_bwd")) / (N * b.v[rows]), contend)  # contention
        pulled_f = beside(0.0, fwd, gather, drag)  # that forward beside the gathers, slowed (overlap_drag.py)
        step_comm = step_comm - (gather - np.maximum(0.0, gather - fwd - early - pulled_f)) + early + pulled_f
    optim = pick("optim")
    step_time, compute, comm = W + bubble + step_comm + optim, pick("compute") + optim, pick("micro") + pick("step")
    step_time = step_time + straggler_wait(step_time, b.dp[rows], g.straggler)  # the slowest replica (stragglers.py)
    if not memory:
        return Scores(step_time=step_time, compute=compute, comm=comm, bubble=bubble, sent_bytes=pick("sent"),
                      memory=np.full(len(rows), np.nan), memory_parts={}, stage=slow, stages=stages, middle_less=less)
    mems = [stage_memory(d, mode, b, s == "first", s == "last", kw=kw) for s in STAGES]  # the middle: stage 1
    if zero is not None:  # 1 = optimizer state and fp32 master weights sharded over dp (2.5D: dp x depth), 2, 3
        shards = traffic.group_size(traffic.zero_axes)
        units = [memory_units(traffic.units(*stage_flags(s, b.pp))) if np.any(np.asarray(zero) >= 2) else None
                 for s in STAGES]
        mems = [with_zero(m, shards, zero, u, d.grad_bytes) for m, u in zip(mems, units, strict=True)]
    tot = np.stack([total(m) for m in mems])
    heavy = np.argmax(tot, axis=0)
    cidx = np.arange(len(heavy))
    parts = {k: np.stack([m[k] for m in mems])[heavy, cidx][rows] for k in MEM_KEYS}
    return Scores(step_time=step_time, compute=compute, comm=comm, bubble=bubble, sent_bytes=pick("sent"),
                  memory=tot[heavy, cidx][rows], memory_parts=parts,
                  stage=slow, stages=stages, memory_stages=tuple(
                      {k: np.broadcast_to(m[k], tot.shape[1:])[rows] for k in MEM_KEYS} for m in mems),
                  middle_less=less)


__all__ = ["MEM_KEYS", "Scores", "evaluate"]
