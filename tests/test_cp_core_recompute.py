"""rc=selective's attention core under context parallelism, as each runtime runs it (Runtime.cp_core_recompute):
Megatron-core's core_attn checkpoint re-runs Transformer Engine's attention with the cp exchange inside
(transformer/attention.py l.381-420; runtimes/base.py cites the lines), paracube's executor keeps the core out of
the recomputed region under cp (executor/layers/context_parallel.py; its recorded collectives and saved
activations: tests/test_context_parallel.py's launch, priced with the paracube runtime's options)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.dims import dims_of, with_options
from paracube.cost_models.event import estimate_event
from paracube.cost_models.traffic import stage_events
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.runtimes import RUNTIMES
from paracube.topologies import load_topology
from paracube.workload import TrainingSpec, with_seq_len

LLAMA = PRESETS["llama2-7b"]
H100 = load_topology("dgx-h100", 16)
MEGATRON, PARACUBE = RUNTIMES["megatron"].engine_options(), RUNTIMES["paracube"].engine_options()


def _train(rc: str, seq: int = 16384) -> TrainingSpec:
    return TrainingSpec(global_batch=8, seq_len=seq, dtype="bf16", recompute=rc)


def test_the_runtimes_declare_it() -> None:
    assert MEGATRON.cp_core_recompute and not PARACUBE.cp_core_recompute


@pytest.mark.parametrize("text", ["dp=2,cp=4,tp=1d:2,sp,mb=1", "dp=1,cp=8,cpc=ag,tp=1d:2,sp,mb=1"])
def test_megatron_re_runs_the_exchange_paracube_does_not(text: str) -> None:
    """Under megatron the recompute phase issues each layer's forward exchange again (p2p cp - 1 KV sends, ag the
    all_gather), exactly the forward's; under paracube none. Both sets are what each engine sends: the step's cp
    bytes differ by those events' bytes, N micro-batches x L layers."""
    lay = parse_layout(text)
    d = dims_of(LLAMA, _train("selective"))
    mine = {name: [e for e in stage_events(lay, with_options(d, o), 1) if e.axes == ("cp",)]
            for name, o in (("megatron", MEGATRON), ("paracube", PARACUBE))}
    again = [e for e in mine["megatron"] if e.phase == "recompute"]
    fwd = [e for e in mine["megatron"] if e.phase == "fwd"]
    assert not [e for e in mine["paracube"] if e.phase == "recompute"]
    assert sorted((e.kind, e.payload_bytes, e.label) for e in again) == \
        sorted((e.kind, e.payload_bytes, e.label) for e in fwd)
    sent = {name: estimate(LLAMA, _train("selective"), lay, H100, options=o).comm_bytes_per_gpu
            for name, o in (("megatron", MEGATRON), ("paracube", PARACUBE))}
    from paracube.estimate import ring_sent_factor

    extra = sum(ring_sent_factor(e.kind, e.group_size) * e.payload_bytes for e in again)
    assert sent["megatron"] - sent["paracube"] == pytest.approx(extra, rel=1e-9)


def test_megatron_prices_the_core_re_run_and_drops_its_tensors() -> None:
    """megatron under cp + rc=selective: slower than paracube by at least the core's forward (L layers, N micro-
    batches: the core re-run; its exchange hides behind it or adds), and its activations are smaller (the core's own
    tensors not kept); paracube under cp prices rc=selective's core as rc=none's: time and memory equal."""
    lay = parse_layout("dp=2,cp=4,tp=1d:2,sp,mb=1")
    meg, par = (estimate(LLAMA, _train("selective"), lay, H100, with_events=False, options=o)
                for o in (MEGATRON, PARACUBE))
    none = estimate(LLAMA, _train("none"), lay, H100, with_events=False, options=PARACUBE)
    assert par.step_time_s == pytest.approx(none.step_time_s, rel=1e-12)
    assert par.memory.activations == pytest.approx(none.memory.activations, rel=1e-12)
    assert meg.step_time_s > par.step_time_s and meg.memory.activations < par.memory.activations


DSV3 = replace(PRESETS["deepseek-v3"], layers=4, moe=None, ffn_hidden=18432)


@pytest.mark.parametrize(("name", "seq", "text"), [
    ("dsv3", 32768, "dp=1,cp=2,tp=1d:8,sp,mb=1"), ("dsv3", 32768, "dp=1,cp=4,tp=1d:4,sp,mb=1"),
    ("dsv3", 32768, "dp=1,cp=2,cpc=ag,tp=1d:8,sp,mb=1"), ("llama", 4096, "dp=1,cp=16,mb=1")])
@pytest.mark.parametrize("runtime", ["megatron", "paracube"])
def test_engines_agree_under_each_runtime(name: str, seq: int, text: str, runtime: str) -> None:
    """rc=selective under cp: DeepSeek-V3 (4 dense layers, MLA's core 2.86 x the dense one's) at s = 32768, and
    Llama-2 7B with cp=16 across nodes at s = 4096 (its ring, re-run under megatron, partly exposed): both engines
    within 2% (tests/test_context_parallel.py's test_engines_agree says why a bound), each runtime's re-run (its ring
    steps again beside the re-run blocks: event_context.ring_ops' recompute phase) priced alike."""
    model = with_seq_len(DSV3, seq) if name == "dsv3" else LLAMA
    train, topo = _train("selective", seq), load_topology("dgx-h100", 16)
    o = RUNTIMES[runtime].engine_options()
    a = estimate(model, train, parse_layout(text), topo, with_events=False, options=o)
    e = estimate_event(model, train, parse_layout(text), topo, with_events=False, options=o)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02, (text, runtime, a.step_time_s, e.step_time_s)
