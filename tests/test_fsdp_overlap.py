"""zero=2/3 (FSDP) priced with prefetch (cost_models/fsdp_overlap.py): the recursion by hand, the analytic engine
against the event engine (which simulates every unit's gather issued as the previous unit starts and waited for as
its own starts, and every reduce-scatter on the zero group's stream), and the runtimes' declarations feeding it."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.fsdp_overlap import exposed_seconds, micro_batch_seconds
from paracube.engine_options import EngineOptions
from paracube.layout_parse import parse_layout
from paracube.runtimes import RUNTIMES
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("mid", layers=8, hidden=1024, heads=16, ffn_hidden=4096, vocab=8192, seq_len=1024)


def _one(x: float) -> np.ndarray:
    return np.array([x])


def test_recursion_by_hand() -> None:
    """Compute-bound units hide every gather but the first and every reduce-scatter but the last unit's;
    communication-bound ones leave the stream busy end to end; without units nothing is exposed."""
    z = _one(0.0)
    blocks = _one(6.0)
    # compute bound: a = 1, r = 1 per block, f = 3, b = 6; no embedding / head units: the first forward
    # gather, the first backward one (nothing kept gathered to hide it behind) and the last reduce-scatter
    got = exposed_seconds(blocks, (z, _one(3.0), z), (z, _one(6.0), z), (z, _one(1.0), z), (z, _one(1.0), z))
    assert got == pytest.approx([3.0])
    # with a head unit of the same size, kept gathered from its forward to its backward: the first forward
    # gather and the last reduce-scatter only
    u = (z, _one(1.0), _one(1.0))
    got = exposed_seconds(blocks, (z, _one(3.0), _one(3.0)), (z, _one(6.0), _one(6.0)), u, u)
    assert got == pytest.approx([2.0])
    # communication bound: a = 5, r = 5, f = 1, b = 2: forward 6 a + f, backward (the last block's gather kept
    # out: the head is absent, so the first backward unit is a block that gathers again) as the stream allows
    total = micro_batch_seconds(blocks, (z, _one(1.0), z), (z, _one(2.0), z), (z, _one(5.0), z), (z, _one(5.0), z))
    fwd = 6 * 5.0 + 1.0
    assert total[0] >= fwd + 6 * 5.0 + 6 * 5.0 - 1e-9  # every backward gather and reduce-scatter after it
    assert exposed_seconds(_one(0.0), (z, z, z), (z, z, z), (z, z, z), (z, z, z)) == pytest.approx([0.0])


def test_contention_where_the_stream_falls() -> None:
    """A block (forward 2 s, its tensor collectives 1 s of it) beside the head's prefetched gather, which starts
    with the block at 1 s: a 1 s gather covers half the block, so at r = 1/2 (slow 1) the block loses 0.5 s; a
    3 s gather covers all of it (1 s lost) but is the critical path, and the block's slack absorbs it."""
    z = _one(0.0)
    one = _one(1.0)
    for gather, lost in ((1.0, 0.5), (3.0, 0.0)):
        args = (one, (z, _one(2.0), one), (z, z, z), (z, one, _one(gather)), (z, z, z))
        tensor = ((z, one, z), (z, z, z))
        base = micro_batch_seconds(*args)
        slowed = micro_batch_seconds(*args, tensor=tensor, slow=1.0)
        assert slowed - base == pytest.approx([lost]), gather


def test_prefetch_hides_part_and_never_adds() -> None:
    """On every layout of the agreement list the prefetched step is no slower than the in-line one, and
    strictly faster where units are gathered across nodes; bytes unchanged."""
    for text in AGREE[:6]:
        layout = parse_layout(text)
        training = TrainingSpec(global_batch=16, dtype="bf16")
        topo = load_topology("dgx-a100", gpus=layout.world_size)
        on = estimate(SPEC, training, layout, topo, with_events=False, fsdp_prefetch=True)
        off = estimate(SPEC, training, layout, topo, with_events=False)
        assert on.step_time_s <= off.step_time_s * (1 + 1e-12), text
        assert on.comm_bytes_per_gpu == off.comm_bytes_per_gpu


