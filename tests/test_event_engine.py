"""The discrete-event engine: max-min sharing, the fluid network, agreement with the analytic model without
contention, the slowdown of groups that share inter-node links, pipeline schedules, overlap, traces, errors.

Expected values are derived by hand in each test's docstring or comments.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import networkx as nx
import pytest
import simpy

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event, estimate_with, simulate
from paracube.cost_models.event_network import FlowNetwork, LinkTable, Template, weighted_maxmin
from paracube.cost_models.event_program import schedule
from paracube.cost_models.event_trace import chrome_trace, plot_timeline, write_chrome_trace
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology, topology_from_dict
from paracube.workload import ModelSpec, TrainingSpec

SMALL = ModelSpec("small", layers=2, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)
TRAIN = TrainingSpec(global_batch=16, dtype="bf16")


# --- max-min fair sharing ---------------------------------------------------------------------------------
def test_maxmin_two_flows_share_a_link_equally() -> None:
    assert weighted_maxmin([((0, 1.0),), ((0, 1.0),)], [10.0]) == [5.0, 5.0]


def test_maxmin_gives_the_leftover_to_the_unconstrained_flow() -> None:
    """A crosses links 0 (10 B/s) and 1 (4 B/s); B crosses link 0 only. Link 1 caps A at 4; B gets 10 - 4."""
    rates = weighted_maxmin([((0, 1.0), (1, 1.0)), ((0, 1.0),)], [10.0, 4.0])
    assert rates == pytest.approx([4.0, 6.0])


def test_maxmin_weight_stands_for_symmetric_copies() -> None:
    """A class of weight 3 (itself + 2 identical concurrent flows) and one plain flow on a 12 B/s link:
    4 flows in all, 3 B/s each."""
    assert weighted_maxmin([((0, 3.0),), ((0, 1.0),)], [12.0]) == pytest.approx([3.0, 3.0])


# --- the fluid network ------------------------------------------------------------------------------------
def _tpl(tid: int, link: int = 0, alpha: float = 0.0) -> Template:
    return Template(tid, f"t{tid}", (((link, 1.0),),), alpha, frozenset({link}))


def test_network_recomputes_rates_when_a_transfer_starts_and_ends() -> None:
    """10 B/s link. Job 1 (10 B) starts at 0, job 2 (10 B) at 0.5. Alone, job 1 moves 5 B by 0.5; shared,
    5 B/s each: job 1 ends at 0.5 + 5/5 = 1.5 with job 2 at 5 B left, alone again: 1.5 + 5/10 = 2.0."""
    env = simpy.Environment()
    net = FlowNetwork(env, [10.0])
    ends: dict[str, float] = {}

    def job(name: str, delay: float, tid: int):
        yield env.timeout(delay)
        yield net.run(_tpl(tid), 1, 10.0)
        ends[name] = env.now

    env.process(job("a", 0.0, 1))
    env.process(job("b", 0.5, 2))
    env.run()
    assert ends == pytest.approx({"a": 1.5, "b": 2.0})


def test_network_ring_steps_add_latency_per_step() -> None:
    """3 steps of 20 B on a 10 B/s link with alpha 0.1 s: 3 x (0.1 + 2) = 6.3 s."""
    env = simpy.Environment()
    net = FlowNetwork(env, [10.0])
    done = net.run(_tpl(1, alpha=0.1), 3, 20.0)
    env.run()
    assert done.processed and env.now == pytest.approx(6.3)


def test_step_by_step_and_jump_agree() -> None:
    """Two jobs on disjoint links jump; the same two on one link go step by step. Job A: 4 steps of 10 B,
    job B: 2 steps of 10 B, both at t = 0, alpha 0, one 10 B/s link: B's 2 steps at 5 B/s end at 4.0; A did 2
    steps by then and finishes the other 2 alone at 10 B/s: 4.0 + 2 = 6.0."""
    env = simpy.Environment()
    net = FlowNetwork(env, [10.0])
    a, b = net.run(_tpl(1), 4, 10.0), net.run(_tpl(2), 2, 10.0)
    times: dict[str, float] = {}
    a.callbacks.append(lambda _e: times.setdefault("a", env.now))
    b.callbacks.append(lambda _e: times.setdefault("b", env.now))
    env.run()
    assert times == pytest.approx({"a": 6.0, "b": 4.0})


# --- agreement with the analytic model without contention -------------------------------------------------
@pytest.mark.parametrize("text", ["dp=16", "dp=2,tp=1d:8", "dp=4,tp=2d:2x2", "dp=2,tp=2.5d:2x2x2",
                                  "dp=2,tp=3d:2x2x2"])
def test_no_contention_event_matches_analytic(text: str) -> None:
    """Two DGX A100 nodes: tensor groups inside one node (NVSwitch: every GPU has its own link to the switch)
    and data-parallel groups across nodes through per-GPU rail NICs, so no link carries two groups' hops.
    Without overlap both models add the same compute and ring times: they agree within 5% (here exactly,
    up to rounding, because the ring-step arithmetic is the same)."""
    topo = load_topology("dgx-a100", gpus=16)
    layout = parse_layout(text)
    ev, an = estimate_event(SMALL, TRAIN, layout, topo), estimate(SMALL, TRAIN, layout, topo)
    assert ev.engine == "event" and an.engine == "analytic"
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.05)
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6)
    assert ev.exposed_comm_time_s == pytest.approx(an.comm_time_s, rel=0.05)
    assert ev.memory == an.memory and ev.events == an.events


@pytest.mark.parametrize("text", ["dp=2,tp=1d:8,sp", "dp=2,tp=3d:2x2x2", "dp=4,tp=2d:2x2"])
def test_no_contention_with_full_recompute(text: str) -> None:
    """Full recomputation re-issues every block's forward collectives and GEMMs inside backward: both models
    count them (phase recompute), so they still agree within 5%."""
    topo = load_topology("dgx-a100", gpus=16)
    training = TrainingSpec(global_batch=16, dtype="fp32", recompute="full")
    layout = parse_layout(text)
    ev, an = estimate_event(SMALL, training, layout, topo), estimate(SMALL, training, layout, topo)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.05)
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6)


# --- contention the analytic model misses -----------------------------------------------------------------
INTRA, INTER, PCIE = 100e9, 10e9, 40e9
LAT_INTRA, LAT_INTER, LAT_PCIE = 1e-6, 5e-6, 2e-6


def _one_nic_cluster(nodes: int, per_node: int) -> object:
    return topology_from_dict({
        "name": "onenic", "device": "A100-SXM-80GB", "nodes": nodes, "devices_per_node": per_node,
        "intra_node": {"bandwidth": INTRA, "latency": LAT_INTRA},
        "inter_node": {"bandwidth": INTER, "latency": LAT_INTER, "nics_per_node": 1,
                       "pcie_bandwidth": PCIE, "pcie_latency": LAT_PCIE}})


def test_groups_straddling_nodes_share_the_middle_nic() -> None:
    """3 nodes x 4 GPUs, one NIC per node (10 GB/s; PCIe 40 GB/s, NVSwitch-like 100 GB/s). dp=4, tp=1d:3:
    tensor groups {0,1,2} {3,4,5} {6,7,8} {9,10,11}. {3,4,5} and {6,7,8} straddle nodes 0|1 and 1|2; in their
    rings 5->3 and 7->8 both leave node 1 through its one NIC (and 3->4, 8->6 both enter it): 2 flows per NIC
    direction, 5 GB/s each. A ring step ends with its slowest hop, and the step of the training step waits
    for the slowest group, so every tp collective runs at 5 GB/s with the cross-node latency
    alpha = 2 intra + 2 PCIe + 2 IB link latencies. The analytic model prices the group of rank 0 ({0,1,2},
    inside node 0: 100 GB/s, alpha = 2 intra) and misses it. Expected extra time, summed over the tp
    all-reduces of the step (2(n-1) = 4 steps each, sent = 2(n-1)/n payload):
        sum(sent) (1/5e9 - 1/100e9) + 4 (#calls) (alpha_slow - alpha_fast).
    Data-parallel groups {r, r+3, r+6, r+9} are symmetric (3 flows on every NIC) in both models."""
    model = ModelSpec("t3", layers=2, hidden=192, heads=6, ffn_hidden=768, vocab=300, seq_len=32)
    topo = _one_nic_cluster(3, 4)
    layout = parse_layout("dp=4,tp=1d:3")
    training = TrainingSpec(global_batch=8, dtype="bf16")
    ev, an = estimate_event(model, training, layout, topo), estimate(model, training, layout, topo)
    tp = [e for e in an.events if e.axes == ("tp",)]
    alpha_fast = 2 * LAT_INTRA
    alpha_slow = 2 * LAT_INTRA + 2 * LAT_PCIE + 2 * LAT_INTER
    extra = sum(e.sent_bytes() for e in tp) * (1 / (INTER / 2) - 1 / INTRA) + 4 * len(tp) * (alpha_slow - alpha_fast)
    assert extra > 0.2 * an.step_time_s  # a real effect, not noise
    assert ev.step_time_s - an.step_time_s == pytest.approx(extra, rel=0.02)
    assert ev.comm_time_by_axis["tp"] - an.comm_time_by_axis["tp"] == pytest.approx(extra, rel=0.02)


def _ring_time(e: object, bw: float, alpha: float) -> float:
    """Ring collective: steps x alpha + bytes a rank sends / bandwidth (2(n-1) steps for all_reduce); an
    all_reduce takes the binomial tree's 2 ceil(log2 n) steps of the whole payload where that is faster."""
    n = e.group_size  # type: ignore[attr-defined]
    steps = 2 * (n - 1) if e.kind == "all_reduce" else n - 1  # type: ignore[attr-defined]
    ring = steps * alpha + e.sent_bytes() / bw  # type: ignore[attr-defined]
    if e.kind != "all_reduce":  # type: ignore[attr-defined]
        return ring
    return min(ring, 2 * math.ceil(math.log2(n)) * (alpha + e.payload_bytes / bw))  # type: ignore[attr-defined]


def test_lines_kept_inside_nodes_beat_lines_spread_across() -> None:
    """2 nodes x 8 GPUs, one NIC per node (10 GB/s); 3D 2x2x2 cube x dp=2 (16 ranks).
    Kept inside (default place x.y.z.dp, rank = x + 2y + 4z + 8dp): only dp pairs {r, r+8} cross: 8 flows
    per NIC direction, 10/8 GB/s each. Spread (place=dp.x.y.z, rank = dp + 2x + 4y + 8z): z-lines {r, r+8}
    cross (8 flows per direction: 10/8 GB/s), the (x, z) planes' node-major rings have one crossing hop
    per direction per plane, 4 planes (10/4 GB/s), the grad-norm ring over (z, y, x) 2 groups (10/2 GB/s);
    dp pairs stay inside. Crossing hops have alpha = 2 intra + 2 PCIe + 2 IB latencies, inside 2 intra.
    Expected slowdown = sum over the step's collectives of ring time(spread) - ring time(inside)."""
    topo = _one_nic_cluster(2, 8)
    inside, spread = parse_layout("dp=2,tp=3d:2x2x2"), parse_layout("dp=2,tp=3d:2x2x2,place=dp.x.y.z")
    ev_in, ev_out = estimate_event(SMALL, TRAIN, inside, topo), estimate_event(SMALL, TRAIN, spread, topo)
    an = estimate(SMALL, TRAIN, inside, topo)
    a_in, a_x = 2 * LAT_INTRA, 2 * LAT_INTRA + 2 * LAT_PCIE + 2 * LAT_INTER
    link_in = {("dp",): (INTER / 8, a_x)}
    link_out = {("z",): (INTER / 8, a_x), ("x", "z"): (INTER / 4, a_x), ("z", "y", "x"): (INTER / 2, a_x)}
    expected = 0.0
    for e in an.events:
        if e.axes == ("dp", "z", "y", "x"):
            continue  # the metrics ring spans both nodes in both placements
        expected += _ring_time(e, *link_out.get(e.axes, (INTRA, a_in))) \
            - _ring_time(e, *link_in.get(e.axes, (INTRA, a_in)))
    assert expected > 0.1 * ev_in.step_time_s
    assert ev_out.step_time_s - ev_in.step_time_s == pytest.approx(expected, rel=0.02)


# --- pipeline schedules -------------------------------------------------------------------------------------
def test_1f1b_schedule_order() -> None:
    """pp=4, 6 micro-batches: stage s warms up with pp-1-s forwards, then alternates; every (F|B, m) once."""
    for s in range(4):
        order = schedule(4, 1, 6, s)
        assert [k for k, _, _ in order[: 4 - s]] == ["F"] * (3 - s) + ["F"]
        expected = [("F", m) for m in range(6)] + [("B", m) for m in range(6)]
        assert sorted((k, m) for k, _, m in order) == sorted(expected)
        assert [m for k, _, m in order if k == "B"] == list(range(6))


def test_interleaved_schedule_visits_every_chunk() -> None:
    """v=2, pp=2, 4 micro-batches: warm-up (pp-1-s)*2 + (v-1)*pp forwards; each (chunk, micro) F and B once;
    forward chunk order within a group of pp micro-batches is chunk 0 then chunk 1 (Megatron)."""
    order = schedule(2, 2, 4, 0)
    assert [k for k, _, _ in order[:4]] == ["F", "F", "F", "F"] and order[4][0] == "F"
    assert [(c, m) for k, c, m in order if k == "F"][:4] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    pairs = {(k, c, m) for k, c, m in order}
    assert pairs == {(k, c, m) for k in "FB" for c in range(2) for m in range(4)} and len(order) == 16


def test_pipeline_1f1b_bubble() -> None:
    """dp=1, pp=2, tp=1d:8 on 16 GPUs: with per-micro-batch work W/N per stage, 1F1B takes (N + pp - 1) W/N
    plus the per-step collectives: the analytic formula W (1 + (pp-1)/N). Sends are short (NVLink/IB), so
    the two agree within 5%; interleaving (v=2) shrinks the bubble (pp-1)/(vN) but sends v times as much
    (on this tiny model the extra sends cost more than the bubble saves)."""
    topo = load_topology("dgx-a100", gpus=16)
    training = TrainingSpec(global_batch=8, dtype="bf16")
    one = estimate_event(SMALL, training, parse_layout("pp=2,tp=1d:8,mb=1"), topo)
    an = estimate(SMALL, training, parse_layout("pp=2,tp=1d:8,mb=1"), topo)
    assert one.step_time_s == pytest.approx(an.step_time_s, rel=0.05)
    assert one.bubble_time_s > 0
    model4 = ModelSpec("small4", layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)
    v1 = estimate_event(model4, training, parse_layout("pp=2,tp=1d:8,mb=1"), topo)
    v2 = estimate_event(model4, training, parse_layout("pp=2,tp=1d:8,mb=1,v=2"), topo)
    assert v2.bubble_time_s < v1.bubble_time_s  # (pp-1)/(vN): the warm-up / cool-down shrinks
    assert v2.comm_time_s > v1.comm_time_s  # v times as many activation sends


# --- overlap ------------------------------------------------------------------------------------------------
def test_overlap_hides_weight_gradient_reduce_scatters() -> None:
    """3D with overlap: dA / bias reduce-scatters run under the dX GEMM and the gradient all-reduce under the
    last backward: exposed communication drops, total communication stays (same bytes), step gets shorter."""
    topo = load_topology("dgx-a100", gpus=16)
    layout = parse_layout("dp=2,tp=3d:2x2x2")
    base = estimate_event(SMALL, TRAIN, layout, topo)
    over = estimate_with("event", SMALL, TRAIN, layout, topo, overlap=True)
    assert over.exposed_comm_time_s < base.exposed_comm_time_s
    assert over.step_time_s < base.step_time_s
    assert over.step_time_s >= over.compute_time_s
    assert over.comm_time_s == pytest.approx(base.comm_time_s, rel=0.2)


# --- outputs ------------------------------------------------------------------------------------------------
def test_trace_and_gantt(tmp_path: Path) -> None:
    """One process per simulated device (pp stages), threads compute and comm; compute spans add up to the
    estimate's compute time; the PNG is written."""
    topo = load_topology("dgx-a100", gpus=16)
    res = simulate(SMALL, TrainingSpec(global_batch=8, dtype="bf16"), parse_layout("pp=2,tp=1d:4,dp=2"), topo)
    path = write_chrome_trace(res, tmp_path / "t.json")
    trace = json.loads(path.read_text())
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert names == ["stage 0 (rank 0)", "stage 1 (rank 8)"]
    threads = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {(p, s) for p in (0, 1) for s in ("compute", "comm")}
    crit = max(range(2), key=lambda p: sum(e["dur"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == p))
    compute = sum(e["dur"] for e in chrome_trace(res)["traceEvents"] if e["ph"] == "X" and e["tid"] == 0
                  and e["pid"] == crit) * 1e-6
    assert compute == pytest.approx(res.estimate.compute_time_s, rel=1e-6)
    png = plot_timeline(res, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- bad input ----------------------------------------------------------------------------------------------
def test_engine_dispatch_and_bad_names() -> None:
    topo = load_topology("dgx-a100", gpus=8)
    layout = parse_layout("tp=1d:8")
    assert estimate_with("analytic", SMALL, TRAIN, layout, topo).engine == "analytic"
    assert estimate_with("event", SMALL, TRAIN, layout, topo).engine == "event"
    with pytest.raises(ParacubeError, match="unknown engine 'packet'; valid: analytic, event"):
        estimate_with("packet", SMALL, TRAIN, layout, topo)
    with pytest.raises(ParacubeError, match="unknown engine options \\['speed'\\]; valid: param_overlap, "):
        estimate_with("event", SMALL, TRAIN, layout, topo, speed=2)


def test_layout_larger_than_topology_names_the_sizes() -> None:
    with pytest.raises(ParacubeError, match="needs 16 devices; topology 'dgx-a100' has 8"):
        estimate_event(SMALL, TRAIN, parse_layout("dp=2,tp=1d:8"), load_topology("dgx-a100", gpus=8))


class _FakeTopo:
    """Duck-typed topology for LinkTable: a chain 0 - s - 1 whose second link has the given bandwidth."""

    name = "fake"
    num_devices = 2

    def __init__(self, bandwidth: float, connected: bool = True) -> None:
        self.graph = nx.Graph()
        self.graph.add_edge("g0", "s", bandwidth=1e9, latency=1e-6)
        self.graph.add_edge("s", "g1", bandwidth=bandwidth, latency=1e-6)
        self.connected = connected

    def route(self, a: int, b: int) -> list[tuple[str, str]]:
        assert self.connected, "no path"
        path = ["g0", "s", "g1"] if a < b else ["g1", "s", "g0"]
        return list(zip(path, path[1:], strict=False))


def test_bad_links_ranks_and_disconnected_devices_are_named() -> None:
    with pytest.raises(ParacubeError, match="link 's'-'g1' has bandwidth=0"):
        LinkTable(_FakeTopo(0.0)).template("x", [[(0, 1)]])
    with pytest.raises(ParacubeError, match="rank 7 is not on topology 'fake'; valid ranks: 0..1"):
        LinkTable(_FakeTopo(1e9)).template("x", [[(0, 7)]])
    with pytest.raises(ParacubeError, match="no route from rank 0 to rank 1 .*disconnected"):
        LinkTable(_FakeTopo(1e9, connected=False)).template("x", [[(0, 1)]])
    with pytest.raises(ParacubeError, match="bandwidth"):  # the loader refuses such a graph up front too
        bad = _one_nic_cluster(1, 2).to_dict()
        bad["graph"]["links"][0]["bandwidth"] = 0
        topology_from_dict(bad)
    assert math.isfinite(LinkTable(_FakeTopo(1e9)).template("x", [[(0, 1)]]).alpha)


# --- the published layouts (docs/published-runs.md; every row: benchmarks/engines_agree.py) -------------------
@pytest.mark.parametrize("row,text", [
    ("t1-3.6B", "dp=32,tp=1d:2,mb=16,overlap"),  # tp x dp, gradient buckets overlapping backward
    ("t1-18.4B", "dp=32,tp=1d:8,mb=32,zero=1,overlap"),  # distributed optimizer: reduce_scatter buckets
    ("t1-39.1B", "dp=32,pp=2,tp=1d:8,mb=6,v=3,overlap,place=tp.pp.dp"),  # interleaved pipeline
    ("rd-8.67B", "dp=1,tp=1d:8,mb=16"),  # one node, no data parallelism
])
def test_engines_agree_on_published_layouts(row: str, text: str) -> None:
    """Both engines model the same step: tp collectives in line, dp buckets on their own stream during the last
    backward, interleaved stages. Their step times agree within 5% on these published layouts."""
    from paracube.calibration.run_prediction import preset_topology
    from paracube.calibration.runs_csv import read_runs
    from paracube.topologies.presets import PRESETS

    data = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published_runs.csv"
    run = next(r for r in read_runs(data, tuple(PRESETS)) if r.name == row)
    topo = preset_topology(run)
    layout = parse_layout(text)
    an = estimate(run.model, run.training, layout, topo, with_events=False)
    ev = estimate_event(run.model, run.training, layout, topo, with_events=False)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.05)
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6)


@pytest.mark.parametrize("text", ["dp=1,tp=3d:2x2x2,mb=4", "dp=8,tp=none,mb=1", "dp=2,tp=2d:2x2,mb=2"])
def test_engines_agree_on_local_cpu_overheads(text: str) -> None:
    """Uncalibrated local-cpu prices per-op and per-call overheads (ranks sharing cores): the event engine
    adds the same per op (compute) and per collective call as the analytic model, so the two agree."""
    from paracube.plan import default_plan

    plan = default_plan(text)
    topo = load_topology("local-cpu", gpus=plan.layout.world_size)
    an = estimate(plan.model, plan.training, plan.layout, topo, with_events=False)
    ev = estimate_event(plan.model, plan.training, plan.layout, topo, with_events=False)
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-9)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.05)


