"""Selective recomputation by module (`rcm=`, paracube/recompute_modules.py) as the executor runs it
(executor/layers/discard.py, model/blocks.py, model/moe.py, layers/mla.py).

One 8-rank launch (~6 CPU-s per rank, ~50 in all, on a 2-core VM). Per case (a model, a layout: dense blocks in
tensor modes none (pp=2, zero=3), 1D (+ sp, pp=2, zero=1; + sp and tpo, the collective matmul's rings), 2D, 2.5D,
3D; MoE blocks in none (pp=2) and 1D (+ sp,
ep folded over tp, zero=1); MLA + MoE in 1D + sp), the layout runs 2 AdamW steps (pp micro-batches per replica)
without `rcm=` and then once per module with `rcm=MODULE`:
- against the serial reference (every step's loss and gradient norm, every parameter block after the steps): rel
  1e-5, both copies in fp64 (dist_helpers.TOL_FP64 says why);
- against the same layout without the module: bit for bit (losses, gradient norms, every parameter). A recomputation
  runs the same ops on the same inputs in the same order (CPU kernels and gloo's sums are deterministic), so it must
  not change a single value;
- the collectives of step 0 are the run's without the module (a multiset of kind, axes, bytes, dtype, label,
  phase) plus, in phase "recompute", what the module re-runs. Discard modules (layernorm, moe_act, mla_up_proj)
  re-run their module alone: no collective where the module has none (every norm but 2D / 2.5D / 3D's, which split
  the hidden dimension, all-reduce a statistic per token and gather gamma and beta: those appear again); core_attn
  none (the keys' and values' gathers sit outside its region); region modules (mlp, shared_experts, moe) re-run
  their forward collectives up to their last saved tensor (torch.utils.checkpoint's early stop: the last linear's
  output reduce / scatter and bias gather after its GEMM are not repeated, AFTER_LAST_SAVED; with tpo, 1D + sp's
  output reduce-scatter is a ring inside fc2's own autograd Function, collective_matmul.RingLinearScatter, whose
  inputs are saved when it returns: repeated). Asserted exactly: the added events are the forward events issued
  inside the recomputed modules (forward hooks) less AFTER_LAST_SAVED (with tpo less the bias gathers only).
  `moe`: every dispatch / combine all_to_all appears twice as many times, the recomputed ones with the forward's
  split sizes.
- against the cost model: every collective of step 0 on every rank, a multiset of (kind, axes, bytes, dtype,
  phase), equals traffic.stage_events / moe_traffic.moe_stage_events for the layout with the module (and without):
  zero difference, the "recompute" events included (`model_events`; fp64 statistics and three phase names mapped,
  `_as_recorded`, `_recorded`).
Memory (in process, serial): the bytes of the distinct storages a model keeps for backward at the end of one
forward (counted with torch.autograd.graph.saved_tensors_hooks, measured after the forward: a discarded storage is
then empty), with and without each module, per block; the drop equals the closed form of saved_drop (its docstring)
and the cost model's count (`model_drop`: block_acts / moe_rcm_saved) plus the exact differences `known_gap` states.
Refusals, in one line before any rank starts: a module that applies to no block of the model, rcm= with rc=full,
off=N next to modules other than core_attn; `paracube run PLAN --model M` keeps the rcm= modules that apply to M.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
import torch
from dist_helpers import F64, TOL_FP64, rel_err, run_distributed
from test_equivalence_model import MAX_NORM

from paracube.cost_models.dims import dims_of, with_pins
from paracube.cost_models.moe_traffic import moe_stage_events, with_routing
from paracube.cost_models.recompute_modules_cost import dense_modules
from paracube.cost_models.traffic import stage_events
from paracube.errors import ParacubeError
from paracube.estimate import CommEvent
from paracube.executor import Mesh, build_model, serial_reference, train_step
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.executor.model.moe import MoEMLP, moe_blocks
from paracube.executor.sizes import check_recompute_modules
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.buckets import BUCKET_BYTES
from paracube.workload import ModelSpec, TrainingSpec

DENSE = ModelSpec("rcm-dense", layers=2, hidden=32, heads=8, ffn_hidden=128, vocab=100, seq_len=16)
MOE = replace(PRESETS["tiny-moe"], seq_len=16)
MLA = replace(PRESETS["tiny-mla"], seq_len=16)  # block 0 dense (mlp applies), block 1 MoE; every block MLA
SPECS = {"dense": DENSE, "moe": MOE, "mla": MLA}
ADAMW = {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}  # dist_helpers.fp64_optimizer's settings
MB, STEPS = 2, 2  # sequences per micro-batch, steps; a replica runs pp micro-batches a step (the pipeline fills)
DENSE_MODULES = ("layernorm", "mlp")
# (model, layout, modules): 8 ranks each. core_attn (the executor's selective before rcm=) once, given as rcm=: its
# run in every mode is tests/test_sp_recompute.py's
CASES = [
    ("dense", "dp=4,pp=2,zero=3", DENSE_MODULES),  # zero=3: the recomputed norms read gathered parameters
    ("dense", "dp=2,pp=2,tp=1d:2,sp,zero=1", ("core_attn", *DENSE_MODULES)),
    ("dense", "dp=2,tp=1d:4,sp,tpo,zero=1", DENSE_MODULES),  # tpo: mlp re-runs fc's and fc2's rings
    ("dense", "dp=2,tp=2d:2x2", DENSE_MODULES),
    ("dense", "tp=2.5d:2x2x2", DENSE_MODULES),
    ("dense", "tp=3d:2x2x2", DENSE_MODULES),
    ("moe", "dp=4,pp=2,ep=2", ("moe_act", "shared_experts", "moe")),
    ("moe", "dp=4,ep=2,tp=1d:2,sp,zero=1", ("layernorm", "moe_act", "shared_experts", "moe")),
    ("mla", "dp=4,ep=2,tp=1d:2,sp", ("mla_up_proj", "mlp")),
]
IDS = [f"{c[0]}-{c[1]}" for c in CASES]


def _micro_batches(spec: ModelSpec, n: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The step's n micro-batches (replica r takes a contiguous run of them)."""
    gen = torch.Generator().manual_seed(11)
    return [(torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen),
             torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen)) for _ in range(n)]


