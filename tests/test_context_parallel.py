"""Context parallelism priced (modes/context.py, cost_models/context_parallel.py): the declared exchange by hand,
the closed forms equal to the explicit list, memory per rank, the engines' agreement, and bad input."""

from __future__ import annotations

from collections import Counter

from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.layout import parse_layout
from paracube.workload import PRESETS, TrainingSpec

TINY = PRESETS["tiny"]  # L=2, h=64, heads=4 (kv = h: no GQA), f=256, V=256, s=64


def _events(text: str, mb: int, gb: int = 8) -> Counter:
    d = dims_of(TINY, TrainingSpec(global_batch=gb, dtype="bf16"))
    return Counter((e.kind, e.axes, e.payload_bytes, e.phase, e.label.split(".", 2)[-1])
                   for e in stage_events(parse_layout(text), d, mb) if e.axes == ("cp",))


def test_ring_exchange_by_hand() -> None:
    """dp=2, cp=2, tp=1d:2, mb=2, bf16: N = 8 / (2 x 2) = 2 micro-batches; a rank's T = 2 x 64 / 2 = 64 tokens;
    KV = 2 B x 64 x 2 x 64 / 2 (heads over tp) = 8192 B. Per layer forward cp - 1 = 1 send, backward cp - 1 = 1
    KV + cp = 2 dKV sends; 2 layers x 2 micro-batches. The gradients all_reduce over (dp, cp), the metric too."""
    got = _events("dp=2,cp=2,tp=1d:2,mb=2", 2)
    cp = ("cp",)
    assert got == Counter({("send", cp, 8192, "fwd", "attn.cp_kv"): 4, ("send", cp, 8192, "bwd", "attn.cp_kv"): 4,
                           ("send", cp, 8192, "bwd", "attn.cp_dkv"): 8})
    d = dims_of(TINY, TrainingSpec(global_batch=8, dtype="bf16"))
    grads = [e for e in stage_events(parse_layout("dp=2,cp=2,tp=1d:2,mb=2"), d, 2) if e.label == "gradients"]
    assert grads and all(e.axes == ("dp", "cp") and e.group_size == 4 for e in grads)


def test_all_gather_exchange_and_recompute_by_hand() -> None:
    """dp=1, cp=4, cpc=ag, no tp, mb=4, full recomputation: N = 2; T = 4 x 64 / 4 = 64; KV = 2 x 64 x 2 x 64 =
    16384 B, gathered cp KV = 65536 B. Per layer forward an all_gather (again in the recompute), backward an
    all_gather and a reduce_scatter of dK, dV; 2 layers x 2 micro-batches. Labels name `none`'s qkv unit."""
    d = dims_of(TINY, TrainingSpec(global_batch=8, dtype="bf16", recompute="full"))
    got = Counter((e.kind, e.payload_bytes, e.phase, e.label.split(".", 2)[-1])
                  for e in stage_events(parse_layout("dp=1,cp=4,cpc=ag,mb=4"), d, 4) if "cp" in e.axes
                  and e.phase != "metrics" and e.phase != "grad_sync")
    assert got == Counter({("all_gather", 65536, "fwd", "qkv.cp_kv"): 4,
                           ("all_gather", 65536, "recompute", "qkv.cp_kv"): 4,
                           ("all_gather", 65536, "bwd", "qkv.cp_kv"): 4,
                           ("reduce_scatter", 65536, "bwd", "qkv.cp_dkv"): 4})


# --- pricing --------------------------------------------------------------------------------------------------

from dataclasses import replace  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from paracube.cost_models.analytic import estimate  # noqa: E402
from paracube.cost_models.dims import context_local  # noqa: E402
from paracube.cost_models.event import estimate_event  # noqa: E402
from paracube.errors import ParacubeError  # noqa: E402
from paracube.estimate import ring_sent_factor  # noqa: E402
from paracube.topologies import load_topology  # noqa: E402

LLAMA = PRESETS["llama2-7b"]
H100 = load_topology("dgx-h100", 16)


def _train(seq: int = 16384, rc: str = "none", gb: int = 8) -> TrainingSpec:
    return TrainingSpec(global_batch=gb, seq_len=seq, dtype="bf16", recompute=rc)


ENGINE_CASES = [  # (layout, recompute): ring and all-gather, tp + sp, none, pipelines, zero, full recomputation
    ("dp=2,cp=4,tp=1d:2,sp,mb=1", "none"),
    ("dp=1,cp=8,cpc=ag,tp=1d:2,sp,mb=1", "selective"),
    ("dp=2,cp=2,tp=1d:4,sp,mb=1,zero=1", "full"),
    ("dp=2,cp=8,mb=1", "none"),
    ("dp=1,pp=2,cp=4,tp=1d:2,mb=1", "none"),
    ("dp=1,cp=16,mb=1,zero=3", "none"),
]