# --- kept weights (kw=1): gathered once per step -------------------------------------------------------------
DEEP = ModelSpec("deep", layers=4, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)


@pytest.mark.parametrize("text,model,recompute", [
    ("dp=2,tp=3d:2x2x2,mb=4,kw=1", SMALL, "none"),
    ("dp=2,tp=3d:2x2x2,mb=4,kw=1,overlap", SMALL, "full"),  # no kept gathers in recompute; buckets in bwd_last
    ("dp=4,tp=2d:2x2,mb=2,kw=1", SMALL, "full"),
    ("dp=2,tp=2.5d:2x2x2,mb=4,kw=1", SMALL, "none"),
    ("pp=2,tp=3d:2x2x2,mb=4,v=2,kw=1", DEEP, "none"),  # interleaved: each chunk's first / last micro-batch
    ("dp=2,tp=3d:2x2x2,mb=4,kw=0", SMALL, "none"),
])
def test_event_programs_issue_the_step_events(text: str, model: ModelSpec, recompute: str) -> None:
    """Replaying each stage's programs along its schedule (fwd_first for micro-batch 0, fwd for the others,
    bwd for all but the last, bwd_last, then the tail) issues exactly traffic.py's collectives of the step
    (pipeline sends aside: the engine rebuilds them from the schedule). With kw=1 a kept weight's gather runs
    in the first micro-batch's forward only and its gradient's reduce-scatter in the last backward only."""
    from paracube.cost_models.device_model import gemm_model
    from paracube.cost_models.dims import dims_of, with_pins
    from paracube.cost_models.event_program import build_stage
    from paracube.cost_models.traffic import stage_events

    topo = load_topology("dgx-a100", gpus=16)
    layout = parse_layout(text)
    n = 4  # micro-batches
    training = TrainingSpec(global_batch=n * layout.dp * layout.micro_batch, dtype="bf16", recompute=recompute)
    d, g, mb = with_pins(dims_of(model, training), layout), gemm_model(topo, training.dtype), layout.micro_batch
    for s in range(layout.pp):
        prog = build_stage(layout, d, mb, s, g, grad_overlap=layout.overlap)
        issued: list = []
        for kind, c, m in schedule(layout.pp, layout.interleave, n, s):
            ops = ((prog.fwd_first if m == 0 else prog.fwd) if kind == "F"
                   else (prog.bwd_last if m == n - 1 else prog.bwd))[c]
            issued += [op.event for op in ops if op.kind == "comm"]
        issued += [op.event for op in prog.tail if op.kind == "comm"]
        stage = "first" if s == 0 else ("last" if s == layout.pp - 1 else "middle")
        expected = [e for e in stage_events(layout, d, mb, stage) if e.kind != "send"]
        assert Counter((e.phase, *e.key()) for e in issued) == Counter((e.phase, *e.key()) for e in expected)
        once = (Counter(op.event.key() for ch in prog.fwd_first for op in ch if op.kind == "comm")
                - Counter(op.event.key() for ch in prog.fwd for op in ch if op.kind == "comm"))
        assert bool(once) == bool(layout.keep_weights)  # kw=1: the first forward gathers the kept weights