_SERIAL: dict[tuple[str, int, int], tuple[list[tuple[float, float]], dict[str, torch.Tensor]]] = {}


def _serial(spec: ModelSpec, vocab: int, n: int) -> tuple[list[tuple[float, float]], dict[str, torch.Tensor]]:
    """(loss, grad norm) of each step and the parameters after them, of the serial model (no recomputation) on the
    step's n micro-batches, padded as the model it checks."""
    if (spec.name, vocab, n) not in _SERIAL:
        ref = serial_reference(spec, seed=5, vocab=vocab, dtype=F64)
        opt = build_optimizer(ref, ref.mesh, 0, BUCKET_BYTES, **ADAMW)
        steps = [train_step(ref, opt, ref.mesh, _micro_batches(spec, n), n * MB * spec.seq_len, MAX_NORM)
                 for _ in range(STEPS)]
        _SERIAL[spec.name, vocab, n] = ([(r.loss, r.grad_norm) for r in steps],
                                        {name: p.detach() for name, p in ref.named_parameters()})
    return _SERIAL[spec.name, vocab, n]


def _recomputed_modules(model: torch.nn.Module, module: str) -> list[torch.nn.Module]:
    """The torch modules whose forward `module` runs again (none for core_attn, moe_act, mla_up_proj: no collective
    inside them)."""
    blocks = list(model.blocks)
    if module == "layernorm":
        return [n for b in blocks for n in (b.ln1, b.ln2)]
    if module == "mlp":
        return [b.mlp for b in blocks if not isinstance(b.mlp, MoEMLP)]
    if module == "moe":
        return list(moe_blocks(model))
    if module == "shared_experts":
        return [m for b in moe_blocks(model) for m in (b.shared.fc, b.shared.fc2)]
    return []


def _inside(model: torch.nn.Module, module: str) -> list[int]:
    """Indices (into the recorder's events, filled as step 0 runs) of the forward collectives issued inside the
    modules `module` recomputes: forward hooks on them, phase fwd only (the recompute calls them again)."""
    rec, inside, start = model.mesh.recorder, [], [0]

    def pre(*_: Any) -> None:
        start[0] = len(rec.events)

    def post(*_: Any) -> None:
        if rec.current_phase != "bwd":
            inside.extend(range(start[0], len(rec.events)))

    for m in _recomputed_modules(model, module):
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post)
    return inside


