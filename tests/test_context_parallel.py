"""Context parallelism priced (modes/context.py, cost_models/context_parallel.py): the declared exchange by hand,
the closed forms equal to the explicit list, memory per rank, the engines' agreement, and bad input."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from dist_helpers import TOL_FP64, rel_err, run_distributed, saved_bytes

from paracube.cost_models.dims import dims_of
from paracube.cost_models.traffic import stage_events
from paracube.errors import ParacubeError
from paracube.estimate import traffic_difference
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.workload import ModelSpec, TrainingSpec

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


def test_mla_exchange_by_hand() -> None:
    """MLA (tiny-mla: H = 4, d_n + d_r = 24, d_v = 16; h / H = 16) exchanges its core's k and v: cp=2, tp=1d:2, mb=2,
    bf16: T = 2 x 64 / 2 = 64, KV = 2 B x 64 x 4 x (24 + 16) / 2 = 10240 B, not the dense width's 2 x 64 x 2 x 64 / 2
    = 8192 B (Dims.kv_exchanged; the executor's recorded bytes: test_cp_matches_serial_and_the_cost_model)."""
    d = dims_of(replace(PRESETS["tiny-mla"], moe=None), TrainingSpec(global_batch=2, dtype="bf16"))
    sent = {e.payload_bytes for e in stage_events(parse_layout("cp=2,tp=1d:2"), d, 2) if e.axes == ("cp",)}
    assert d.kv_exchanged == 160 and sent == {10240}


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

import numpy as np  # noqa: E402

from paracube.cost_models.analytic import estimate  # noqa: E402
from paracube.cost_models.context_dims import context_local  # noqa: E402
from paracube.cost_models.event import estimate_event  # noqa: E402
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


DSV3 = replace(PRESETS["deepseek-v3"], layers=4, moe=None, ffn_hidden=18432)  # its MLA core 2.86 x the dense one's
WIDE_CASES = [  # (model, seq, GPUs, layout, recompute): MLA + MoE; MLA whose core outlasts the ring; a wide head
    ("tiny-mla", 16384, 8, "dp=2,cp=2,ep=2,tp=1d:2,sp,mb=1", "none"),
    ("tiny-mla", 16384, 8, "dp=4,cp=2,cpc=ag,ep=2,mb=1", "none"),
    ("dsv3", 32768, 16, "dp=1,cp=2,tp=1d:8,sp,mb=1", "selective"),
    ("dsv3", 32768, 16, "dp=1,cp=4,tp=1d:4,sp,mb=1", "full"),
    ("qwen3-30b-a3b", 32768, 16, "dp=1,cp=4,ep=4,tp=1d:4,sp,mb=1", "none"),
]


@pytest.mark.parametrize(("name", "seq", "gpus", "text", "rc"), WIDE_CASES)
def test_engines_agree_on_mla(name: str, seq: int, gpus: int, text: str, rc: str) -> None:
    """MLA (+ MoE) and a head width other than h / heads under cp: both engines price the exchange at the true k, v
    widths (Dims.kv_exchanged) and each ring step against its block's true core (compute.core_scale: the event
    engine's steps carry it, moe_program.with_blocks adds the rest of the correction), within 2% as
    test_engines_agree says why; the ring's exposed part alike on the cp axis."""
    from paracube.workload import with_seq_len

    model = with_seq_len(DSV3 if name == "dsv3" else PRESETS[name], seq)
    lay, train, topo = parse_layout(text), _train(seq=seq, rc=rc, gb=16), load_topology("dgx-h100", gpus)
    a = estimate(model, train, lay, topo, with_events=False)
    e = estimate_event(model, train, lay, topo, with_events=False)
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02, (text, a.step_time_s, e.step_time_s)
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
    from paracube.cost_models.compute import attention_core_time
    from paracube.cost_models.device_model import gemm_model
    from paracube.cost_models.model_flops import model_flops_per_step

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
# --- run by the executor (executor/layers/context_parallel.py) ---------------------------------------------------
# The equivalence template: the serial model against its cp-sharded copy, both fp64 (dist_helpers.TOL_FP64: why
# fp64 and why 1e-5), 3 AdamW steps of 2 micro-batches with clipping; then one fp32 step whose recorded collectives
# equal traffic.stage_events (multiset of (kind, axes, bytes, dtype): zero difference). ONE launch per world size:
# the 4-rank launch runs its 2-rank cases on ranks 0-1 (ranks 2-3 build the same groups, as torch requires).
SPEC = ModelSpec("cpx", layers=2, hidden=32, heads=4, ffn_hidden=64, vocab=64, seq_len=16)
GQA = replace(SPEC, family="llama", kv_heads=2)  # grouped-query attention: 2 query heads per kv head
# MLA (executor/layers/mla.py): keys of d_n + d_r = 24, values of d_v = 16 per head exchanged; one windowed variant
MLA = replace(PRESETS["tiny-mla"], name="tiny-mla-dense", moe=None, seq_len=16)
FAMILY = {"gpt": SPEC, "llama": GQA, "mla": MLA, "mla-window": replace(MLA, sliding_window=6, window_pattern="WF")}
B, N_MICRO, STEPS, MAX_NORM, LR = 2, 2, 3, 0.1, 1e-3
ADAMW = {"lr": LR, "weight_decay": 0.1, "eps": 1e-6}
CASES_4 = [("dp=1,cp=2", "gpt", "none"), ("dp=1,cp=2,cpc=ag", "llama", "none"), ("dp=1,cp=4", "gpt", "none"),
           ("dp=1,pp=2,cp=2", "gpt", "none"), ("dp=1,cp=2", "mla", "none"),
           ("dp=1,cp=2,cpc=ag,tp=1d:2,sp", "mla-window", "selective"),
           ("dp=1,cp=2,tp=1d:2,rcm=mla_up_proj", "mla", "none"), ("dp=1,cp=2", "llama", "selective")]
CASES_8 = [("dp=2,cp=2,tp=1d:2,sp", "gpt", "full"), ("dp=2,cp=2,cpc=ag,tp=1d:2", "llama", "selective")]


def _batches(dp: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Every replica's micro-batches [b, s] (the cp ranks of a replica get the same; the model takes its chunks)."""
    gen = torch.Generator().manual_seed(99)
    n = dp * B * N_MICRO
    ids = torch.randint(0, SPEC.vocab, (n, SPEC.seq_len), generator=gen)
    labels = torch.randint(0, SPEC.vocab, (n, SPEC.seq_len), generator=gen)
    return [[(ids[(r * N_MICRO + m) * B:(r * N_MICRO + m + 1) * B], labels[(r * N_MICRO + m) * B:(r * N_MICRO + m + 1)
              * B]) for m in range(N_MICRO)] for r in range(dp)]


def _full_grads(model: Any, mesh: Any) -> dict[str, torch.Tensor]:
    """The step's reduced gradients (the after_backward hook: buckets summed over dp x cp); 1D + sp's norms and row
    biases summed over tp here as the step does next (test-side, unrecorded)."""
    import torch.distributed as dist

    from paracube.executor.layers.functional import main_grad

    sp = {id(p) for p in getattr(model.mode, "sequence_parallel_params", [])}
    out = {}
    for name, p in model.named_parameters():
        g = main_grad(p).detach().double().clone()
        if id(p) in sp:
            dist.all_reduce(g, group=mesh.group(("tp",)))
        out[name] = g
    return out


def _key_columns(t: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """The key columns of a GPT qkv bias block ([heads, 3, d] columns: the middle of each head's triple)."""
    return t.reshape(-1, 3, spec.hidden // spec.heads)[:, 1]


def compare_with_serial(spec: ModelSpec, mesh: Any, model: Any, ref: Any, opts: tuple[Any, Any],
                        batches: tuple[list, list], tokens: int) -> tuple[dict[str, float], float]:
    """STEPS steps of the sharded model and its serial reference: relative errors of each step's loss and norm,
    of the first step's reduced gradients and of the parameters after the steps, and (cp > 1) the largest
    difference of the GPT key bias columns, bounded apart (test_cp_matches_serial_and_the_cost_model)."""
    from paracube.executor import train_step

    (opt, ref_opt), (micro, every) = opts, batches
    errors: dict[str, float] = {}
    grads: dict[str, dict[str, torch.Tensor]] = {}

    def keep(key: str) -> Any:  # the first step's reduced gradients, before clipping
        return lambda m: grads.setdefault(key, _full_grads(m, m.mesh))

    for step in range(STEPS):
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM, after_backward=keep("model"))
        want = train_step(ref, ref_opt, ref.mesh, every, tokens, MAX_NORM, after_backward=keep("ref"))
        errors[f"step{step}.loss"] = abs(res.loss - want.loss) / want.loss
        errors[f"step{step}.grad_norm"] = abs(res.grad_norm - want.grad_norm) / want.grad_norm
    full, key_diff = dict(ref.named_parameters()), 0.0
    for name, p in model.named_parameters():
        if name in grads["model"]:
            errors[f"grad:{name}"] = rel_err(grads["model"][name], model.block_of(name, grads["ref"][name]))
        mine, theirs = p.detach(), model.block_of(name, full[name]).detach()
        if name.endswith("attn.qkv.bias") and mesh.layout.cp > 1 and spec.family == "gpt":  # llama: rotated keys
            key_diff = max(key_diff, (_key_columns(mine, spec) - _key_columns(theirs, spec)).abs().max().item())
            others = torch.ones_like(mine, dtype=torch.bool)
            _key_columns(others, spec).fill_(False)
            mine, theirs = mine[others], theirs[others]
        errors[f"param:{name}"] = rel_err(mine, theirs)
    return errors, key_diff


def _cp_case(rank: int, text: str, family: str, recompute: str) -> dict[str, Any]:
    from paracube.executor import Mesh, build_model, serial_reference, train_step
    from paracube.executor.data_parallel.optim import build_optimizer
    from paracube.modes.buckets import BUCKET_BYTES

    layout = parse_layout(text)
    spec = FAMILY[family]
    if rank >= layout.world_size:
        Mesh(layout, 0)  # the same new_group calls as the case's ranks
        return {}
    mesh = Mesh(layout, rank)
    batches = _batches(layout.dp)
    micro, every = batches[mesh.coord("dp")], [m for r in batches for m in r]
    tokens = layout.dp * B * N_MICRO * spec.seq_len
    model = build_model(spec, mesh, seed=5, recompute=recompute, dtype=torch.float64)
    ref = serial_reference(spec, seed=5, dtype=torch.float64, vocab=model.vocab)
    opt = build_optimizer(model, mesh, layout.zero, BUCKET_BYTES, **ADAMW)
    ref_opt = build_optimizer(ref, ref.mesh, 0, BUCKET_BYTES, **ADAMW)
    errors, key_diff = compare_with_serial(spec, mesh, model, ref, (opt, ref_opt), (micro, every), tokens)
    # One fp32 step: its collectives against the cost model's list (fp32: the dtype the declaration prices).
    mesh.recorder.reset()
    model32 = build_model(spec, mesh, seed=5, recompute=recompute)
    train_step(model32, build_optimizer(model32, mesh, layout.zero, BUCKET_BYTES, **ADAMW), mesh, micro, tokens,
               MAX_NORM)
    stage = mesh.coord("pp")
    events = [e.key() for e in mesh.recorder.events]
    cp_events = sum(1 for e in mesh.recorder.events if e.axes == ("cp",))
    saved = saved_bytes(model32, *micro[0])[1] if layout.pp == 1 else 0  # activation memory (fp32, priced dtype)
    return {"errors": errors, "key_diff": key_diff, "events": events, "cp_events": cp_events, "activations": saved,
            "stage": "first" if stage == 0 else ("last" if stage == layout.pp - 1 else "middle")}


def _cases(rank: int, world: int, cases: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    return [_cp_case(rank, *case) for case in cases]


@pytest.fixture(scope="module")
def executed() -> dict[str, list[list[dict[str, Any]]]]:
    return {"4": run_distributed(_cases, 4, CASES_4, timeout=900.0),
            "8": run_distributed(_cases, 8, CASES_8, timeout=900.0)}  # [rank][case]


@pytest.mark.parametrize("case", [("4", i) for i in range(len(CASES_4))] + [("8", i) for i in range(len(CASES_8))],
                         ids=[c[0] for c in CASES_4] + [c[0] for c in CASES_8])
def test_cp_matches_serial_and_the_cost_model(executed, case: tuple[str, int]) -> None:
    """Losses, grad norms, the first step's gradients and every parameter after 3 AdamW steps equal the serial
    model's (fp64, TOL_FP64); the collectives of an fp32 step equal traffic.stage_events (zero difference).
    The key bias (GPT's qkv bias, key columns) is bounded apart: its serial gradient is 0 in exact arithmetic
    (softmax ignores q.b_k added to a whole row), but a cp rank's share, the sum over ITS keys only, is not: the
    fp32 buckets sum cp nonzero shares back to ~1e-7-relative noise, which AdamW's g / (|g| + eps) turns into steps
    of up to lr x (1 - b1) / sqrt(1 - b2) = 3.17 lr (Kingma & Ba 2015, section 2.1) on either copy. So the key
    columns differ by at most 2 x STEPS x 3.17 lr, while a wrong exchange changes every parameter by O(1)."""
    world, i = case
    text, family, rc = (CASES_4 if world == "4" else CASES_8)[i]
    from paracube.cost_models.dims import with_options
    from paracube.runtimes import RUNTIMES

    spec = FAMILY[family]
    layout = parse_layout(text).with_(micro_batch=B)
    # priced as the paracube runtime runs it (Runtime.cp_core_recompute False: under cp its core is kept, not re-run)
    options = RUNTIMES["paracube"].engine_options()
    d = with_options(dims_of(spec, TrainingSpec(global_batch=layout.dp * B * N_MICRO, dtype="fp32", recompute=rc)),
                     options)
    for rank in range(layout.world_size):
        r = executed[world][rank][i]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL_FP64}
        assert not bad, f"{text} rank {rank}: relative errors above {TOL_FP64}: {bad}"
        assert r["key_diff"] <= 2 * STEPS * 3.17 * LR, r["key_diff"]
        assert r["cp_events"] > 0
        diff = traffic_difference(stage_events(layout, d, B, r["stage"]), r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (text, rank, diff)
    # memory: the activations autograd saves on the most loaded rank equal the model's (rel 2%, as
    # tests/test_token_split.py); not under rcm=mla_up_proj, whose q, k, v saved_bytes sees before they are discarded
    if layout.pp == 1 and layout.recompute_modules is None:
        from paracube.cost_models import estimate
        from paracube.topologies import load_topology

        train = TrainingSpec(global_batch=layout.dp * B * N_MICRO, dtype="fp32", recompute=rc)
        est = estimate(spec, train, layout, load_topology("local-cpu", gpus=layout.world_size), with_events=False,
                       options=options)
        measured = max(executed[world][rank][i]["activations"] for rank in range(layout.world_size))
        assert measured == pytest.approx(est.memory.activations, rel=0.02), (text, measured, est.memory.activations)


@pytest.mark.parametrize("tile", [None, 1, 64])
def test_blockwise_attention_with_online_softmax_equals_sdpa(tile: int | None) -> None:
    """One process: the cp = 4 ring's blocks (each rank's load-balanced chunks against every rank's keys, merged by
    log-sum-exp) and their backward (dQ, dK, dV summed over blocks) equal torch's causal SDPA and its autograd,
    with grouped-query attention (2 query heads per kv head). fp64: the two sum the same terms in other orders,
    so they agree to ~1e-15; 1e-12 leaves that margin, a wrong mask or merge is off by O(1). `tile`: the blocks by
    query tiles of one row and of two (64 scores: b 2 x 4 heads x 4 keys a row), as long sequences run them
    (context_parallel.TILE_ELEMENTS); None: the default, one tile at this size."""
    from paracube.executor.layers.attention_blocks import TILE_ELEMENTS, block_backward, block_forward, merge
    from paracube.executor.layers.context_parallel import chunk_positions
    from paracube.executor.layers.kv_heads import expand as _expand
    from paracube.executor.layers.kv_heads import fold as _fold

    torch.manual_seed(0)
    b, heads, kv_heads, s, d, cp = 2, 4, 2, 16, 8, 4
    group = heads // kv_heads
    q, k, v = (torch.randn(b, n, s, d, dtype=torch.float64, requires_grad=True) for n in (heads, kv_heads, kv_heads))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    pos = [chunk_positions(s, cp, i) for i in range(cp)]
    assert sorted(torch.cat(pos).tolist()) == list(range(s))  # every token on exactly one rank
    out, dq, dk, dv = torch.zeros_like(ref), torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for i in range(cp):
        qi, acc, lse = q.detach()[:, :, pos[i]], None, None
        for step in range(cp):  # the ring's order: own block first
            j = (i - step) % cp
            kj, vj = _expand(k.detach()[:, :, pos[j]], group), _expand(v.detach()[:, :, pos[j]], group)
            o, lj = block_forward(qi, kj, vj, pos[i][:, None] >= pos[j][None, :], tile or TILE_ELEMENTS)
            acc, lse = (o, lj) if acc is None else merge(acc, lse, o, lj)
        out[:, :, pos[i]] = acc
        doi = dout[:, :, pos[i]]
        delta = (doi * acc).sum(-1, keepdim=True)
        for j in range(cp):
            a, bk, bv = block_backward(qi, _expand(k.detach()[:, :, pos[j]], group),
                                       _expand(v.detach()[:, :, pos[j]], group), pos[i][:, None] >= pos[j][None, :],
                                       doi, lse, delta, tile or TILE_ELEMENTS)
            dq[:, :, pos[i]] += a
            dk[:, :, pos[j]] += _fold(bk, group)
            dv[:, :, pos[j]] += _fold(bv, group)
    for got, want in ((out, ref), (dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert rel_err(got, want) < 1e-12


@pytest.mark.parametrize(("d_k", "d_v"), [(8, 8), (12, 8), (8, 12)])
def test_causal_spans_equal_sdpa(d_k: int, d_v: int) -> None:
    """One process, cp = 4: each rank's causal spans (attention_blocks.causal_span: the own block causal, an
    earlier rank's early chunk and a later rank's keys for the late chunk's queries, whole; the rest never
    computed) through the kernel the executor runs on this device (CPU: torch's fused flash kernel, widths
    d_k != d_v as MLA's zero-padded), merged by log-sum-exp into the rows they cover, equal torch's causal SDPA and
    its autograd, GQA included; and the spans cover exactly the causal pairs. fp64, 1e-12 as above."""
    from paracube.executor.layers.attention_blocks import causal_span, merge, span_backward, span_forward
    from paracube.executor.layers.context_parallel import chunk_positions
    from paracube.executor.layers.kv_heads import expand as _expand
    from paracube.executor.layers.kv_heads import fold as _fold

    torch.manual_seed(1)
    b, heads, kv_heads, s, cp = 2, 4, 2, 32, 4
    group, n = heads // kv_heads, s // cp
    q = torch.randn(b, heads, s, d_k, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, kv_heads, s, d_k, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, kv_heads, s, d_v, dtype=torch.float64, requires_grad=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dout = torch.randn_like(ref)
    ref.backward(dout)
    pos = [chunk_positions(s, cp, i) for i in range(cp)]
    out, dq, dk, dv = torch.zeros_like(ref), torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    kv = [(_expand(k.detach()[:, :, p], group), _expand(v.detach()[:, :, p], group)) for p in pos]
    for i in range(cp):
        qi, acc, lse, covered = q.detach()[:, :, pos[i]], None, None, torch.zeros(n, s, dtype=torch.bool)
        for step in range(cp):
            j = (i - step) % cp
            rows, cols, causal = causal_span(cp, i, j, n)
            o, lj = span_forward(qi[..., rows, :], kv[j][0][..., cols, :], kv[j][1][..., cols, :], causal)
            if acc is None:
                acc, lse = o, lj
            else:
                acc[..., rows, :], lse[..., rows, :] = merge(acc[..., rows, :], lse[..., rows, :], o, lj)
            block = torch.ones(n, n, dtype=torch.bool).tril() if causal else torch.ones(n, n, dtype=torch.bool)
            covered[rows, pos[j][cols]] = block[: rows.stop - rows.start, : cols.stop - cols.start]
        assert torch.equal(covered, pos[i][:, None] >= torch.arange(s)[None, :])  # exactly the causal pairs
        out[:, :, pos[i]] = acc
        doi = dout[:, :, pos[i]]
        delta = (doi * acc).sum(-1, keepdim=True)
        for j in range(cp):
            rows, cols, causal = causal_span(cp, i, j, n)
            a, bk, bv = span_backward(qi[..., rows, :], kv[j][0][..., cols, :], kv[j][1][..., cols, :], causal,
                                      doi[..., rows, :], acc[..., rows, :], lse[..., rows, :], delta[..., rows, :])
            dq[:, :, pos[i][rows]] += a
            dk[:, :, pos[j][cols]] += _fold(bk, group)
            dv[:, :, pos[j][cols]] += _fold(bv, group)
    for got, want in ((out, ref), (dq, q.grad), (dk, k.grad), (dv, v.grad)):
        assert rel_err(got, want) < 1e-12


def test_chunks_balance_the_causal_work() -> None:
    """cp rank i holds chunks i and 2 cp - 1 - i: every rank's queries see the same number of causal keys."""
    from paracube.executor.layers.context_parallel import chunk_positions

    s, cp = 64, 4
    work = [int((chunk_positions(s, cp, i) + 1).sum()) for i in range(cp)]
    assert len(set(work)) == 1 and sum(work) == s * (s + 1) // 2
    assert chunk_positions(s, cp, 1).tolist() == [*range(8, 16), *range(48, 56)]


@pytest.mark.parametrize("text,spec,why", [
    ("dp=1,cp=3", SPEC, "seq_len=16 does not split into 2 x cp = 6 chunks"),
    ("dp=1,cp=2,fa=0", SPEC, "fa=0 with cp=2"),
    ("dp=1,cp=2", replace(SPEC, attention_dropout=0.1), "attention_dropout=0.1 with cp=2"),
    # 12 tokens split over tp=4 (sp without cp runs), but a cp rank's 6 do not
    ("dp=1,cp=2,tp=1d:4,sp", replace(SPEC, seq_len=12), "seq_len / cp (sequence parallelism)=6 is not divisible by 4"),
])
def test_cp_bad_input_is_refused_before_any_rank_starts(text: str, spec: ModelSpec, why: str) -> None:
    from paracube.executor import check_divisibility

    with pytest.raises(ParacubeError) as err:
        check_divisibility(spec, parse_layout(text), B, 4 * B, spec.seq_len)
    assert why in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_cp_with_a_token_split_mode_is_refused_in_a_plan_file(tmp_path) -> None:
    """A plan file asking cp with 2D (its tokens already split: Layout refuses it) fails to load in one line."""
    import json

    from paracube.plan import default_plan, load_plan

    data = default_plan("dp=1,cp=2,mb=2").to_dict()
    data["layout"] = "dp=1,cp=2,tp=2d:2x2,mb=2"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ParacubeError) as err:
        load_plan(path)
    msg = str(err.value)
    assert "cp=2" in msg and "2d" in msg and "\n" not in msg, msg
