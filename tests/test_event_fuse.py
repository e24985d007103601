"""Event engine at scale: fused runs give the answer of op-by-op simulation; the gradient bucket both engines
price; `--trace` / `--timeline` merge spans under their stated rule instead of truncating.

Fused vs unfused (event_fuse.py): the same durations are added in another order, so results agree to float
rounding; 1e-9 relative is ~1e6 times the rounding of the ~1e3 additions a step here makes, and far below any
modelling difference (a wrong fusion shifts a step by whole collectives: > 1e-4 relative).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.dims import dims_of
from paracube.cost_models.event import simulate
from paracube.cost_models.event_program import build_stage
from paracube.cost_models.event_trace import chrome_trace, plot_timeline
from paracube.cost_models.traffic import stage_events
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.workload import ModelSpec, TrainingSpec

SMALL = ModelSpec("small", layers=8, hidden=256, heads=8, ffn_hidden=1024, vocab=256, seq_len=128)
TRAIN = TrainingSpec(global_batch=16, dtype="bf16", recompute="full")
REL = 1e-9  # module docstring

# pipelines (1F1B, interleaved), gradient buckets overlapping backward, tpo, tp overlap, 2D, cp, kept weights;
# on 32 GPUs of DGX A100 (4 nodes): dp groups cross nodes and share NICs with the pipeline sends
LAYOUTS = [("pp=2,tp=1d:8,dp=2", False), ("pp=4,tp=1d:4,dp=2,v=2,overlap", False), ("pp=2,tp=1d:8,sp,tpo,dp=2", False),
           ("pp=2,tp=1d:8,dp=2", True), ("pp=2,tp=2d:2x2,dp=4,overlap", False), ("dp=4,cp=2,tp=1d:4", False),
           ("pp=2,tp=2d:2x2,dp=4,kw=1", False)]


def _tracks(spans: list) -> list:
    return sorted((s.device, s.stream, s.name, s.category, s.start, s.end) for s in spans)


def test_fused_runs_give_the_op_by_op_answer() -> None:
    """Every estimate field, the ring steps and collectives counted, and every timeline span agree; the fused
    path takes fewer simpy events where tp groups share no link with dp groups (tp=8: a node each; with tp=4
    and dp inside a node both use the GPUs' NVSwitch links and nothing is fused)."""
    topo = load_topology("dgx-a100", gpus=32)
    fused_layouts = set()
    for text, overlap in LAYOUTS:
        layout = parse_layout(text)
        fused, plain = (simulate(SMALL, TRAIN, layout, topo, overlap=overlap, fuse=f) for f in (True, False))
        a, b = fused.estimate, plain.estimate
        for name in ("step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s", "bubble_time_s"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), rel=REL, abs=1e-15), (text, name)
        for name in ("comm_time_by_axis", "comm_time_by_kind"):
            x, y = getattr(a, name), getattr(b, name)
            assert set(x) == set(y) and all(x[k] == pytest.approx(y[k], rel=REL, abs=1e-15) for k in x), (text, name)
        assert fused.stats["ring_steps"] == plain.stats["ring_steps"] and fused.stats["jobs"] == plain.stats["jobs"]
        ta, tb = _tracks(fused.timeline.spans), _tracks(plain.timeline.spans)
        assert [t[:4] for t in ta] == [t[:4] for t in tb], text
        assert all(x[4] == pytest.approx(y[4], rel=REL, abs=1e-15) and x[5] == pytest.approx(y[5], rel=REL, abs=1e-15)
                   for x, y in zip(ta, tb, strict=True)), text
        if fused.stats.get("fused_runs", 0) > 0:
            assert fused.stats["simpy_events"] < plain.stats["simpy_events"], text
            fused_layouts.add(text)
    assert {"pp=2,tp=1d:8,dp=2", "pp=2,tp=1d:8,sp,tpo,dp=2"} <= fused_layouts


def test_both_engines_price_the_bucket_they_are_given() -> None:
    """A Megatron-sized bucket (published runs: max(40M, 1M x dp x cp) fp32 elements, calibration/runs_csv.py)
    reaches the event engine's programs as it reaches the analytic traffic: the same gradient collectives, fewer
    than with the default 25 MiB; the estimates' event lists agree."""
    layout = parse_layout("pp=2,tp=1d:2,dp=2,mb=1,overlap")
    model = ModelSpec("mid", layers=8, hidden=2048, heads=16, ffn_hidden=8192, vocab=32000, seq_len=512)
    training = TrainingSpec(global_batch=8, dtype="bf16")
    topo = load_topology("dgx-a100", gpus=8)
    big = 4 * 40_000_000
    d = replace(dims_of(model, training), global_batch=layout.dp)
    g = __import__("paracube.cost_models.device_model", fromlist=["gemm_model"]).gemm_model(topo, "bf16")
    counts = {}
    for bucket in (25 * 2**20, big):
        prog = build_stage(layout, d, 1, 0, g, grad_overlap=False, bucket_bytes=bucket)
        ops = [op.event for op in prog.tail if op.event is not None and op.event.label == "gradients"]
        want = [e for e in stage_events(layout, d, 1, "first", bucket) if e.label == "gradients"]
        assert [(e.kind, e.payload_bytes) for e in ops] == [(e.kind, e.payload_bytes) for e in want]
        counts[bucket] = len(ops)
        ev = simulate(model, training, layout, topo, timeline=False, bucket_bytes=bucket).estimate
        assert ev.events == estimate(model, training, layout, topo, bucket_bytes=bucket).events
    assert counts[big] < counts[25 * 2**20]


def test_trace_and_chart_merge_spans_by_the_stated_rule(tmp_path: Path) -> None:
    """Past the limit spans merge (never drop): at most the limit are written, the metadata states the rule and
    the counts, every simulated span lies inside a written one of its track, and per track the busy time (args)
    is the simulated one. Under the limit nothing changes. A limit below 1 is refused."""
    topo = load_topology("dgx-a100", gpus=16)
    res = simulate(SMALL, TRAIN, parse_layout("pp=2,tp=1d:4,dp=2"), topo)
    n = len(res.timeline.spans)
    whole = chrome_trace(res)
    meta = whole["otherData"]["paracube_spans"]
    assert meta["written"] == n and "all" in meta["rule"]
    for limit in (60, 5):
        trace = chrome_trace(res, max_spans=limit)
        xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        meta = trace["otherData"]["paracube_spans"]
        assert len(xs) <= limit and meta["written"] == len(xs) and meta["simulated"] == n and str(n) in meta["rule"]
        busy: dict[tuple, float] = defaultdict(float)
        for e in xs:
            busy[e["pid"], e["tid"]] += e.get("args", {}).get("busy_us", e["dur"])
        want: dict[tuple, float] = defaultdict(float)
        for s in res.timeline.spans:
            tid = ("compute", "comm").index(s.stream)
            want[s.device, tid] += (s.end - s.start) * 1e6
            assert any(e["pid"] == s.device and e["tid"] == tid and e["ts"] <= s.start * 1e6 * (1 + 1e-12)
                       and e["ts"] + e["dur"] >= s.end * 1e6 * (1 - 1e-12) for e in xs), (limit, s)
        assert set(busy) == set(want) and all(busy[k] == pytest.approx(want[k], rel=1e-9) for k in want)
    assert chrome_trace(res, max_spans=5)["otherData"]["paracube_spans"]["categories_merged"]
    png = plot_timeline(res, tmp_path / "t.png", max_spans=60)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ParacubeError, match="max_spans=0"):
        chrome_trace(res, max_spans=0)
    json.dumps(whole)  # serializable as written