def _run(rank: int, spec: ModelSpec, layout: Layout) -> dict[str, Any]:
    mesh = Mesh(layout, rank)
    n, total = layout.pp, layout.pp * layout.dp
    micro = _micro_batches(spec, total)[mesh.coord("dp") * n:(mesh.coord("dp") + 1) * n]
    model = build_model(spec, mesh, seed=5, dtype=F64)
    inside = _inside(model, layout.recompute_modules[0]) if layout.recompute_modules else []
    opt = build_optimizer(model, mesh, layout.zero, BUCKET_BYTES, **ADAMW)
    out: dict[str, Any] = {"steps": []}
    for step in range(STEPS):
        mesh.recorder.reset()
        res = train_step(model, opt, mesh, micro, total * MB * spec.seq_len, MAX_NORM)
        out["steps"].append((res.loss, res.grad_norm))
        if step == 0:
            rec = mesh.recorder
            out["events"] = [(*e.key(), e.label, e.phase) for e in rec.events]
            out["splits"] = {s.event: (s.sent, s.received) for s in rec.splits}
            out["inside"] = [i for i in inside if out["events"][i][5] == "fwd"]
            out["stage"] = mesh.coord("pp")
    if hasattr(opt, "wait_params"):
        opt.wait_params()
    if getattr(opt, "units", None) is not None:  # zero=3: the parameters whole again (resharded after backward)
        opt.units.gather_all()
    out["params"] = {name: p.detach().clone() for name, p in model.named_parameters()}
    ref_steps, ref_params = _serial(spec, model.vocab, total)
    errors = {}
    for step, ((loss, norm), (ref_loss, ref_norm)) in enumerate(zip(out["steps"], ref_steps, strict=True)):
        errors[f"step{step}.loss"] = abs(loss - ref_loss) / ref_loss
        errors[f"step{step}.grad_norm"] = abs(norm - ref_norm) / ref_norm
    for name, p in out["params"].items():
        errors[f"param:{name}"] = rel_err(p, model.block_of(name, ref_params[name]))
    out["errors"] = errors
    return out


def _one_case(rank: int, model_name: str, layout_text: str, modules: tuple[str, ...]) -> dict[str, Any]:
    spec, layout = SPECS[model_name], parse_layout(layout_text)
    base = _run(rank, spec, layout)
    result: dict[str, Any] = {"base_errors": base["errors"], "modules": {}}
    for m in modules:
        got = _run(rank, spec, layout.with_(recompute_modules=(m,)))
        same = got["steps"] == base["steps"] and all(torch.equal(p, base["params"][k])
                                                     for k, p in got["params"].items())
        result["modules"][m] = {"errors": got["errors"], "bitwise": same, "events": got["events"],
                                "splits": got["splits"], "inside": got["inside"]}
    result["base_events"], result["base_splits"], result["stage"] = base["events"], base["splits"], base["stage"]
    return result


def _all_cases(rank: int, world: int) -> list[dict[str, Any]]:
    return [_one_case(rank, *case) for case in CASES]


@pytest.fixture(scope="module")
def results() -> list[list[dict[str, Any]]]:
    return run_distributed(_all_cases, 8, timeout=600.0)  # [rank][case]


def _case_modules() -> list[tuple[int, str]]:
    return [(c, m) for c, case in enumerate(CASES) for m in case[2]]


MODULE_IDS = [f"{IDS[c]}-{m}" for c, m in _case_modules()]
AFTER_LAST_SAVED = ("fc2.out", "fc2.g", "fc2.b")  # a region's last linear: its output's reduce, its bias's gather
TPO_RINGS = ("fc2.out",)  # of those, run as a ring inside fc2's autograd Function with tpo (1D + sp): repeated
SPLIT_NORMS = ("2d", "2.5d", "3d")  # modes whose norms split the hidden dimension (statistics all-reduced)