@pytest.mark.parametrize(("text", "rc"), ENGINE_CASES)
def test_engines_agree(text: str, rc: str) -> None:
    """The analytic model and the event engine price a cp layout within 2% (the same decomposition: each ring
    step alongside one block's attention, context_parallel.py / event_context.py; the event engine's flow network
    shares links between groups, which the analytic model's per-group link does not, hence a bound, not equality)."""
    lay = parse_layout(text)
    a = estimate(LLAMA, _train(rc=rc), lay, H100, with_events=False)
    e = estimate_event(LLAMA, _train(rc=rc), lay, H100, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02, (text, a.step_time_s, e.step_time_s)
    if lay.cp_comm != "ag":  # the ring's exposed part is priced and reported on the cp axis by both
        assert a.comm_time_by_axis.get("cp", 0) == pytest.approx(e.comm_time_by_axis.get("cp", 0), rel=0.02)


def test_ring_hidden_where_attention_covers_it() -> None:
    """Inside one node (cp=2 on NVLink) at s = 16384 the block attention outlasts each ring step: the ring's
    exposed time is only the last dK, dV return per layer and micro-batch; the all-gather variant is exposed whole
    and so slower."""
    p2p = estimate(LLAMA, _train(), parse_layout("dp=4,cp=2,tp=1d:2,sp,mb=1"), H100, with_events=False)
    ag = estimate(LLAMA, _train(), parse_layout("dp=4,cp=2,cpc=ag,tp=1d:2,sp,mb=1"), H100, with_events=False)
    assert p2p.step_time_s < ag.step_time_s
    assert 0 < p2p.comm_time_by_axis["cp"] < ag.comm_time_by_axis["cp"]


def test_sent_bytes_equal_the_explicit_list() -> None:
    """The closed forms (comm.py + context_parallel.ring_time) send what the explicit list (traffic.py) sends."""
    for text in ("dp=2,cp=4,tp=1d:2,sp,mb=1", "dp=1,cp=8,cpc=ag,tp=1d:2,mb=1", "dp=2,cp=2,mb=2,zero=1"):
        lay = parse_layout(text)
        for rc in ("none", "full"):
            est = estimate(LLAMA, _train(rc=rc), lay, H100)
            listed = sum(ring_sent_factor(e.kind, e.group_size) * e.payload_bytes for e in est.events)
            assert est.comm_bytes_per_gpu == pytest.approx(listed, rel=1e-12), (text, rc)


def test_memory_per_rank_closed_form() -> None:
    """Activations per rank of a cp layout = those of the same layout at cp = 1 divided by cp (flash: every saved
    tensor linear in the rank's s / cp tokens; context_parallel.py's docstring), and the temporaries gain the
    exchange's buffers: p2p 4 KV, ag 2 cp KV, KV = c (b s / cp) 2 kv / t (here c = 2, b = 1, kv = 4096, t = 2)."""
    base = estimate(LLAMA, _train(), parse_layout("dp=1,tp=1d:2,sp,mb=1"), H100, with_events=False).memory
    for cp, comm, buffers in ((2, "p2p", 4), (4, "p2p", 4), (4, "ag", 8), (8, "ag", 16)):
        lay = parse_layout(f"dp=1,cp={cp},cpc={comm},tp=1d:2,sp,mb=1")
        mem = estimate(LLAMA, _train(), lay, H100, with_events=False).memory
        assert mem.activations == pytest.approx(base.activations / cp, rel=1e-12)
        kv = 2 * (16384 // cp) * 2 * 4096 / 2
        plain = estimate(LLAMA, _train(16384 // cp), parse_layout("dp=1,tp=1d:2,sp,mb=1"), H100,
                         with_events=False).memory.temporaries  # the same block at s / cp, no exchange
        assert mem.temporaries == pytest.approx(plain + buffers * kv, rel=1e-12)
        assert mem.parameters == base.parameters and mem.optimizer == base.optimizer


def test_attention_flops_causal_balance() -> None:
    """With the causal load balance every cp rank does 1 / cp of the attention: cp blocks of its s / cp queries x
    s / cp keys (compute.attention_core_time on a cp rank's dims: cp x one block's GEMM seconds, flash reading the
    cp blocks' k, v), and the model FLOPs stay those of whole sequences."""
    from paracube.cost_models.compute import attention_core_time, gemm_model, model_flops_per_step

    d = dims_of(LLAMA, _train(32768))
    g = gemm_model(H100, "bf16")
    one = np.array([1])
    for cp in (2, 4, 8):
        local = context_local(d, cp)
        f, b = attention_core_time(local, one, one, g)
        f1, _ = attention_core_time(replace(d, s=d.s // cp), one, one, g)  # one block: s / cp queries and keys
        gemm = f1 - 2 * 4.0 * (d.s // cp) * d.h / (g.mem_bw * g.mem_eff)  # less its flash i/o (q, k, v, out)
        io = 2 * 2.0 * (1 + cp) * (d.s // cp) * d.h / (g.mem_bw * g.mem_eff)
        assert f[0] == pytest.approx(cp * gemm + io, rel=1e-9)
        assert model_flops_per_step(local) == model_flops_per_step(d)


def test_bad_cp_refused() -> None:
    """cp that does not cut the sequence into 2 cp chunks, one line naming the valid degrees."""
    with pytest.raises(ParacubeError, match=r"cp=3 splits each sequence into 6 chunks: sequence length 4096 is not "
                                            r"a multiple of 6; valid: 1, 2, 4"):
        estimate(LLAMA, _train(4096), parse_layout("dp=1,cp=3,tp=1d:2"), H100)