AGREE = [  # 19 layouts: zero=2/3 with prefetch (and overlap: async reduce-scatters), HSDP (replica all_reduce
    # overlapped), tpo, overlapped dp reduction (zero=0/1); 8 GPUs a node
    "dp=8,zero=2,mb=1,overlap", "dp=16,zero=2,mb=1,overlap", "dp=4,zero=3,mb=4,overlap", "dp=16,zero=3,mb=1",
    "dp=8,zero=3,mb=1,rc=full,overlap", "dp=16,shard=8,zero=3,mb=1,overlap", "dp=16,shard=4,zero=2,mb=1,overlap",
    "dp=8,shard=2,zero=3,mb=2", "dp=2,tp=1d:4,sp,zero=2,mb=4,tpo,overlap", "dp=8,tp=1d:4,sp,zero=3,mb=2,tpo,overlap",
    "dp=4,tp=1d:4,sp,zero=3,mb=2,tpo,place=dp.tp,overlap", "dp=8,tp=1d:2,sp,zero=3,mb=1,rc=selective,tpo,overlap",
    "dp=16,mb=1,overlap", "dp=8,tp=1d:2,sp,mb=2,overlap,tpo",
    "dp=16,zero=1,mb=1,overlap", "dp=8,pp=2,tp=1d:2,sp,mb=1,overlap,tpo", "dp=4,tp=1d:4,sp,mb=4,zero=1,tpo",
    # dp (or HSDP's shard) and tp groups inside one node, both busy at once: the event engine shares the node's
    # links between the dp buckets / FSDP gathers and the tp collectives, and so does the analytic engine since
    # fit5 (cost_models/contention.py; before, 6.5% and 2% apart)
    "dp=4,tp=1d:4,mb=2,overlap", "dp=8,tp=1d:2,sp,shard=4,zero=3,mb=2,overlap",
]
# zero=3 with the tensor group inside a node beside the prefetched unit gathers (fit5 held these at a widened 4%:
# the closed form spread the stream over each phase, 2.5-3.2% apart): priced where the stream falls in each unit
# (fsdp_overlap.py's recursion, contention.py) they hold at 2% with the rest.
POSITIONAL = ["dp=8,tp=1d:2,sp,zero=3,mb=2,overlap", "dp=8,tp=1d:2,sp,zero=3,mb=2,tpo,overlap",
              "dp=16,tp=1d:4,shard=8,zero=3,mb=1"]
# with pipelines the unit collectives run in line, beside the other stages' tensor collectives (contention.fsdp_extra)
PIPELINED = ["dp=4,pp=2,tp=1d:2,sp,zero=3,mb=1,overlap", "dp=2,pp=2,tp=1d:4,sp,zero=2,mb=1,overlap",
             "dp=4,pp=2,tp=1d:2,zero=3,mb=2"]


def test_engines_agree_with_prefetch_hsdp_tpo_and_overlap() -> None:
    """Within 2% (the issue's bound) on all 25 layouts, with the options the runtime gives (torchtitan: FSDP
    prefetch and zero=1's gather overlap); the same bytes."""
    options = RUNTIMES["torchtitan"].engine_options()
    assert options == EngineOptions(param_overlap=True, fsdp_prefetch=True, fp8_scaling="dynamic", selective="op",
                                    moe_host_sync=True, moe_capacity="none")
    for text in AGREE + POSITIONAL + PIPELINED:
        layout = parse_layout(text)
        rc = layout.recompute or "none"
        training = TrainingSpec(global_batch=16, dtype="bf16", recompute=rc)
        layout = layout.with_(recompute=None)
        topo = load_topology("dgx-a100", gpus=layout.world_size)
        a = estimate(SPEC, training, layout, topo, with_events=False, options=options)
        e = estimate_event(SPEC, training, layout, topo, with_events=False, options=options)
        assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.02), (text, a.step_time_s, e.step_time_s)
        assert e.comm_bytes_per_gpu == pytest.approx(a.comm_bytes_per_gpu, rel=1e-9), text


def test_every_runtime_prefetches_and_the_dimension_reads_it() -> None:
    from paracube.planner.dimensions import FSDP_PREFETCH, PARAM_OVERLAP, chosen

    for rt in RUNTIMES.values():
        opts = rt.engine_options()
        assert opts == EngineOptions(param_overlap=chosen(PARAM_OVERLAP, rt, None),
                             fsdp_prefetch=chosen(FSDP_PREFETCH, rt, None), grad_bytes=rt.grad_bytes,
                             gather_16bit=rt.param_gather_16bit, fp8_param_gather=rt.fp8_param_gather,
                             fp8_scaling=rt.fp8_scaling, fp8_experts=rt.fp8_experts,
                             moe_dispatch=rt.moe_dispatch, moe_probs=rt.moe_probs, selective=rt.selective,
                             moe_host_sync=rt.moe_host_sync, moe_host_ops=rt.moe_host_ops,
                             moe_capacity=rt.moe_capacity,
                             offload_overlap=rt.offload is not None and rt.offload.overlap,
                             cp_core_recompute=rt.cp_core_recompute,
                             fused_norms=rt.fused_norms)
        assert opts.fsdp_prefetch  # FSDP2, DeepSpeed stage 3, Megatron-FSDP, executor/data_parallel/fsdp.py