@pytest.mark.parametrize("case, module", _case_modules(), ids=MODULE_IDS)
def test_with_a_module_the_run_equals_the_serial_model_and_the_run_without_it_bit_for_bit(results, case: int,
                                                                                            module: str) -> None:
    for rank, per_case in enumerate(results):
        r = per_case[case]
        bad = {k: v for k, v in r["base_errors"].items() if not v < TOL_FP64}
        assert not bad, (rank, bad)
        got = r["modules"][module]
        bad = {k: v for k, v in got["errors"].items() if not v < TOL_FP64}
        assert not bad, (rank, bad)
        assert got["bitwise"], f"rank {rank}: rcm={module} changed a loss, a gradient norm or a parameter"


@pytest.mark.parametrize("case, module", _case_modules(), ids=MODULE_IDS)
def test_a_module_adds_only_its_own_forward_collectives_again(results, case: int, module: str) -> None:
    """The step's collectives are the run's without the module (a multiset of kind, axes, bytes, dtype, label,
    phase) plus, in phase "recompute", those the recomputed modules issued in forward (forward hooks), less those
    after the region's last saved tensor. (zero=3's backward gathers are forward collectives issued in backward:
    phase "recompute" with or without a module.)"""
    layout = parse_layout(CASES[case][1])
    mode = layout.mode
    after = tuple(a for a in AFTER_LAST_SAVED if not (layout.tpo and a in TPO_RINGS))
    for rank, per_case in enumerate(results):
        r, got = per_case[case], per_case[case]["modules"][module]
        events, base = Counter(got["events"]), Counter(r["base_events"])
        assert not base - events, (rank, base - events)
        added = events - base
        assert all(e[5] == "recompute" for e in added), (rank, added)
        again = Counter(e[:5] for e in added.elements())
        inside = Counter(got["events"][i][:5] for i in got["inside"] if got["events"][i][4] not in after)
        assert again == inside, (rank, again, inside)
        if layout.tpo and module == "mlp":  # the output's ring among them (TPO_RINGS)
            assert any(e[4] in TPO_RINGS for e in again), (rank, again)
        if module in ("core_attn", "moe_act", "mla_up_proj") or (module == "layernorm" and mode not in SPLIT_NORMS):
            assert not again, (rank, again)  # nothing communicated inside what they re-run
        if module in ("mlp", "moe") or (module == "layernorm" and mode in SPLIT_NORMS):
            assert again or (module == "mlp" and mode == "none"), rank  # something to check: not vacuous


