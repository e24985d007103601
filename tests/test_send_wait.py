"""A pipeline's hand-off on CPU ranks that share cores (DeviceSpec.send_wait_s, topologies/local_cpu.py), priced
alike by both engines.

Reference vs candidate throughout: the scheduler slice against the kernel's formula written out independently;
the local-cpu device against the same device with send_wait_s = 0 (only that field differs), whose step must
differ by exactly the extra wait of every send the critical stage makes, and not at all without a pipeline;
the event engine against the analytic one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.compute import GemmModel
from paracube.cost_models.device_model import gemm_model
from paracube.cost_models.event import estimate_event
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology, topology_from_dict
from paracube.topologies.device import DeviceSpec
from paracube.topologies.local_cpu import SCHED_BASE_SLICE_S, local_cpu_device, sched_slice_s
from paracube.workload import ModelSpec, TrainingSpec

SMALL = ModelSpec("small", layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 7, 8, 9, 64])
def test_the_slice_is_the_kernels_base_slice_scaled_by_log_cpus(cpus: int) -> None:
    """kernel/sched/fair.c, get_update_sysctl_factor (SCHED_TUNABLESCALING_LOG): 1 + ilog2(min(cpus, 8)); ilog2
    here as bit_length - 1 (exact for integers)."""
    assert sched_slice_s(cpus) == pytest.approx(SCHED_BASE_SLICE_S * min(cpus, 8).bit_length(), rel=1e-15)


@pytest.mark.parametrize("processes, cores", [(8, 2), (4, 2), (3, 2), (2, 2), (2, 8)])
def test_the_local_cpu_device_waits_a_slice_per_other_rank_on_the_core(processes: int, cores: int) -> None:
    dev = local_cpu_device(processes, cores=cores)
    assert dev.send_wait_s == pytest.approx(sched_slice_s() * (dev.ranks_per_core - 1), rel=1e-12, abs=0.0)
    if processes <= cores:
        assert dev.send_wait_s == 0.0  # a core per rank: nobody is scheduled in before the receiver


def test_a_send_waits_the_longer_of_its_two_waits_and_collectives_are_unchanged() -> None:
    """GemmModel.call_wait: a send on n >= 2 ranks pays max(call overhead + one message's step wait, send wait);
    every collective kind pays what it paid without a send wait."""
    n = np.array([1.0, 2.0, 4.0])
    base = GemmModel(peak=1e9, mem_bw=1e9, call_overhead=0.2e-3, ring_wait=0.3e-3)
    for send_wait in (0.1e-3, 4.5e-3):
        g = replace(base, send_wait=send_wait)
        assert g.waits
        old = base.call_wait("send", n, n, "fp32")
        assert g.call_wait("send", n, n, "fp32") == pytest.approx(
            np.where(n >= 2, np.maximum(old, send_wait), old), rel=1e-15)
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
            assert np.array_equal(g.call_wait(kind, n, n, "fp32"), base.call_wait(kind, n, n, "fp32"))


def topo_with(send_wait: float | None) -> object:
    """8 local-cpu ranks on 2 cores (fixed figures); `send_wait` in place of the device's unless None."""
    data = load_topology("local-cpu", gpus=8).to_dict()
    dev = local_cpu_device(8, cores=2)
    if send_wait is not None:
        dev = replace(dev, send_wait_s=send_wait)
    return topology_from_dict({**data, "device": dev.to_dict()})


@pytest.mark.parametrize("text", ["dp=8", "dp=2,tp=1d:4", "tp=3d:2x2x2", "dp=2,tp=2d:2x2"])
def test_without_a_pipeline_the_send_wait_changes_nothing(text: str) -> None:
    training, layout = TrainingSpec(global_batch=16, dtype="fp32"), parse_layout(text)
    with_it = estimate(SMALL, training, layout, topo_with(None), with_events=False).step_time_s
    assert with_it == estimate(SMALL, training, layout, topo_with(0.0), with_events=False).step_time_s


@pytest.mark.parametrize("text", ["dp=4,pp=2", "dp=2,pp=2,tp=1d:2,mb=2", "pp=4,tp=1d:2,mb=2"])
@pytest.mark.parametrize("global_batch", [16, 64])
def test_a_pipeline_pays_the_extra_wait_of_each_send_and_both_engines_alike(text: str, global_batch: int) -> None:
    """Against the device without a send wait: the analytic step grows by exactly (send wait - the step wait of
    one message) per send of the critical stage (its events; 1e-9: float sums); the event engine prices it as
    the analytic one, within 1e-4 where no bubble is left (r = 4 >= pp: both are the stage's work,
    test_shared_cores.py), else 2.5% (the simulated schedule against the bubble's formula, likewise)."""
    training, layout = TrainingSpec(global_batch=global_batch, dtype="fp32"), parse_layout(text)
    topo, without = topo_with(None), topo_with(0.0)
    an = estimate(SMALL, training, layout, topo)
    sends = sum(1 for e in an.events if e.kind == "send")
    dev = topo.device
    extra = dev.send_wait_s - dev.ring_wait_s
    assert sends > 0 and extra > 0
    base = estimate(SMALL, training, layout, without, with_events=False).step_time_s
    assert an.step_time_s == pytest.approx(base + sends * extra, rel=1e-9)
    ev = estimate_event(SMALL, training, layout, topo)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=1e-4 if dev.ranks_per_core >= layout.pp else 0.025)


def test_a_calibrated_topology_keeps_the_devices_send_wait() -> None:
    """The send wait is the scheduler's, not a probe's: a calibration (which sets the collectives' waits) leaves
    it as the device has it."""
    topo = topo_with(None)
    data = topo.to_dict()
    data["calibration"] = {"schema": 1, "elementwise": {"op_overhead_s": 1e-6, "bandwidth": 1e9,
                                                        "step_wait_s": 0.1e-3, "call_wait_s": 0.9e-3}}
    cal = topology_from_dict(data)
    g = gemm_model(cal, "fp32")
    assert g.send_wait == topo.device.send_wait_s > 0
    assert g.ring_wait == 0.1e-3 and g.call_overhead == 0.9e-3


def test_send_wait_round_trips_and_accelerators_have_none() -> None:
    again = topology_from_dict(topo_with(None).to_dict())
    assert again.device.send_wait_s == local_cpu_device(8, cores=2).send_wait_s
    assert "send_wait_s" not in load_topology("dgx-a100", gpus=8).device.to_dict()
    assert gemm_model(load_topology("dgx-h100", gpus=8), "bf16").send_wait == 0.0


def test_a_negative_send_wait_is_refused() -> None:
    with pytest.raises(ParacubeError, match=r"send_wait_s=-0.001 must be a number >= 0"):
        DeviceSpec("cpu", {"fp32": 1e9, "fp16": 1e9, "bf16": 1e9}, 1e9, 1e9, send_wait_s=-1e-3)