@pytest.mark.parametrize("text", ["dp=2,tp=3d:2x2x2,mb=4,kw=1", "dp=2,tp=3d:2x2x2,mb=4,kw=0"])
def test_no_contention_kept_weights_event_matches_analytic(text: str) -> None:
    """Four micro-batches on two DGX A100 nodes (as test_no_contention_event_matches_analytic): with kw=1 both
    engines price the kept gathers / reduce-scatters once per step, with kw=0 on every micro-batch, and agree
    within 5%; kw=1 moves less and is faster."""
    topo = load_topology("dgx-a100", gpus=16)
    training = TrainingSpec(global_batch=32, dtype="bf16")
    layout = parse_layout(text)
    ev, an = estimate_event(SMALL, training, layout, topo), estimate(SMALL, training, layout, topo)
    assert ev.step_time_s == pytest.approx(an.step_time_s, rel=0.05)
    assert ev.compute_time_s == pytest.approx(an.compute_time_s, rel=1e-6)
    assert ev.exposed_comm_time_s == pytest.approx(an.comm_time_s, rel=0.05)
    other = parse_layout(text.replace("kw=1", "kw=2").replace("kw=0", "kw=1").replace("kw=2", "kw=0"))
    ev_other = estimate_event(SMALL, training, other, topo)
    assert (ev.step_time_s < ev_other.step_time_s) == (layout.keep_weights == 1)


