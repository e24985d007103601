"""Microbenchmarks that every rank runs at once (what a training step sees: all ranks busy together).

`run_benchmarks(config)` starts `nproc` ranks (paracube.executor.launch.local_ranks: forkserver, gloo on CPU / NCCL
on CUDA, 127.0.0.1 and a free port, CPU ranks bound to cores as the executor binds them) and returns the
measured points. Every point has `time_s` (wall seconds per call) and `cpu_s` (this process's CPU seconds
per call, its communication threads included), each the mean over ranks:
- gemm: one [m, k] x [k, n] matmul per shape, every rank multiplying concurrently;
- elementwise: one `add` over a tensor of `bytes` (per-op overhead + memory bandwidth);
- collective: one call per (kind, group size, payload bytes, fixed or alternating groups), all
  groups of a pattern running concurrently (the other groups of the same mesh axis); "alternating" calls
  cycle through the patterns (strides) of that group size, as a 2D/3D step alternates mesh axes, "fixed"
  calls stay on stride 1; payload = the whole tensor
  (all-gather output, reduce-scatter input, all-reduce tensor), as in paracube/estimate.py;
  each rank's mean over `reps` calls after `warmup` calls.
`run_probes` (one launch per layout): executor training steps of PROBE_MODEL per layout, dtype and sequence
length (PROBE_SEQS), with their dispatched ops (_step_probe).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist

from paracube.errors import ParacubeError
from paracube.executor.launch.local_ranks import run_on_ranks
from paracube.workload import ModelSpec

KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class BenchConfig:
    nproc: int = 8
    gemm_shapes: tuple[tuple[int, int, int], ...] = ()
    elementwise_bytes: tuple[int, ...] = (256, 4096, 65536, 1 << 20)
    comm_bytes: tuple[int, ...] = (256, 4096, 65536, 1 << 20)
    # (group size, rank stride); the strides of one size are cycled through in one timed loop
    patterns: tuple[tuple[int, int], ...] = ((2, 1), (4, 1), (8, 1))
    reps: int = 10
    warmup: int = 2
    min_time_s: float = 0.05  # per GEMM / elementwise point: long enough for all ranks to overlap
    backend: str = "auto"
    timeout_s: float = 300.0


@dataclass
class BenchResult:
    gemm: list[dict[str, Any]] = field(default_factory=list)  # {m, n, k, time_s}
    elementwise: list[dict[str, Any]] = field(default_factory=list)  # {bytes, time_s}
    collective: list[dict[str, Any]] = field(default_factory=list)  # {kind, n, stride, bytes, time_s}
    # {layout, dtype, seq_len, ops, time_s, cpu_s, round_times_s} per step (run_probes, in rounds: calibrate.py)
    probe: list[dict[str, Any]] = field(default_factory=list)


def pattern_groups(world: int, n: int, stride: int) -> list[list[int]]:
    """Disjoint groups of n ranks spaced `stride` apart covering 0..world-1 (a mesh axis of that stride)."""
    if n < 2 or world % (n * stride):
        raise ParacubeError(f"group size {n} with stride {stride} does not tile {world} ranks; "
                            f"valid: n * stride dividing {world}")
    groups = []
    for block in range(0, world, n * stride):
        for offset in range(stride):
            groups.append([block + offset + i * stride for i in range(n)])
    return groups


def _timed(fn: Any, reps: int, warmup: int, sync: Any) -> tuple[float, float]:
    """(wall, process CPU) seconds per call."""
    for _ in range(warmup):
        fn()
    sync()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t0) / reps, (time.process_time() - c0) / reps


def _timed_for(fn: Any, min_time: float, sync: Any) -> tuple[float, float]:
    """(wall, process CPU) seconds per call, calling for at least `min_time` s so that the ranks' loops
    overlap in time (local work only: collectives need equal call counts on every rank)."""
    fn()
    sync()
    calls, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        for _ in range(8):
            fn()
        calls += 8
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time:
            return elapsed / calls, (time.process_time() - c0) / calls


# Few FLOPs, so that a step's time is mostly its ops' dispatch and its collectives' latency; hidden 64 so
# that every collective moves at least ~1 KiB (gloo's path for a few floats per rank is ~2x cheaper, and no
# model sends so little).
PROBE_MODEL = ModelSpec("step-probe", layers=2, hidden=64, heads=4, ffn_hidden=256, vocab=64, seq_len=16)
PROBE_MICRO_BATCH = 4  # 3D splits a micro-batch's sequences over q^2 = 4
# Two sequence lengths: the same ops and calls, every activation (and so every tensor collective's payload)
# 4x larger at the second, so that the fit can tell a per-message wait from a per-byte one (fit_host_overheads).
PROBE_SEQS = (16, 64)


def probe_model(seq_len: int) -> ModelSpec:
    """PROBE_MODEL at `seq_len` tokens per sequence."""
    return replace(PROBE_MODEL, seq_len=seq_len)


def _step_probe(mesh: Any, device: torch.device, dtype: str, spec: ModelSpec) -> tuple[Callable[[], None], int]:
    """(step, dispatched ops of one step): one executor training step (forward, backward, gradient sync,
    clipping, AdamW) of `spec` (a probe_model) on `mesh`, one micro-batch of PROBE_MICRO_BATCH sequences per
    data-parallel replica, parameters in the compute dtype (fp32 masters in the optimizer for bf16)."""
    from paracube.executor.data_parallel.optim import build_optimizer
    from paracube.executor.layers.functional import COMPUTE_DTYPES
    from paracube.executor.model.gpt import build_model
    from paracube.executor.op_count import DispatchCounter
    from paracube.executor.training.step import train_step
    from paracube.modes.buckets import BUCKET_BYTES

    layout = mesh.layout
    model = build_model(spec, mesh, dtype=COMPUTE_DTYPES[dtype]).to(device)
    opt = build_optimizer(model, mesh, 0, BUCKET_BYTES, lr=1e-3)
    gen = torch.Generator().manual_seed(0)  # the same tokens on every rank
    ids = torch.randint(0, spec.vocab, (PROBE_MICRO_BATCH, spec.seq_len), generator=gen).to(device)
    batch = [(ids, ids.roll(-1, dims=1))]

    def step() -> None:  # overlapping the gradient sync only where the layout says so, as `paracube run` does
        train_step(model, opt, mesh, batch, spec.seq_len * PROBE_MICRO_BATCH * layout.dp, overlap=layout.overlap)

    step()  # creates the optimizer state
    counter = DispatchCounter()
    with counter:
        step()
    return step, sum(counter.counts.values())


def _probe_rank(rank: int, world: int, device: torch.device, layout_text: str, dtypes: tuple[str, ...],
                steps: int, seqs: tuple[int, ...]) -> list[dict[str, Any]]:
    """One probe job: every dtype and sequence length of one layout, in a process holding that one mesh (as `run` and
    `validate` do: process groups of other layouts in the same process slowed the 1D probe by 5-15%).
    A serial layout runs one model per rank, every rank busy."""
    from paracube.executor.mesh import Mesh
    from paracube.layout_parse import parse_layout

    layout = parse_layout(layout_text)
    mesh = Mesh.single(layout) if layout.world_size == 1 else Mesh(layout, rank)
    probes = [(dtype, seq, *_step_probe(mesh, device, dtype, probe_model(seq))) for seq in seqs for dtype in dtypes]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out = []
    for dtype, seq, step, ops in probes:
        dist.barrier()
        t, c = _timed(step, steps, 0, sync)
        out.append({"layout": layout_text, "dtype": dtype, "seq_len": seq, "ops": ops, "time_s": t, "cpu_s": c})
    return out


def run_probes(layouts: tuple[str, ...], dtypes: tuple[str, ...], steps: int, nproc: int, backend: str = "auto",
               timeout_s: float = 300.0, seqs: tuple[int, ...] = PROBE_SEQS) -> list[dict[str, Any]]:
    """Step probes of every (dtype, sequence length, layout) on nproc local ranks, one launch per layout; rank
    means."""
    out = []
    for text in layouts:
        # fresh interpreters, as `paracube run`'s workers: forked ones step faster (local_ranks.run_on_ranks)
        per_rank = run_on_ranks(_probe_rank, nproc, (text, dtypes, steps, seqs), backend, timeout_s,
                                "calibration probe", fresh=True)
        for i, row in enumerate(per_rank[0]):
            out.append({**row, **{key: sum(r[i][key] for r in per_rank) / nproc for key in ("time_s", "cpu_s")}})
    return out


def _bench_rank(rank: int, world: int, device: torch.device, cfg: BenchConfig) -> BenchResult:
    out = BenchResult()
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # GEMMs: barrier first so that every rank multiplies at the same time (shared cores, as in training).
    for m, n, k in cfg.gemm_shapes:
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        dist.barrier()
        t, c = _timed_for(lambda a=a, b=b: torch.mm(a, b), cfg.min_time_s, sync)
        out.gemm.append({"m": m, "n": n, "k": k, "time_s": t, "cpu_s": c})
    for nbytes in cfg.elementwise_bytes:
        x = torch.zeros(max(1, nbytes // 4), device=device)
        dist.barrier()
        t, c = _timed_for(lambda x=x: x.add_(1.0), cfg.min_time_s, sync)
        out.elementwise.append({"bytes": nbytes, "time_s": t, "cpu_s": c})
    # Collectives, per group size n, two ways: "fixed" calls one group (stride 1) over and over, as 1D's
    # tensor group does, so its members stay in step; "alternating" cycles through every stride given for n
    # (the mesh axes of that size), as 2D/3D alternate axes call after call, so a call waits on peers that were
    # just busy in another group: synchronization skew is measured, not modelled. Every rank creates every
    # group in the same order (torch requires it).
    by_n: dict[int, list[int]] = {}
    for n, stride in cfg.patterns:
        by_n.setdefault(n, []).append(stride)
    for n, strides in by_n.items():
        mine = []
        for stride in strides:
            groups = pattern_groups(world, n, stride)
            handles = [dist.new_group(g) for g in groups]
            mine.append(next(h for g, h in zip(groups, handles, strict=True) if rank in g))
        cycles = [(str(strides[0]), mine[:1])] + ([(",".join(map(str, strides)), mine)] if len(mine) > 1 else [])
        for nbytes in cfg.comm_bytes:
            numel = max(n, nbytes // 4 // n * n)  # whole-tensor elements, divisible by n
            full = torch.ones(numel, device=device)
            shard = torch.ones(numel // n, device=device)
            parts = [torch.empty_like(shard) for _ in range(n)]
            chunks = list(full.chunk(n))
            for label, cycle in cycles:
                for kind in KINDS:
                    nxt = itertools.cycle(cycle).__next__  # the next group of the cycle
                    call = {
                        "all_reduce": lambda full=full, nxt=nxt: dist.all_reduce(full, group=nxt()),
                        "all_gather": lambda parts=parts, shard=shard, nxt=nxt: dist.all_gather(
                            parts, shard, group=nxt()),
                        "reduce_scatter": lambda shard=shard, chunks=chunks, nxt=nxt: dist.reduce_scatter(
                            shard, chunks, group=nxt()),
                    }[kind]
                    dist.barrier()
                    t, c = _timed(call, cfg.reps * len(cycle), cfg.warmup * len(cycle), sync)
                    out.collective.append({"kind": kind, "n": n, "stride": label, "alternating": len(cycle) > 1,
                                           "bytes": numel * 4, "time_s": t, "cpu_s": c})
    return out


def _average(per_rank: list[BenchResult]) -> BenchResult:
    """Mean over ranks of every measured point (ranks measured the same list in the same order)."""
    out = BenchResult()
    for name in ("gemm", "elementwise", "collective"):
        rows = [getattr(r, name) for r in per_rank]
        for i, row in enumerate(rows[0]):
            mean = {key: sum(r[i][key] for r in rows) / len(rows) for key in ("time_s", "cpu_s")}
            getattr(out, name).append({**row, **mean})
    return out


def run_benchmarks(cfg: BenchConfig) -> BenchResult:
    """Run the microbenchmarks on cfg.nproc local ranks; ParacubeError if a rank fails or times out."""
    for n, stride in cfg.patterns:
        pattern_groups(cfg.nproc, n, stride)  # validate before starting anything
    per_rank = run_on_ranks(_bench_rank, cfg.nproc, (cfg,), cfg.backend, cfg.timeout_s, "calibration")
    return _average(per_rank)


__all__ = ["KINDS", "PROBE_MICRO_BATCH", "PROBE_MODEL", "PROBE_SEQS", "BenchConfig", "BenchResult", "pattern_groups",
           "probe_model", "run_benchmarks", "run_probes"]
