"""The dispatcher's bytes (cost_models/moe_dispatch.py): DeepEP's one copy per remote node over the NICs and per GPU
over NVLink, under group-limited routing, checked against sampled routings; priced alike by both engines; declared by
the runtimes, read from HF configs, written by the Megatron export."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paracube.cost_models.analytic import estimate
from paracube.cost_models.event import estimate_event
from paracube.cost_models.links import LinkCache
from paracube.cost_models.moe_a2a import A2A, A2A_NIC_EFF
from paracube.cost_models.moe_dispatch import Dispatch, dispatch_of
from paracube.cost_models.moe_links import expert_links
from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.model_presets import PRESETS
from paracube.moe_spec import MoESpec
from paracube.runtimes import get_runtime
from paracube.topologies import load_topology
from paracube.topologies.rates import NDR_IB
from paracube.workload import TrainingSpec

TRAIN = TrainingSpec(global_batch=64, dtype="bf16", recompute="selective")


def sampled(spec: Dispatch, n: int, m: int, tokens: int = 20000, seed: int = 0) -> tuple[float, float]:
    """(NVLink, NIC) copies per token of one rank's tokens, counted on routings drawn as Megatron-core forces balance:
    random normal logits (router.py apply_random_logits), then moe_utils.group_limited_topk (the group_topk groups
    with the best sums of their top k / group_topk scores, the top k experts within them); experts laid out E / n per
    rank in rank order, the sender rank 0 of node 0."""
    rng = np.random.default_rng(seed)
    e, k, g, gk = spec.experts, spec.top_k, spec.groups, spec.group_topk
    scores = rng.standard_normal((tokens, e))
    best = np.sort(scores.reshape(tokens, g, e // g), axis=-1)[:, :, -(k // gk):].sum(-1)
    chosen = np.argsort(-best, axis=1)[:, :gk]
    allowed = np.zeros((tokens, g), dtype=bool)
    np.put_along_axis(allowed, chosen, True, axis=1)
    masked = np.where(np.repeat(allowed, e // g, axis=1), scores, -np.inf)
    top = np.argsort(-masked, axis=1)[:, :k]
    hit = np.zeros((tokens, n), dtype=bool)
    np.put_along_axis(hit, top // (e // n), True, axis=1)
    # NVLink: each hit node's forwarder (its GPU of local index 0, the sender's) to the other hit GPUs of that node
    nvl = hit[:, np.arange(n) % m != 0].sum(axis=1).mean()
    nic = hit.reshape(tokens, n // m, m).any(axis=2)[:, 1:].sum(axis=1).mean()
    return float(nvl), float(nic)


@pytest.mark.parametrize(("spec", "n", "m"), [
    (Dispatch(True, 128, 8), 16, 8),  # Qwen3 over two nodes
    (Dispatch(True, 128, 8), 32, 8),
    (Dispatch(True, 256, 8, 8, 4), 64, 8),  # DeepSeek-V3: groups = nodes, 4 of 8
    (Dispatch(True, 256, 8, 16, 4), 32, 8),  # two groups per node
    (Dispatch(True, 256, 8, 4, 2), 64, 8),  # a group over two nodes
    (Dispatch(True, 64, 6), 8, 8),  # one node: NVLink only
])
def test_factors_match_sampled_routings(spec: Dispatch, n: int, m: int) -> None:
    """f_nvl, f_nic x the alltoall dispatcher's copies (k (m - 1) / n in-node, k (n - m) / n across) equal the copies a
    sampled routing sends (module formula vs counting Megatron-core's rule): the NIC copies within 3%, the NVLink ones
    within 6% (the formula puts k / group_topk experts in each chosen group; Megatron-core's top k may put 3 and 1)."""
    f_nvl, f_nic = spec.factors(n, m)
    k = spec.top_k
    # per rank: as forwarder of its node it sends, for each token of the N same-index senders, what node 0's forwarder
    # sends for one of the sampled sender's tokens on average over the nodes: the sampled count per token
    want_nvl, want_nic = sampled(spec, n, m)
    assert f_nvl * k * (m - 1) / n == pytest.approx(want_nvl, rel=0.06)  # k / group_topk per group: ranks approximate
    if n > m:
        assert f_nic * k * (n - m) / n == pytest.approx(want_nic, rel=0.03)


def test_plain_all_to_all_and_token_drop_keep_every_copy() -> None:
    assert Dispatch().factors(64, 8) == (1.0, 1.0)
    moe = PRESETS["deepseek-v3"].moe
    assert moe is not None
    assert dispatch_of(moe, "alltoall") == Dispatch()
    assert dispatch_of(replace(moe, capacity_factor=1.0), "deepep") == Dispatch()  # Megatron-core: no DeepEP padding
    assert dispatch_of(moe, "deepep") == Dispatch(True, 256, 8, 8, 4)


def test_node_limited_routing_bounds_the_nodes_a_token_reaches() -> None:
    """DeepSeek-V3 on ep=64 over 8 nodes: at most group_topk = 4 nodes per token, so the NIC copies are below the
    unlimited routing's and below 4 x the remote share."""
    limited = Dispatch(True, 256, 8, 8, 4)
    free = Dispatch(True, 256, 8)
    _, lim = limited.factors(64, 8)
    _, unl = free.factors(64, 8)
    assert lim < unl < 1.0
    nic_copies = lim * 8 * 56 / 64
    assert nic_copies <= 4 * 7 / 8 + 1e-9


@pytest.fixture(scope="module")
def h100() -> object:
    return load_topology("dgx-h100", gpus=32)


@pytest.mark.parametrize("ep", [16, 32])
def test_deepep_link_is_the_slower_of_its_nvlink_and_nic_bytes(h100: object, ep: int) -> None:
    """1 / B = max((m - 1) f_nvl / B_nvlink, (n - m) f_nic / B_nic) / (n - 1): moe_a2a's closed form, each flow scaled
    by the dispatcher's bytes."""
    spec = dispatch_of(PRESETS["qwen3-30b-a3b"].moe, "deepep")
    lay = parse_layout(f"dp={ep},ep={ep},tp=none,mb=1")
    bw, _ = expert_links(lay, LinkCache(h100), spec)[A2A + ("ep",)]
    nvlink = load_topology("dgx-h100", gpus=8).group_link(list(range(8))).bandwidth  # type: ignore[attr-defined]
    m = 8
    f_nvl, f_nic = spec.factors(ep, m)
    want = (ep - 1) / max((m - 1) * f_nvl / nvlink, (ep - m) * f_nic / (NDR_IB * A2A_NIC_EFF))
    assert bw == pytest.approx(want, rel=1e-6)
    plain, _ = expert_links(lay, LinkCache(h100))[A2A + ("ep",)]
    assert bw > plain  # fewer bytes over the NICs


@pytest.mark.parametrize("ep", [16, 32])
def test_deepep_call_pays_one_route_latency(h100: object, ep: int) -> None:
    """DeepEP's kernel reaches every peer at once (moe_a2a.py): its n - 1 steps sum to the one route latency that each
    of the plain all_to_all's n - 1 steps pays; the event engine's template carries the analytic link's latency."""
    from paracube.cost_models.event_links import LinkTable
    from paracube.cost_models.moe_a2a import a2a_template

    spec = dispatch_of(PRESETS["qwen3-30b-a3b"].moe, "deepep")
    lay = parse_layout(f"dp={ep},ep={ep},tp=none,mb=1")
    _, lat = expert_links(lay, LinkCache(h100), spec)[A2A + ("ep",)]
    _, plain = expert_links(lay, LinkCache(h100))[A2A + ("ep",)]
    assert lat * (ep - 1) == pytest.approx(plain, rel=1e-12)
    groups = np.asarray(lay.expert_groups("ep"))
    tpl = a2a_template(LinkTable(h100), "t", groups, int(groups[0][0]), 8, spec)  # type: ignore[arg-type]
    assert tpl.alpha == pytest.approx(lat, rel=1e-12)


@pytest.mark.parametrize(("name", "text", "recompute"), [
    ("qwen3-30b-a3b", "dp=32,ep=32,tp=none,mb=1,zero=1", "selective"),
    ("qwen3-30b-a3b", "dp=16,ep=16,tp=none,mb=1,zero=1", "selective"),
    ("qwen3-30b-a3b", "dp=8,pp=2,ep=8,tp=1d:2,sp,mb=1,zero=1", "selective"),
    ("qwen3-30b-a3b", "dp=32,ep=8,tp=none,mb=1,zero=1,overlap", "selective"),
    ("deepseek-v3", "dp=32,ep=32,tp=none,mb=1,zero=1", "full"),
    ("deepseek-v3", "dp=16,pp=2,ep=16,tp=none,mb=1,zero=1", "full"),
])
def test_engines_agree_with_deepep(h100: object, name: str, text: str, recompute: str) -> None:
    model, layout = PRESETS[name], parse_layout(text)
    train = replace(TRAIN, recompute=recompute)
    a = estimate(model, train, layout, h100, with_events=False, moe_dispatch="deepep")
    e = estimate_event(model, train, layout, h100, with_events=False, moe_dispatch="deepep")
    plain = estimate(model, train, layout, h100, with_events=False)
    assert a.step_time_s <= plain.step_time_s  # never more bytes than the plain all_to_all
    assert abs(e.step_time_s / a.step_time_s - 1) < 0.02


def test_runtimes_declare_their_dispatcher() -> None:
    assert get_runtime("megatron").engine_options().moe_dispatch == "deepep"
    for name in ("paracube", "torchtitan", "deepspeed"):  # per-expert copies through one all_to_all
        assert get_runtime(name).engine_options().moe_dispatch == "alltoall"
    with pytest.raises(ParacubeError, match="moe dispatcher"):
        estimate(PRESETS["tiny-moe"], TRAIN, parse_layout("dp=2,ep=2"), load_topology("dgx-h100", gpus=8),
                 moe_dispatch="allgather")


def test_hf_deepseek_v3_reads_its_routing_groups(tmp_path: Path) -> None:
    from paracube.hf_config import from_hf_config

    cfg = {"model_type": "deepseek_v3", "n_group": 8, "topk_group": 4}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    model = from_hf_config(p)
    assert model.moe is not None and (model.moe.groups, model.moe.group_topk) == (8, 4)
    preset = PRESETS["deepseek-v3"].moe
    assert preset is not None and (preset.groups, preset.group_topk) == (8, 4)
    p.write_text(json.dumps({"model_type": "deepseek_v3", "n_group": 1, "topk_group": 1}))
    one = from_hf_config(p).moe
    assert one is not None and (one.groups, one.group_topk) == (1, 1)


@pytest.mark.parametrize(("fields", "field"), [({"groups": 3}, "groups=3"), ({"groups": 8, "group_topk": 9},
                                                                           "group_topk=9")])
def test_bad_routing_groups_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(ParacubeError, match=field):
        MoESpec(256, 8, 2048, **fields).validate("model x")
