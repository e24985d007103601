"""MoE blocks run by the executor (executor/model/moe.py, executor/layers/experts.py): tiny-moe (top-2 of 8 experts,
one shared) against its serial model, and the all-to-alls' recorded split sizes against the model's; the same for
MLA + MoE in one model (tiny-mla: DeepSeek-V2/V3's shape, block 0 dense, block 1 MoE with sigmoid routing, every
block MLA attention; modes none with pp and 1D + sp with zero=1/2/3, and with cp by ring and by all-gather) and for
Mixtral's shape (no shared expert), and with context parallelism (cp=2 beside dp, pp, 1D + sp, zero=1, ep = 1, 2 or
4 folded over dp x cp x tp: each cp rank routes its load-balanced chunks, the sequence-wise aux loss sums its counts
over cp (x tp), moe_sequence.py).

One 4-rank launch. Per case: losses and gradient norms of 3 AdamW steps and every parameter block after them equal
the serial model's (rel 1e-5, both copies in fp64: dist_helpers.TOL_FP64 says why; routing is chosen on fp64 scores,
whose rounding differences (~1e-16) cannot reorder top-k scores that differ by more, and a different choice would
show as an error of order 1); the aux loss is trained (its gradient is in every parameter's). In step 0 every
dispatch / combine all_to_all's recorded bytes to each peer equal modes/experts.splits of the routing the run took
(every ep rank's copies per expert, logged by the blocks) times h x 8 bytes, and the routing weights' all_to_all
beside the dispatch (moe.dispatch_probs) its copies times 8 bytes (one fp64 weight each, their gradients home in
backward): zero difference, forward and backward. And every collective of step 0 on every rank (counts, aux counts,
buckets, norms, pipeline sends, ...) equals cost_models/moe_traffic's list for the routing taken (a multiset: zero
difference); the zero=1 case shards the dense buckets over dp and the experts' over edp, the zero=2 / zero=3 cases shard
each MoE block's dense parameters over dp and its experts, a unit of their own, over edp (moe_fsdp_traffic.py).
The etp cases (tensor parallelism inside the experts, executor/layers/expert_tensor.py; GPT-OSS's biased experts
among them) list the etp gathers and reduce-scatters with the gathered copies of the routing taken. The same launch
saves etp shards to a checkpoint and loads them into other layouts (every block the serial model's exactly). Plus
the refusals of what the executor does not run, before any rank starts.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from dist_helpers import F64, TOL_FP64, fp64_optimizer, run_distributed
from test_equivalence_model import MAX_NORM, STEPS

from paracube.cost_models.dims import dims_of
from paracube.cost_models.moe_traffic import moe_stage_events, with_routing
from paracube.errors import ParacubeError
from paracube.estimate import CommEvent, traffic_difference
from paracube.executor import Mesh, build_model, check_divisibility, serial_reference, train_step
from paracube.executor.data_parallel.optim import build_optimizer
from paracube.executor.model.moe import moe_blocks, set_routing
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.modes.buckets import BUCKET_BYTES
from paracube.modes.experts import splits
from paracube.modes.stages import stage_chunks
from paracube.workload import ModelSpec, TrainingSpec

SPEC = PRESETS["tiny-moe"]
# DeepSeek-V2/V3's shape: block 0 dense, block 1 MoE (sigmoid routing, one shared expert), every block MLA; the
# sequence-wise aux loss trained (tiny-mla has none) so that the sigmoid scores' normalization is exercised
MLA_MOE = replace(PRESETS["tiny-mla"], moe=replace(PRESETS["tiny-mla"].moe, aux_loss=0.01))
# Mixtral's shape: softmax top-2 of 8, no shared expert, no dense block
MIXTRAL = replace(SPEC, name="tiny-mixtral", moe=replace(SPEC.moe, shared_ffn=0))
# GPT-OSS's experts: biased, clamped SwiGLU (the rest of GPT-OSS: tests/test_gpt_oss_run.py)
OSS_EXPERTS = replace(SPEC, name="tiny-oss-experts", moe=replace(SPEC.moe, expert_bias=True, swiglu_limit=0.1))
# four blocks: room for interleaved pipelines (pp 2 x v 2), which the MoE search now ranks (planner/experts.py)
MOE4 = replace(SPEC, name="tiny-moe-4", layers=4)
# a capacity factor (token drop): each expert keeps ceil(c N k / E) of a forward's N tokens' copies, so a layout that
# keeps every micro-batch's N tokens on one rank (dp, ep, pp; not tp with sp or cp) drops what the serial model drops
CAPPED = replace(SPEC, name="tiny-moe-capped", moe=replace(SPEC.moe, capacity_factor=1.0))
SPECS = {"tiny-moe": SPEC, "mla": MLA_MOE, "mixtral": MIXTRAL, "oss": OSS_EXPERTS, "moe4": MOE4, "capped": CAPPED}
ADAMW = {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-6}  # dist_helpers.fp64_optimizer's settings
MICRO, MB = 4, 2  # micro-batches of the step (split over dp), sequences per micro-batch
CASES = [  # (model, layout, skewed routing, recompute): 4 ranks each
    ("tiny-moe", "dp=4,ep=2", False, "full"),  # ep=2, the experts' gradients reduced over edp = 2; block recomputed
    ("tiny-moe", "dp=4,ep=4", False, "none"),
    ("tiny-moe", "dp=4,ep=4", True, "none"),  # every token to experts 0..2: ranks 2, 3 receive nothing
    ("tiny-moe", "dp=2,ep=2,tp=1d:2,sp", False, "none"),  # ep folded over tp: each tensor rank routes its shard
    ("tiny-moe", "pp=2,dp=2,ep=2", False, "none"),
    ("capped", "dp=4,ep=2", True, "none"),  # skewed over 3 experts at capacity factor 1: most copies dropped
    ("capped", "pp=2,dp=2,ep=2", False, "full"),  # random routing: the busiest experts' excess dropped
    ("moe4", "pp=2,dp=2,ep=2,v=2", False, "none"),  # interleaved 1F1B: each stage's two chunks, one MoE block each
    ("tiny-moe", "dp=2,tp=1d:2,sp", False, "none"),  # ep = 1: every rank holds all experts, reduced over (dp, tp)
    ("tiny-moe", "dp=2,ep=2,tp=1d:2,sp,zero=1", False, "none"),  # dense shards over dp, the experts' over edp
    ("mla", "pp=2,dp=2,ep=2", False, "none"),  # MLA + MoE, mode none: stage 0 the dense block, stage 1 the MoE one
    ("mla", "dp=2,ep=2,tp=1d:2,sp,zero=1", False, "selective"),  # MLA + MoE in 1D + sp, distributed optimizer
    ("mixtral", "dp=2,ep=2,tp=1d:2,sp", False, "none"),  # no shared expert: a MoE block runs no tensor collective
    # context parallelism: each cp rank routes its load-balanced chunks, ep folded over dp x cp (x tp), the aux
    # loss's per-sequence counts summed over the sequence's ranks (moe.aux_counts over cp, or cp x tp with sp)
    ("tiny-moe", "dp=2,cp=2,ep=2", False, "none"),
    ("tiny-moe", "dp=2,cp=2,ep=4", True, "full"),  # skewed, the block recomputed (its cp ring and all_to_alls again)
    ("tiny-moe", "cp=2,ep=2,tp=1d:2,sp,zero=1", False, "none"),  # dense shards over cp, the experts' over edp
    ("tiny-moe", "cp=2,tp=1d:2,sp", False, "none"),  # ep = 1: the experts reduced over (cp, tp)
    ("tiny-moe", "pp=2,cp=2,ep=2", False, "none"),
    ("tiny-moe", "dp=4,ep=2,etp=2", False, "full"),  # etp: each expert's fc1 columns / fc2 rows split 2 ways
    ("tiny-moe", "dp=4,ep=2,etp=2", True, "none"),  # skewed: the etp peers gather uneven blocks (ep 1 gets none)
    ("tiny-moe", "dp=2,ep=2,etp=2,tp=1d:2,sp", False, "none"),  # ep x etp folded over dp x tp
    ("tiny-moe", "dp=4,etp=2,zero=1", False, "none"),  # ep = 1: the etp exchanges alone; experts sharded over edp = 2
    ("oss", "dp=4,ep=2,etp=2,zero=1", False, "none"),  # b2 whole on both etp ranks: counted once in the sharded norm
    ("tiny-moe", "dp=2,cp=2,ep=2,etp=2", False, "none"),  # ep x etp folded over dp x cp
    ("mla", "dp=2,cp=2,ep=2", False, "none"),  # MLA + MoE under cp (mla.py): k, v of their own widths by the ring
    ("mla", "cp=2,cpc=ag,ep=2,tp=1d:2,sp", False, "none"),  # ... and all-gathered, in 1D + sp
    # zero=2 (data_parallel/sharded.py): each MoE block's experts a unit of their own, reduce-scattered over edp
    # (and gathered after the step), its dense parameters a unit over dp (x cp)
    ("tiny-moe", "dp=4,ep=2,zero=2", False, "none"),
    ("tiny-moe", "dp=2,ep=2,tp=1d:2,sp,zero=2", False, "none"),  # ep folded over tp
    ("tiny-moe", "pp=2,dp=2,ep=2,zero=2", False, "none"),  # each stage's units, reduced in the last micro-batch
    ("tiny-moe", "dp=2,cp=2,ep=2,zero=2", False, "none"),
    ("oss", "dp=4,ep=2,etp=2,zero=2", False, "none"),  # etp shards (b2 whole on both etp ranks) over edp = 2
    # zero=3 (fsdp.py): the block's two units gathered (each over its group) before its forward and backward
    ("tiny-moe", "dp=4,ep=2,zero=3", False, "none"),
    ("tiny-moe", "dp=2,ep=2,tp=1d:2,sp,zero=3", False, "none"),
    ("tiny-moe", "pp=2,dp=2,ep=2,zero=3", False, "none"),
    ("tiny-moe", "dp=2,cp=2,ep=2,zero=3", False, "full"),  # the block recomputed inside backward: found gathered
    ("oss", "dp=4,ep=2,etp=2,zero=3", False, "none"),
    ("tiny-moe", "dp=2,tp=1d:2,sp,zero=3", False, "none"),  # ep = 1: the experts' unit over (dp, tp)
    ("mla", "dp=2,ep=2,tp=1d:2,sp,zero=3", False, "selective"),  # MLA's parameters in the dense units
    ("mla", "pp=2,dp=2,ep=2,zero=2", False, "none"),
    # tpo (collective matmul): the attention's and the shared expert's rings; no MLP ring without a shared expert
    ("mixtral", "dp=2,ep=2,tp=1d:2,sp,tpo", False, "selective"),
    ("tiny-moe", "pp=2,ep=2,tp=1d:2,sp,tpo,zero=1", False, "full"),
]
IDS = [f"{c[0]}-{c[1]}{'-skewed' if c[2] else ''}-rc={c[3]}" for c in CASES]


def skewed(block: int, scores: torch.Tensor) -> torch.Tensor:
    """Deterministic uneven routing (the blocks' `route` hook): the top-2 of experts 0..2 only."""
    return scores[:, :3].topk(2, dim=-1).indices


def _micro_batches(spec: ModelSpec = SPEC) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The step's MICRO micro-batches (every layout's global batch: replica r takes a contiguous run of them, so
    the serial reference, which runs them all in order, is the same for every layout of a routing)."""
    gen = torch.Generator().manual_seed(11)
    return [(torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen),
             torch.randint(0, spec.vocab, (MB, spec.seq_len), generator=gen)) for _ in range(MICRO)]


_SERIAL: dict[tuple[str, bool, int], tuple[list[tuple[float, float]], dict[str, torch.Tensor]]] = {}


def _serial(spec: ModelSpec, skew: bool, vocab: int) -> tuple[list[tuple[float, float]], dict[str, torch.Tensor]]:
    """(loss, grad norm) of each step and the parameters after them, of the serial model (once per routing)."""
    if (spec.name, skew, vocab) not in _SERIAL:
        ref = serial_reference(spec, seed=5, vocab=vocab, dtype=F64)
        set_routing(ref, skewed if skew else None)
        opt, tokens = fp64_optimizer(ref), MICRO * MB * spec.seq_len
        steps = [train_step(ref, opt, ref.mesh, _micro_batches(spec), tokens, MAX_NORM) for _ in range(STEPS)]
        params = {n: p.detach() for n, p in ref.named_parameters()}
        _SERIAL[spec.name, skew, vocab] = ([(r.loss, r.grad_norm) for r in steps], params)
    return _SERIAL[spec.name, skew, vocab]


def _one_case(rank: int, model_name: str, layout_text: str, skew: bool, recompute: str) -> dict[str, Any]:
    spec = SPECS[model_name]
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    n = MICRO // layout.dp
    micro = _micro_batches(spec)[mesh.coord("dp") * n:(mesh.coord("dp") + 1) * n]
    tokens = MICRO * MB * spec.seq_len
    model = build_model(spec, mesh, seed=5, recompute=recompute, dtype=F64)
    ref_steps, ref_params = _serial(spec, skew, model.vocab)
    if skew:
        set_routing(model, skewed)
    log: list[torch.Tensor] = []
    for block in moe_blocks(model):
        block.routing_log = log  # one list: the forwards in the order this rank ran them
    opt = build_optimizer(model, mesh, layout.zero, BUCKET_BYTES, **ADAMW)  # fp64_optimizer's, at the layout's zero
    errors: dict[str, float] = {}
    out: dict[str, Any] = {"ep": mesh.index(("ep",)), "edp": mesh.index(("edp",)), "etp": mesh.index(("etp",)),
                           "stage": mesh.coord("pp")}
    for step in range(STEPS):
        mesh.recorder.reset()
        res = train_step(model, opt, mesh, micro, tokens, MAX_NORM)
        ref_loss, ref_norm = ref_steps[step]
        if step == 0:
            rec = mesh.recorder
            events = [(rec.events[s.event], s) for s in rec.splits]
            out["a2a"] = [(e.label, e.phase, e.payload_bytes, s.sent, s.received) for e, s in events
                          if e.label != "moe.counts"]
            out["routing"] = [c.tolist() for c in log]
            out["events"] = [e.key() for e in rec.events]
        for block in moe_blocks(model):
            block.routing_log = None
        errors[f"step{step}.loss"] = abs(res.loss - ref_loss) / ref_loss
        errors[f"step{step}.grad_norm"] = abs(res.grad_norm - ref_norm) / ref_norm
    units = getattr(opt, "units", None)  # zero=3: the parameters live as shards, gathered to compare (fsdp.py)
    with units.gathered() if units is not None else nullcontext():
        for name, p in model.named_parameters():
            expected = model.block_of(name, ref_params[name])
            errors[f"param:{name}"] = ((p - expected).norm() / expected.norm()).item()
    out["errors"] = errors
    return out


def _checkpoint_round_trip(rank: int, root: str) -> dict[str, float]:
    """GPT-OSS-like experts saved from dp=4,ep=2,etp=2 (fc1 column / fc2 row shards, b2 whole on both etp ranks,
    saved by etp index 0) and loaded into dp=4,ep=4 (etp = 1) and dp=2,etp=2,tp=1d:2,sp, and back into the saving
    layout: each parameter block's largest difference from the serial model's (a copy: 0 expected)."""
    from paracube.executor.checkpoint.store import load_checkpoint, save_checkpoint

    spec, saving = OSS_EXPERTS, "dp=4,ep=2,etp=2"
    ref = {n: p.detach() for n, p in serial_reference(spec, seed=5, dtype=F64).named_parameters()}
    model = build_model(spec, Mesh(parse_layout(saving), rank), seed=5, dtype=F64)
    path = save_checkpoint(root, 0, model, torch.optim.AdamW(model.parameters()), {"layout": saving})
    errors = {}
    for text in ("dp=4,ep=4", "dp=2,etp=2,tp=1d:2,sp", saving):
        model = build_model(spec, Mesh(parse_layout(text), rank), seed=1, dtype=F64)  # the load must set every one
        load_checkpoint(path, model, torch.optim.AdamW(model.parameters()))
        for name, p in model.named_parameters():
            errors[f"{text}:{name}"] = (p - model.block_of(name, ref[name])).abs().max().item()
    return errors


def _all_cases(rank: int, world: int, root: str) -> list[Any]:
    return [_one_case(rank, *case) for case in CASES] + [_checkpoint_round_trip(rank, root)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[list[Any]]:
    root = str(tmp_path_factory.mktemp("moe_ckpt"))
    return run_distributed(_all_cases, 4, root, timeout=600.0)  # [rank][case], the round trip's errors last


def test_etp_shards_round_trip_through_a_checkpoint(results) -> None:
    errors = {k: v for per_rank in results for k, v in per_rank[-1].items()}
    assert any(".experts.b2" in k for k in errors) and not {k: v for k, v in errors.items() if v != 0.0}


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_moe_matches_serial(results, case: int) -> None:
    for rank, per_case in enumerate(results):
        bad = {k: v for k, v in per_case[case]["errors"].items() if not v < TOL_FP64}
        assert not bad, f"rank {rank}: {bad}"
    assert any(k.startswith("param:") and ".experts." in k for per_case in results for k in per_case[case]["errors"])
    if CASES[case][0] == "mla":  # every block's attention is MLA's, the MoE block's too
        assert any(".1.attn.kv_b." in k for per_case in results for k in per_case[case]["errors"])


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_all_to_all_bytes_equal_the_models_for_the_routing_taken(results, case: int) -> None:
    spec, layout = SPECS[CASES[case][0]], parse_layout(CASES[case][1])
    row = spec.hidden * 8  # fp64 copies of [h]
    groups: dict[tuple[int, int, int], dict[int, dict[str, Any]]] = {}  # (stage, edp, etp) -> ep index -> result
    for per_case in results:
        r = per_case[case]
        groups.setdefault((r["stage"], r["edp"], r["etp"]), {})[r["ep"]] = r
    if layout.ep == 1:  # no dispatch: every rank runs every expert
        assert not any(per_case[case]["a2a"] for per_case in results)
        return
    checked = 0
    for members in groups.values():
        ep = len(members)
        assert ep == layout.ep
        forwards = len(members[0]["routing"])
        stage = members[0]["stage"]
        moe_layers = sum(spec.moe.is_moe_layer(i) for chunk in stage_chunks(spec.layers, layout.pp, layout.interleave,
                                                                          stage) for i in chunk)  # the stage's
        assert forwards == MICRO // layout.dp * moe_layers
        for f in range(forwards):  # the f-th MoE forward of every ep peer: the same block and micro-batch
            routing = np.array([members[r]["routing"][f] for r in range(ep)])  # [source, expert]
            model = splits(routing, ep) * row  # bytes [source, destination]: the model's for this routing
            probs = splits(routing, ep) * 8  # the copies' fp64 routing weights beside them, one each
            for r in range(ep):
                fwd = [a for a in members[r]["a2a"] if a[1] not in ("bwd", "recompute")]
                dispatch, weights, combine = fwd[3 * f], fwd[3 * f + 1], fwd[3 * f + 2]
                assert (dispatch[0], weights[0], combine[0]) == ("moe.dispatch", "moe.dispatch_probs", "moe.combine")
                assert list(dispatch[3]) == model[r].tolist() and list(dispatch[4]) == model[:, r].tolist()
                assert list(weights[3]) == probs[r].tolist() and list(weights[4]) == probs[:, r].tolist()
                assert list(combine[3]) == model[:, r].tolist() and list(combine[4]) == model[r].tolist()
                assert dispatch[2] == model[r].sum() and combine[2] == model[:, r].sum()
                assert weights[2] == probs[r].sum()
                checked += 1
        for r in range(ep):  # backward: each forward's mirror (dY to the experts, dX and the weights' gradients home)
            rows = [np.array([members[q]["routing"][f] for q in range(ep)]) for f in range(forwards)]
            model = [splits(m, ep) * row for m in rows]
            expected = Counter([("moe.combine", tuple(m[r].tolist())) for m in model]
                               + [("moe.dispatch", tuple(m[:, r].tolist())) for m in model]
                               + [("moe.dispatch_probs", tuple((m[:, r] // row * 8).tolist())) for m in model])
            got = Counter((a[0], tuple(a[3])) for a in members[r]["a2a"] if a[1] == "bwd")
            assert got == expected
            if CASES[case][3] == "full":  # the recomputed forwards send what the forwards sent
                sent = Counter((a[0], tuple(a[3])) for a in members[r]["a2a"] if a[1] == "fwd")
                assert Counter((a[0], tuple(a[3])) for a in members[r]["a2a"] if a[1] == "recompute") == sent
    if CASES[case][2]:  # skewed: ranks holding experts 3.. receive nothing
        assert all(sum(a[4]) == 0 for per_case in results for a in per_case[case]["a2a"]
                   if per_case[case]["ep"] >= 2 and a[0] == "moe.dispatch" and a[1] == "fwd")
    assert checked


def _fp64_statistics(e: CommEvent) -> CommEvent:
    """The vocab-parallel loss's fp32 statistics (modes: loss.max, loss.sum) as an fp64 model computes them
    (layers/functional.upcast: in fp64, twice the bytes)."""
    if e.label.endswith(("loss.max", "loss.sum")) and e.dtype == "float32":
        return replace(e, payload_bytes=2 * e.payload_bytes, dtype="float64")
    return e


@pytest.mark.parametrize("case", range(len(CASES)), ids=IDS)
def test_the_whole_steps_collectives_equal_the_models(results, case: int) -> None:
    """Every collective of step 0 on every rank (a multiset of kind, axes, payload bytes, dtype) equals
    cost_models/moe_traffic's list for the layout, its dispatch / combine bytes those of the routing the run took
    (splits of the ep peers' logged copies, checked per peer above): zero difference."""
    model_name, layout_text, _, recompute = CASES[case]
    spec = SPECS[model_name]
    layout = parse_layout(layout_text).with_(micro_batch=MB)
    d = replace(dims_of(spec, TrainingSpec(global_batch=MICRO * MB, dtype="fp32", recompute=recompute)),
                c=8, dtype="float64")  # the run's fp64 copies
    row = spec.hidden * 8
    peers: dict[tuple[int, int, int], dict[int, dict[str, Any]]] = {}  # (stage, edp, etp) -> ep index -> result
    for per_case in results:
        r = per_case[case]
        peers.setdefault((r["stage"], r["edp"], r["etp"]), {})[r["ep"]] = r

    def received(stage: int, edp: int, etp: int, ep: int, f: int) -> np.ndarray:  # [ep sources, ep destinations]
        members = peers[stage, edp, etp]
        return splits(np.array([members[q]["routing"][f] for q in range(len(members))]), len(members)) * row

    for rank, per_case in enumerate(results):
        r = per_case[case]
        sent = []
        for f in range(len(r["routing"])):
            m = received(r["stage"], r["edp"], r["etp"], r["ep"], f)
            # the etp group's copies of this rank's experts: every etp peer's received ones (modes/experts.block_fwd)
            gathered = sum(int(received(r["stage"], r["edp"], t, r["ep"], f)[:, r["ep"]].sum())
                           for t in range(layout.etp))
            sent.append((int(m[r["ep"]].sum()), int(m[:, r["ep"]].sum()), gathered))
        stage = "first" if r["stage"] == 0 else "last"
        model = [_fp64_statistics(e) for e in with_routing(moe_stage_events(layout, d, spec.moe, MB, stage), sent)]
        diff = traffic_difference(model, r["events"])
        assert not diff["missing_in_executor"] and not diff["unpredicted"], (rank, diff)
        assert any(k[0] == "all_to_all" for k in r["events"]) == (layout.ep > 1 and bool(r["routing"]))
        assert any(k[1] == ("etp",) and k[0] == "reduce_scatter" for k in r["events"]) == (layout.etp > 1)


@pytest.mark.parametrize("layout, message", [
    ("dp=4,ep=3", "ep=3"),
    ("dp=6,ep=6", "8 experts"),
    ("dp=2,ep=2,tp=1d:2", "add sp"),
    ("dp=4,ep=2,zero=2,shard=2", "shard=2"),
    ("dp=4,ep=2,zero=3,shard=2", "shard=2"),
    ("dp=2,ep=2,etp=3", "etp=3"),
    ("dp=2,ep=2,tp=1d:2,sp,tpo,mla", "tpo"),  # MLA with tpo is not built (executor/sizes.check_mla)
])
def test_what_the_executor_does_not_run_is_refused_in_one_line(layout: str, message: str) -> None:
    spec = MLA_MOE if layout.endswith(",mla") else SPEC
    with pytest.raises(ParacubeError) as err:  # the layout's own rule (ep=3) or the executor's (sizes.py)
        check_divisibility(spec, parse_layout(layout.removesuffix(",mla")), None, 0, spec.seq_len)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_dense_model_with_ep_is_refused() -> None:
    with pytest.raises(ParacubeError, match="needs a model with MoE blocks"):
        check_divisibility(PRESETS["tiny"], parse_layout("dp=2,ep=2"), None, 0, 64)


def test_an_moe_plan_scales_down_to_tiny_moe_keeping_expert_parallelism() -> None:
    """`paracube run PLAN --model tiny-moe --gpus G` (cli/scale_down.py): ep stays > 1, the largest dividing the
    experts and the folded ranks, none larger than the plan's; a dense model drops it."""
    from paracube.cli.scale_down import scale_down
    from paracube.plan import LaunchSpec, Plan
    from paracube.workload import TrainingSpec

    plan = Plan(PRESETS["qwen3-30b-a3b"], TrainingSpec(global_batch=64, dtype="bf16"),
                parse_layout("dp=8,pp=2,ep=8,tp=none,mb=1"), "dgx-h100", 16, LaunchSpec(8, 2))
    assert [str(scale_down(plan, SPEC, g)[0].layout) for g in (8, 4)] == [
        "dp=4,pp=2,ep=4,tp=none,mb=1", "dp=2,pp=2,ep=2,tp=none,mb=1"]
    assert scale_down(plan, PRESETS["tiny"], 4)[0].layout.ep == 1