def model_events(spec: ModelSpec, layout: Layout, stage: int, recorded: list[tuple]) -> list[CommEvent]:
    """The cost model's list of one step on a rank of pipeline stage `stage` (traffic.stage_events; with MoE blocks
    moe_traffic.moe_stage_events, the dense engines' modules stripped as analytic.prepare does), fp64 copies, the
    dispatch / combine payloads those of the routing the run took (its forward all_to_alls in issue order: the
    splits are checked against the run without the module above, test_moe_runs_every_dispatch...)."""
    total = layout.pp * layout.dp
    train = TrainingSpec(global_batch=total * MB, dtype="fp32",
                         recompute="selective" if layout.recompute_modules else "none")
    d = replace(with_pins(dims_of(spec, train), layout), c=8, dtype="float64")
    if spec.moe is not None and d.recompute_modules is not None:
        d = replace(d, recompute_modules=dense_modules(d, True))
    name = "first" if stage == 0 else "last"
    layout = layout.with_(micro_batch=MB)
    if spec.moe is None:
        return stage_events(layout, d, MB, name)
    a2a = [e for e in recorded if e[5] == "fwd" and e[4] in ("moe.dispatch", "moe.combine")]
    assert [e[4] for e in a2a] == ["moe.dispatch", "moe.combine"] * (len(a2a) // 2)
    return with_routing(moe_stage_events(layout, d, spec.moe, MB, name),
                        [(a2a[i][2], a2a[i + 1][2]) for i in range(0, len(a2a), 2)])


def _as_recorded(e: CommEvent) -> tuple:
    """A model event as this fp64 run records it: the fp32 statistics (a norm's, 2D / 2.5D / 3D; the vocab-parallel
    loss's max and sum) computed in fp64 (layers/functional.upcast: twice the bytes), as tests/test_moe_run.py."""
    if e.label.endswith((".stats", "loss.max", "loss.sum")) and e.dtype == "float32":
        e = replace(e, payload_bytes=2 * e.payload_bytes, dtype="float64")
    return (e.kind, e.axes, e.payload_bytes, e.dtype, e.phase)


def _recorded(e: tuple, zero: int) -> tuple:
    """A recorded event (kind, axes, bytes, dtype, label, phase) under the model's phase names where the two name
    a phase differently outside any recomputation: zero=2/3's backward unit gathers (the recorder: forward collectives
    issued in backward, "recompute"; traffic._zero_micro_batch: "bwd") and unit reduce-scatters ("grad_sync" /
    "bwd")."""
    kind, axes, size, dtype, label, phase = e
    if zero >= 2 and (label, phase) in (("params", "recompute"), ("grads", "grad_sync")):
        phase = "bwd"
    return (kind, axes, size, dtype, phase)


@pytest.mark.parametrize("case, module", [(c, None) for c in range(len(CASES))] + _case_modules(),
                         ids=[f"{i}-without" for i in IDS] + MODULE_IDS)
def test_the_steps_collectives_equal_the_cost_models(results, case: int, module: str | None) -> None:
    """Every collective of step 0 on every rank, a multiset of (kind, axes, bytes, dtype, phase), equals the cost
    model's list for the layout with the module (without it: module None): zero difference, the phase "recompute"
    events (what the module issues again) included. Labels are not compared: the executor names a collective by its
    linear (fc.in), the model by its block half (layers.0.mlp.in); the test above checks the executor's against the
    forward hooks'."""
    model_name, text, _ = CASES[case]
    layout = parse_layout(text).with_(recompute_modules=(module,) if module else None)
    for rank, per_case in enumerate(results):
        r = per_case[case]
        events = r["modules"][module]["events"] if module else r["base_events"]
        want = Counter(map(_as_recorded, model_events(SPECS[model_name], layout, r["stage"], events)))
        got = Counter(_recorded(e, layout.zero) for e in events)
        assert not want - got and not got - want, (rank, "model only", want - got, "executor only", got - want)


@pytest.mark.parametrize("case", [c for c, case in enumerate(CASES) if "moe" in case[2]],
                         ids=[IDS[c] for c, case in enumerate(CASES) if "moe" in case[2]])
def test_moe_runs_every_dispatch_and_combine_twice_with_the_same_splits(results, case: int) -> None:
    for rank, per_case in enumerate(results):
        got = per_case[case]["modules"]["moe"]
        a2a = {p: Counter((e[4], *got["splits"][i]) for i, e in enumerate(got["events"])
                          if e[5] == p and e[4] in ("moe.dispatch", "moe.combine")) for p in ("fwd", "recompute")}
        base = Counter((e[4], *per_case[case]["base_splits"][i]) for i, e in enumerate(per_case[case]["base_events"])
                       if e[5] == "fwd" and e[4] in ("moe.dispatch", "moe.combine"))
        assert a2a["fwd"] == a2a["recompute"] == base and sum(base.values()) > 0, rank


def kept_bytes(model: torch.nn.Module, *inputs: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for backward after one forward of model(*inputs) (parameters
    and the inputs excluded), counted when the forward is over: a discarded output's storage is empty by then."""
    skip = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *inputs)}
    saved: dict[int, Any] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = storage
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(*inputs)
    kept = sum(s.nbytes() for s in saved.values())
    (out[0] if isinstance(out, tuple) else out).sum().backward()  # the recomputations run (and succeed)
    return kept


def _serial_model(spec: ModelSpec, modules: tuple[str, ...] | None) -> Any:
    return build_model(spec, Mesh.single(Layout(recompute_modules=modules)), seed=5, dtype=F64)