@pytest.mark.parametrize("text", ["dp=8", "dp=2,tp=2d:2x2", "tp=3d:2x2x2", "dp=2,pp=2,tp=1d:2,mb=2"])
def test_local_cpu_waits_priced_alike_by_both_engines(text: str) -> None:
    """8 local CPU ranks on 2 cores: both engines add the same scheduling wait per message of every collective
    (DeviceSpec.ring_wait_s x collective.wait_steps), so they agree (exactly without pipelines); without the
    wait the step is shorter."""
    from dataclasses import replace

    from paracube.topologies.local_cpu import local_cpu_device

    data = load_topology("local-cpu", gpus=8).to_dict()
    device = local_cpu_device(8, cores=2)
    assert device.ring_wait_s > 0 and device.call_overhead_s == 0
    training = TrainingSpec(global_batch=16, dtype="fp32")
    layout = parse_layout(text)
    times = {}
    for name, dev in (("waits", device), ("no wait", replace(device, ring_wait_s=0.0))):
        topo = topology_from_dict({**data, "device": dev.to_dict()})
        ev, an = estimate_event(SMALL, training, layout, topo), estimate(SMALL, training, layout, topo)
        # exactly alike without pipelines; a pipeline's schedule is simulated, the analytic bubble a formula
        assert ev.step_time_s == pytest.approx(an.step_time_s, rel=1e-9 if layout.pp == 1 else 0.05)
        times[name] = an.step_time_s
    assert times["waits"] > times["no wait"]