def saved_drop(spec: ModelSpec, module: str) -> int:
    """The bytes `module` frees per forward of a serial model of b x s tokens (T = b s, element e = 8: fp64),
    summed over the blocks it applies to:
    - layernorm: per block the two norms' outputs [T, h] and what the norms keep besides their input (LayerNorm:
      mean and rstd [T]; RMSNorm: rstd [T]): their forward runs without a graph, their input is kept anyway;
    - core_attn: the core's logsumexp [b, heads, s] (CPU's flash kernel keeps q, k, v: views of qkv, the region's
      input, and its output, which proj keeps);
    - mlp (dense blocks): the MLP's inner tensors less its input: gpt fc's and gelu's outputs 2 [T, f], llama the
      gate+up output [T, 2 f] and SwiGLU's [T, f];
    - moe_act (MoE blocks): the experts' activation outputs [T k, f_e] (dropless: T k routed copies);
    - shared_experts: the shared experts' gate+up output [T, 2 f_s] and SwiGLU's [T, f_s];
    - mla_up_proj: v [b, heads, s, d_v] and the rotary tables cos, sin [s, d_r]: SDPA's math path (CPU, d_qk != d_v)
      keeps its own scaled copies of q and k, so those are not freed here (a kernel that keeps q, k themselves,
      as Megatron's TE attention does, frees them too);
    - moe: everything the MoE layer keeps less its input, measured by the same count on the layer alone.
    """
    T, h, e = MB * spec.seq_len, spec.hidden, 8
    moe_blocks_n = sum(spec.moe.is_moe_layer(i) for i in range(spec.layers)) if spec.moe else 0
    dense_n = spec.layers - moe_blocks_n
    llama = spec.family == "llama"
    if module == "layernorm":
        return spec.layers * 2 * (T * h + (1 if llama else 2) * T) * e
    if module == "core_attn":
        return spec.layers * MB * spec.heads * spec.seq_len * e
    if module == "mlp":
        return dense_n * (3 if llama else 2) * T * spec.ffn_hidden * e
    if module == "moe_act":
        return moe_blocks_n * T * spec.moe.top_k * spec.moe.expert_ffn * e
    if module == "shared_experts":
        return moe_blocks_n * 3 * T * spec.moe.shared_ffn * e
    if module == "mla_up_proj":
        m = spec.mla
        return spec.layers * (MB * spec.heads * spec.seq_len * m.v_head_dim + 2 * spec.seq_len * m.qk_rope_head_dim) * e
    assert module == "moe"
    layer = next(iter(moe_blocks(_serial_model(spec, None))))
    x = torch.randn(MB, spec.seq_len, h, dtype=F64, requires_grad=True)
    return moe_blocks_n * kept_bytes(layer, x)


MEMORY = [("dense", m) for m in ("core_attn", *DENSE_MODULES)] + [("llama", "layernorm"), ("llama", "mlp")] + [
    ("moe", m) for m in ("layernorm", "moe_act", "shared_experts", "moe")] + [("mla", "mla_up_proj"), ("mla", "mlp")]


def _memory_spec(model_name: str) -> ModelSpec:
    return replace(DENSE, name="rcm-llama", family="llama") if model_name == "llama" else SPECS[model_name]


@functools.cache
def measured_drop(model_name: str, module: str | None) -> int:
    """kept_bytes of the serial model without `module` less with it (module None: without, kept_bytes itself)."""
    spec = _memory_spec(model_name)
    ids = _micro_batches(spec)[0][0]
    without = kept_bytes(_serial_model(spec, None), ids, ids) if module is None else measured_drop(model_name, None)
    return without if module is None else without - kept_bytes(_serial_model(spec, (module,)), ids, ids)


@pytest.mark.parametrize("model_name, module", MEMORY, ids=[f"{a}-{b}" for a, b in MEMORY])
def test_a_module_frees_exactly_what_it_recomputes(model_name: str, module: str) -> None:
    assert measured_drop(model_name, module) == saved_drop(_memory_spec(model_name), module) > 0


def model_drop(spec: ModelSpec, module: str) -> float:
    """The bytes the cost model says `module` frees per forward of the serial model (tp none, one micro-batch of
    MB sequences, fp64 copies: c = 8): the dense engines' (block_acts.saved_block_bytes without and with the module,
    every block; on a model with MoE blocks only DENSE's modules, as analytic.prepare strips them) plus the MoE side's
    (recompute_modules_cost.moe_rcm_saved over every block, its `acts` and R as moe.stage_cost counts them: one rank
    receives all T k copies)."""
    from paracube.cost_models.block_acts import saved_block_bytes
    from paracube.cost_models.recompute_modules_cost import moe_rcm_saved, moe_side
    from paracube.cost_models.validity import layout_arrays

    layout, b = Layout(micro_batch=MB), layout_arrays(Layout(micro_batch=MB), MB)

    def dims(recompute: str, modules: tuple[str, ...] | None) -> Any:
        d = dims_of(spec, TrainingSpec(global_batch=MB, dtype="fp32", recompute=recompute))
        d = replace(with_pins(d, Layout(recompute_modules=modules)) if modules else d, c=8, dtype="float64")
        return replace(d, recompute_modules=dense_modules(d, True)) if spec.moe and modules else d

    d0, d1 = dims("none", None), dims("selective", (module,))
    dense = spec.layers * float((saved_block_bytes(d0, "none", b) - saved_block_bytes(d1, "none", b))[0])
    mods = moe_side(Layout(recompute_modules=(module,)))
    if spec.moe is None or not mods:
        return dense
    moe, T = spec.moe, MB * spec.seq_len
    R = T * moe.top_k * moe.imbalance
    acts = d1.c * (R * spec.hidden + 3 * R * moe.expert_ffn) + 4 * T * moe.experts  # moe.stage_cost's
    return dense + moe_rcm_saved(spec, d1, layout, MB, list(range(spec.layers)), mods, acts, R)


def known_gap(spec: ModelSpec, module: str) -> int:
    """What the executor frees beyond the cost model's count (module docstring of recompute_modules_cost.py; each
    term exact, per block it applies to, e = 8: this run's fp64):
    - core_attn: the logsumexp [b, heads, s] is fp64 here, fp32 in the count (activations.E): 4 b heads s more;
    - layernorm: the norms' statistics (LayerNorm mean and rstd, RMSNorm rstd: Dims.stat_width per token), which
      the norms no longer keep (they run without a graph) and the layernorm term does not subtract yet (the count
      keeps them, activations.py): 2 e stat_width T (its term is adjusted on branch tefuse);
    - mla_up_proj: CPU's SDPA math path keeps its own scaled copies of q and k (d_qk = d_n + d_r a head), which a
      kernel that reads q, k themselves (Megatron's TE attention, the count's) frees: - 2 e T heads d_qk; the rotary
      tables cos, sin [s, d_r], made again with q, k, and not in the count: + 2 e s d_r;
    - moe: the count's MoE layer (moe.stage_cost: the dispatched copies R h, the experts' 3 R f_e, the router's
      fp32 scores T E) is what the executor's layer keeps of [R, *] activations (its experts weight inside the
      activation and the combine keeps only the token index, as Megatron-core's: nothing of the experts' outputs),
      less its routing's bookkeeping: the top-k indices and scores [T, k], their sum [T], the chosen copies' order,
      token index and weight [R], the aux loss's counts [b, E] and scalar: e (2 T k + T + 3 R + b E + 1); its
      router's scores are fp64 here (4 T E more). The difference is the same with and without the module (the count
      of the layer), so the module's share of it is the base count's.
    - mlp, moe_act, shared_experts: none."""
    T, e, b = MB * spec.seq_len, 8, MB
    if module == "core_attn":
        return spec.layers * 4 * b * spec.heads * spec.seq_len
    if module == "layernorm":
        stat_width = 1 if spec.family == "llama" else 2
        return spec.layers * 2 * e * stat_width * T
    if module == "mla_up_proj":
        m = spec.mla
        return spec.layers * (2 * e * spec.seq_len * m.qk_rope_head_dim
                              - 2 * e * T * spec.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim))
    if module == "moe":
        moe = spec.moe
        R, k = T * moe.top_k, moe.top_k
        aux = b * moe.experts + 1 if moe.aux_loss else 0
        per = e * (2 * T * k + T + 3 * R + aux) + 4 * T * moe.experts
        return sum(moe.is_moe_layer(i) for i in range(spec.layers)) * per
    return 0


@pytest.mark.parametrize("model_name, module", MEMORY, ids=[f"{a}-{b}" for a, b in MEMORY])
def test_the_bytes_a_module_frees_equal_the_cost_models_count(model_name: str, module: str) -> None:
    """The measured drop (measured_drop, as above) equals the cost model's (model_drop) plus the known, exact
    differences of `known_gap` (zero for mlp, moe_act, shared_experts)."""
    spec = _memory_spec(model_name)
    measured = measured_drop(model_name, module)
    assert measured - model_drop(spec, module) == known_gap(spec, module), (measured, model_drop(spec, module))