@pytest.mark.parametrize("text", ["dp=8", "dp=2,tp=1d:4", "dp=2,tp=2d:2x2", "tp=2.5d:2x2x2", "tp=3d:2x2x2"])
def test_local_cpu_wait_is_the_messages_times_the_wait(text: str) -> None:
    """The scheduling waits of a step, in both engines, are exactly ring_wait_s x the messages of its collectives
    (collective.wait_steps), one more per call where the mode's calls switch groups (2D, 2.5D, 3D:
    collective.ALTERNATING_MEET): the closed form over the step's recorded events."""
    from dataclasses import replace

    from paracube.cost_models.collective import wait_steps
    from paracube.topologies.local_cpu import local_cpu_device

    data = load_topology("local-cpu", gpus=8).to_dict()
    device = local_cpu_device(8, cores=2)
    training = TrainingSpec(global_batch=16, dtype="fp32")
    layout = parse_layout(text)
    steps, events = {}, ()
    for name, dev in (("waits", device), ("no wait", replace(device, ring_wait_s=0.0))):
        topo = topology_from_dict({**data, "device": dev.to_dict()})
        an = estimate(SMALL, training, layout, topo)
        steps[name] = (an.step_time_s, estimate_event(SMALL, training, layout, topo).step_time_s)
        events = an.events if name == "waits" else events
    alternating = layout.tensor_mode.alternating
    assert alternating == (layout.mode in ("2d", "2.5d", "3d"))
    messages = sum(float(wait_steps(e.kind, e.group_size, alternating)) for e in events)
    for engine in (0, 1):
        assert steps["waits"][engine] - steps["no wait"][engine] == pytest.approx(device.ring_wait_s * messages,
                                                                                  rel=1e-9)