@pytest.mark.parametrize("model_name, modules, message", [
    ("dense", ("moe_act",), "moe_act recomputes the routed experts' activation"),
    ("dense", ("mla_up_proj",), "mla_up_proj recomputes latent attention"),
    ("dense", ("shared_experts",), "valid for it: core_attn, layernorm, mlp"),
    ("moe", ("mlp",), "mlp recomputes a dense block's whole MLP"),
    ("mla", ("core_attn", "shared_experts", "moe"), None),  # applies: MLA + MoE with a shared expert, a dense block
])
def test_a_module_that_recomputes_nothing_is_refused_in_one_line(model_name: str, modules: tuple[str, ...],
                                                                 message: str | None) -> None:
    layout = Layout(recompute_modules=modules)
    if message is None:
        check_recompute_modules(SPECS[model_name], layout, "selective")
        return
    with pytest.raises(ParacubeError) as err:
        check_recompute_modules(SPECS[model_name], layout, "selective")
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ParacubeError, match="rcm="):  # the model refuses it too, before building anything
        build_model(SPECS[model_name], Mesh.single(layout))


def test_rcm_with_full_recomputation_or_offloading_is_refused_in_one_line() -> None:
    for layout, recompute, message in ((Layout(recompute_modules=("layernorm",)), "full", "recompute full"),
                                       (Layout(recompute_modules=("mlp",), offload=1), "selective", "off=1")):
        with pytest.raises(ParacubeError) as err:
            check_recompute_modules(DENSE, layout, recompute)
        assert message in str(err.value) and "\n" not in str(err.value)
    check_recompute_modules(DENSE, Layout(recompute_modules=("core_attn",), offload=1), "selective")


def test_the_module_set_comes_from_the_layout_or_the_default() -> None:
    from paracube.executor.sizes import recomputed_modules

    assert recomputed_modules("selective", Layout()) == frozenset({"core_attn"})
    assert recomputed_modules("none", Layout()) == recomputed_modules("full", Layout()) == frozenset()
    assert recomputed_modules("none", parse_layout("dp=1,rcm=moe_act+layernorm")) == {"layernorm", "moe_act"}
    model = _serial_model(DENSE, ("layernorm", "mlp"))
    assert all(b.discard_norms and b.mlp_region and not b.attn.selective for b in model.blocks)


def test_paracube_run_scales_rcm_down_and_preflight_refuses_what_recomputes_nothing() -> None:
    """`paracube run PLAN --model M --gpus G` (cli/scale_down.py) keeps the plan's rcm= modules that apply to M and
    says which it drops; the preflight (what `paracube run` checks before any rank starts) accepts the scaled plan
    and refuses, in one line, a module the model does not have."""
    from paracube.cli.scale_down import scale_down
    from paracube.executor.launch.start import NodeSpec, preflight
    from paracube.plan import LaunchSpec, Plan
    from paracube.workload import TrainingSpec

    plan = Plan(PRESETS["qwen3-30b-a3b"], TrainingSpec(global_batch=64, dtype="fp32", recompute="selective"),
                parse_layout("dp=8,pp=2,ep=8,tp=none,mb=1,rcm=layernorm+moe_act"), "dgx-h100", 16, LaunchSpec(8, 2))
    moe, notes = scale_down(plan, PRESETS["tiny-moe"], 4)
    assert moe.layout.recompute_modules == ("layernorm", "moe_act") and len(notes) == 1
    dense, notes = scale_down(plan, PRESETS["tiny"], 4)
    assert dense.layout.recompute_modules == ("layernorm",) and "rcm= drops moe_act" in notes[-1]
    for scaled in (moe, dense):
        preflight(scaled, NodeSpec(), data="synthetic", check_devices=False)
    with pytest.raises(ParacubeError) as err:
        preflight(dense.with_layout(dense.layout.with_(recompute_modules=("moe_act",))), NodeSpec(),
                  data="synthetic", check_devices=False)
    assert "moe_act recomputes" in str(err.value) and "\n" not in str(err.value)
