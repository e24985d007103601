"""Topology presets, routing, group_link (alone and under contention), YAML round trips, bad inputs.

Expected figures are derived by hand from the preset constants (spec-sheet rates) in the comments.
"""

from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import yaml

from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout
from paracube.topologies import (
    PRESETS,
    DeviceSpec,
    Topology,
    list_topologies,
    load_topology,
    save_topology,
    topology_from_dict,
)
from paracube.topologies import presets as P
from paracube.topologies.listing import describe_preset
from paracube.topologies.presets import (
    CPU_OP_S,
    CPU_STEP_WAIT_S,
    FABRIC_EFF,
    SHM_BANDWIDTH,
    SHM_LATENCY,
    local_cpu_device,
    local_cpu_link,
    ranks_per_core,
)

HDR, EDR = 200e9 / 8, 100e9 / 8  # bytes/s per direction


# --- presets ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "nodes", "per_node", "device", "bf16"), [
    ("longhorn", 16, 4, "V100-SXM2-16GB", 15.7e12),  # no bf16 units on V100: fp32 rate
    ("frontera-rtx", 16, 4, "Quadro-RTX-5000-16GB", 11.2e12),
    ("dgx-a100", 16, 8, "A100-SXM-80GB", 312e12),
    ("dgx-h100", 16, 8, "H100-SXM-80GB", 989e12),
    ("local-cpu", 1, 8, "cpu-process", 25e9),
])
def test_preset_default_sizes_and_device(name: str, nodes: int, per_node: int, device: str,
                                         bf16: float) -> None:
    topo = load_topology(name)
    assert (topo.num_nodes, topo.devices_per_node, topo.num_devices) == (nodes, per_node, nodes * per_node)
    share = ranks_per_core(per_node) if name == "local-cpu" else 1.0  # CPU ranks sharing cores
    assert topo.device.name == device and topo.device.peak_flops["bf16"] == bf16 / share
    gpus = [n for n, d in topo.graph.nodes(data=True) if d["kind"] == "gpu"]
    assert len(gpus) == nodes * per_node
    assert set(list_topologies()) == set(PRESETS)


def test_preset_spec_sheet_figures() -> None:
    a100, h100 = load_topology("dgx-a100").device, load_topology("dgx-h100").device
    assert a100.peak_flops == {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12}
    assert a100.memory_bytes == 80 * 2**30 and a100.memory_bandwidth == 2039e9
    assert h100.peak_flops["fp32"] == 67e12 and h100.memory_bandwidth == 3.35e12
    v100 = load_topology("longhorn").device
    assert v100.peak_flops["fp16"] == 125e12 and v100.memory_bytes == 16 * 2**30
    d = load_topology("dgx-a100", gpus=32).describe()
    # 600 GB/s bidirectional NVSwitch per GPU = 300 GB/s each way; one HDR NIC per GPU, 8 per node; the links
    # carry the spec rate times the fabric efficiency fitted on the published runs (presets.FABRIC_EFF).
    nv3, hdr = FABRIC_EFF["nvlink3-nvswitch"], FABRIC_EFF["hdr-ib"]
    assert d["intra_node_bandwidth"] == 300e9 * nv3 and d["inter_node_bandwidth"] == HDR * hdr
    assert d["nics_per_node"] == 8 and d["injection_bandwidth_per_node"] == 8 * HDR * hdr
    h = load_topology("dgx-h100", gpus=16).describe()
    assert h["intra_node_bandwidth"] == 450e9 * FABRIC_EFF["nvlink4-nvswitch"]
    assert h["inter_node_bandwidth"] == 400e9 / 8 * FABRIC_EFF["ndr-ib"]
    f = load_topology("frontera-rtx", gpus=8).describe()
    assert f["inter_node_bandwidth"] == pytest.approx(56e9 * 64 / 66 / 8)  # FDR, 64b/66b


def test_gpu_counts_resize_presets() -> None:
    assert load_topology("dgx-a100", gpus=1024).num_nodes == 128
    assert load_topology("longhorn", nodes=3).num_devices == 12
    part = load_topology("dgx-h100", gpus=4)  # fewer than one node: part of a node
    assert (part.num_nodes, part.devices_per_node) == (1, 4)
    assert load_topology("local-cpu", gpus=4).num_devices == 4
    with pytest.raises(ParacubeError, match=r"gpus=12 is not a multiple of the 8 devices per node"):
        load_topology("dgx-a100", gpus=12)
    with pytest.raises(ParacubeError, match="disagree"):
        load_topology("longhorn", gpus=16, nodes=3)


def test_local_cpu_figures() -> None:
    topo = load_topology("local-cpu")
    r = ranks_per_core(8)  # 8 ranks on this machine's cores: each gets 1/r of a core
    assert topo.device.peak_flops["fp32"] == 100e9 / r
    link = topo.group_link(range(8))  # every process -> hub -> process: 2 GB/s on a core each, 2 x 25 us
    assert link.bandwidth == 2e9 / r and link.latency == pytest.approx(50e-6)


def test_local_cpu_prices_ranks_sharing_cores() -> None:
    """More ranks than cores: each rank's share of a core slows its compute, op dispatch and copies, and every
    message of a collective waits for the other ranks on its core; with a core per rank the base figures hold."""
    own, shared = local_cpu_device(2, cores=2), local_cpu_device(8, cores=2)
    assert own.peak_flops["fp32"] == 100e9 and own.ring_wait_s == 0 and own.call_overhead_s == 0
    assert own.op_overhead_s == CPU_OP_S
    assert shared.peak_flops["fp32"] == 100e9 / 4 and shared.memory_bandwidth == own.memory_bandwidth / 4
    assert shared.op_overhead_s == 4 * CPU_OP_S and shared.ring_wait_s == 3 * CPU_STEP_WAIT_S
    assert local_cpu_link(8, cores=2) == (SHM_BANDWIDTH / 4, SHM_LATENCY)
    assert local_cpu_link(2, cores=4) == (SHM_BANDWIDTH, SHM_LATENCY)
    again = DeviceSpec(**shared.to_dict())  # the overheads travel with the device in a topology file
    assert again == shared and "op_overhead_s" not in load_topology("dgx-a100", gpus=8).device.to_dict()


def test_local_cpu_gemm_curve_saturates_early_and_accelerators_keep_theirs() -> None:
    """A CPU core runs small GEMMs near its peak: the uncalibrated local-cpu model uses its device's half-efficiency
    dimension (CPU_GEMM_HALF_DIM), an accelerator preset the default curve; a negative value is refused."""
    from paracube.cost_models.compute import GemmModel
    from paracube.cost_models.device_model import gemm_model
    from paracube.errors import ParacubeError
    from paracube.topologies.local_cpu import CPU_GEMM_HALF_DIM

    cpu = gemm_model(load_topology("local-cpu", gpus=2), "fp32")
    gpu = gemm_model(load_topology("dgx-a100", gpus=8), "bf16")
    assert (cpu.m0, cpu.n0, cpu.k0) == (CPU_GEMM_HALF_DIM,) * 3 and gpu.m0 >= GemmModel.m0  # fitted preset: 332
    assert cpu.eff(128, 64, 64) > 0.5 > gpu.eff(128, 64, 64)
    assert "gemm_half_dim" not in load_topology("dgx-a100", gpus=8).device.to_dict()
    with pytest.raises(ParacubeError, match="gemm_half_dim"):
        DeviceSpec("x", {"fp32": 1.0, "fp16": 1.0, "bf16": 1.0}, 1.0, 1.0, gemm_half_dim=-1.0)


# --- routing ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(PRESETS))
def test_fast_listing_equals_the_built_graph(name: str) -> None:
    # `paracube topologies` describes the presets without building graphs: same dict as the graph gives,
    # at the default size and (multi-node presets) at 40 nodes, past every leaf so the spine is on the path.
    assert describe_preset(name) == load_topology(name).describe()
    if not PRESETS[name].fixed_nodes:
        assert describe_preset(name, nodes=40) == load_topology(name, nodes=40).describe()


def test_routes_follow_the_hardware() -> None:
    dgx = load_topology("dgx-a100", gpus=16)
    assert dgx.rank_node(9) == "n1.gpu1"
    assert dgx.route(0, 1) == [("n0.gpu0", "n0.switch"), ("n0.switch", "n0.gpu1")]
    # Same rail: NIC 0 -> rail-0 leaf -> NIC 0.
    assert dgx.route(0, 8) == [("n0.gpu0", "n0.nic0"), ("n0.nic0", "leaf0.rail0"), ("leaf0.rail0", "n1.nic0"),
                               ("n1.nic0", "n1.gpu0")]
    # Across rails the hop climbs to the spine.
    assert dgx.route(7, 8) == [("n0.gpu7", "n0.nic7"), ("n0.nic7", "leaf0.rail7"), ("leaf0.rail7", "spine"),
                               ("spine", "leaf0.rail0"), ("leaf0.rail0", "n1.nic0"), ("n1.nic0", "n1.gpu0")]
    assert dgx.route(3, 3) == []
    # AC922: GPUs 0,1 share socket 0, GPUs 2,3 socket 1; the HCA hangs off socket 0.
    lh = load_topology("longhorn", nodes=2)
    assert lh.route(0, 1) == [("n0.gpu0", "n0.gpu1")]
    assert lh.route(1, 2) == [("n0.gpu1", "n0.cpu0"), ("n0.cpu0", "n0.cpu1"), ("n0.cpu1", "n0.gpu2")]
    assert lh.route(2, 4)[:4] == [("n0.gpu2", "n0.cpu1"), ("n0.cpu1", "n0.cpu0"), ("n0.cpu0", "n0.nic0"),
                                  ("n0.nic0", "leaf0")]
    for a in range(8):
        for b in range(8):
            path = lh.route(a, b)
            assert all(lh.graph.has_edge(u, v) for u, v in path)
            if path:
                assert path[0][0] == lh.rank_node(a) and path[-1][1] == lh.rank_node(b)
                assert all(path[i][1] == path[i + 1][0] for i in range(len(path) - 1))


# --- group_link ------------------------------------------------------------------------------------------
def test_group_inside_an_nvswitch_node_gets_the_intra_node_bandwidth() -> None:
    dgx = load_topology("dgx-a100", gpus=16)
    link = dgx.group_link(range(8))
    # Each GPU's link to the NVSwitch carries one ring hop per direction: 300 GB/s (x the fitted fabric
    # efficiency); path = 2 x 0.5 us.
    nv3 = 300e9 * FABRIC_EFF["nvlink3-nvswitch"]
    assert (link.bandwidth, link.nodes, link.ranks_per_node) == (nv3, 1, 8)
    assert link.latency == pytest.approx(2 * P.NVLINK_LAT)
    # Concurrent groups in the other node share nothing with it.
    assert dgx.group_link(range(8), concurrent=[range(8, 16)]).bandwidth == nv3


def test_longhorn_intra_node_pairs_and_x_bus() -> None:
    lh = load_topology("longhorn", nodes=1)
    assert lh.group_link([0, 1]).bandwidth == 75e9  # 3 NVLink 2.0 bricks x 25 GB/s
    # A 4-GPU ring crosses the X-bus once each way (1->2 and 3->0): bottleneck 32 GB/s.
    assert lh.group_link(range(4)).bandwidth == 32e9


def test_group_on_eight_nodes_gets_the_nic_bandwidth() -> None:
    lh = load_topology("longhorn", nodes=8)
    ranks = list(range(0, 32, 4))  # local rank 0 of each node, one EDR HCA per node
    link = lh.group_link(ranks)
    assert (link.bandwidth, link.nodes, link.ranks_per_node) == (EDR, 8, 1)
    # gpu->cpu0 (NVLink) + cpu0->nic (PCIe) + nic->leaf + leaf->nic + nic->cpu0 (PCIe) + cpu0->gpu (NVLink)
    assert link.latency == pytest.approx(2 * P.NVLINK_LAT + 2 * P.PCIE_LAT + 2 * P.NIC_LAT)


def test_two_concurrent_groups_sharing_one_nic_each_get_half() -> None:
    lh = load_topology("longhorn", nodes=8)
    a, b = list(range(0, 32, 4)), list(range(1, 32, 4))  # local ranks 0 and 1 of every node
    # Each node's single NIC uplink carries one hop of each ring: 12.5 GB/s / 2.
    assert lh.group_link(a, concurrent=[b]).bandwidth == EDR / 2
    assert lh.group_link(b, concurrent=[a, b]).bandwidth == EDR / 2  # itself listed: counted once
    assert lh.group_link(b).bandwidth == EDR
    # On a rail-optimized DGX the two groups use different NICs: no sharing.
    dgx = load_topology("dgx-a100", nodes=8)
    assert dgx.group_link(range(0, 64, 8), concurrent=[range(1, 64, 8)]).bandwidth == HDR * FABRIC_EFF["hdr-ib"]


def test_a_ring_crosses_nodes_through_the_nics_its_members_own() -> None:
    """NCCL's channels (topology docstring): a crossing uses min(NICs the ring's local members own, channels)
    NICs; concurrent rings through one node share them; one member per node (tp=8 in the node) keeps one NIC.
    Exact equalities: the loads are sums of 1/C shares with C a power of two, exact in binary."""
    from paracube.cost_models.event_network import LinkTable, weighted_maxmin
    from paracube.topologies.rates import NDR_IB

    h100 = load_topology("dgx-h100", nodes=4)
    nic = NDR_IB * FABRIC_EFF["ndr-ib"]
    assert h100.group_link(range(16)).bandwidth == 8 * nic  # dp=16, no tp: eight NICs per boundary
    evens, odds = list(range(0, 32, 2)), list(range(1, 32, 2))  # tp=2: two dp rings of 4 members per node
    assert h100.group_link(evens, concurrent=[evens, odds]).bandwidth == 4 * nic  # on disjoint NICs
    assert h100.group_link(range(0, 32, 8)).bandwidth == nic  # tp=8 inside the node: unchanged
    # 2 NICs for 8 GPUs (GPUs 0-3 NIC 0, 4-7 NIC 1): a full-node ring gets both; two rings share them.
    shared = topology_from_dict(yaml.safe_load(COMPACT))
    assert shared.group_link(range(32)).bandwidth == 2 * 25e9
    assert shared.group_link(evens, concurrent=[odds]).bandwidth == 25e9
    # The event engine's flow weights are the same fractional loads: its max-min rates equal group_link's.
    for topo, groups in ((h100, [list(range(16)), list(range(16, 32))]), (h100, [evens, odds]),
                         (shared, [evens, odds]), (shared, [list(range(32))])):
        table = LinkTable(topo)
        tpl = table.ring_template("dp", groups)
        assert min(weighted_maxmin(tpl.hops, table.cap)) == pytest.approx(
            topo.group_link(groups[0], concurrent=groups).bandwidth, rel=1e-12)


def test_oversubscribed_spine_is_shared_by_all_crossing_hops() -> None:
    # 40 nodes = two 20-node leaf blocks per rail. Node i talks to node 20+i on rail 0, all 20 pairs at
    # once: 20 hops leave leaf0.rail0 for the spine, whose uplink is 20 x 25 GB/s / oversubscription.
    pairs = [[8 * i, 8 * (20 + i)] for i in range(20)]
    full = load_topology("dgx-a100", nodes=40).group_link(pairs[0], concurrent=pairs)
    hdr = HDR * FABRIC_EFF["hdr-ib"]  # the links carry the fitted fabric efficiency
    assert full.bandwidth == hdr  # non-blocking: the NIC is the bottleneck
    half = P.dgx_a100(40, oversubscription=2.0).group_link(pairs[0], concurrent=pairs)
    assert half.bandwidth == pytest.approx(20 * hdr / 2 / 20)


def test_single_rank_group_and_equivalent_queries() -> None:
    dgx = load_topology("dgx-a100", gpus=64)
    one = dgx.group_link([5])
    assert math.isinf(one.bandwidth) and one.latency == 0.0 and (one.nodes, one.ranks_per_node) == (1, 1)
    groups = parse_layout("dp=4,tp=2d:4x4").groups("row")  # numpy [16, 4]
    ref = dgx.group_link(groups[0], groups)
    assert dgx.group_link(list(reversed(groups[0].tolist())), groups[::-1].tolist()) == ref
    assert dgx.group_link(groups[0].tolist(), concurrent=groups[1:].tolist()) == ref


# --- YAML ------------------------------------------------------------------------------------------------
def test_yaml_round_trip_of_presets(tmp_path: Path) -> None:
    for name in ("longhorn", "dgx-h100", "local-cpu"):
        topo = load_topology(name, gpus=8)
        topo.calibration = {"gemm": {"eff_max": 0.61},
                            "comm": {"all_reduce": {"2": {"latency": 3e-6, "bandwidth": 1e10}}}}
        path = tmp_path / f"{name}.yaml"
        save_topology(topo, path)
        back = load_topology(str(path))
        assert back == topo and back.calibration == topo.calibration
        assert back.group_link(range(8)) == topo.group_link(range(8))
        assert topology_from_dict(topo.to_dict()) == topo


COMPACT = """\
name: mycluster
device: {name: A100-80GB, peak_flops: {fp32: 19.5e12, bf16: 312e12, fp16: 312e12}, memory_bytes: 80e9,
         memory_bandwidth: 2.0e12}
nodes: 4
devices_per_node: 8
intra_node: {bandwidth: 300e9, latency: 2e-6}
inter_node: {bandwidth: 25e9, latency: 5e-6, nics_per_node: 2}
"""


def test_compact_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(COMPACT)
    topo = load_topology(str(path))
    assert (topo.name, topo.num_nodes, topo.devices_per_node) == ("mycluster", 4, 8)
    assert topo.device.peak_flops["bf16"] == 312e12  # "312e12" is a string to YAML 1.1: read as a number
    assert topo.group_link(range(8)).bandwidth == 300e9
    # GPUs 0-3 use NIC 0, 4-7 NIC 1: the local-rank-0 and local-rank-1 rings share NIC 0 -> half of 25 GB/s.
    a, b = list(range(0, 32, 8)), list(range(1, 32, 8))
    assert topo.group_link(a, concurrent=[b]).bandwidth == 25e9 / 2
    assert topo.group_link(a, concurrent=[list(range(4, 32, 8))]).bandwidth == 25e9
    assert load_topology(str(path), gpus=64).num_nodes == 8
    save_topology(topo, tmp_path / "x.yaml")
    assert load_topology(str(tmp_path / "x.yaml")) == topo


# --- bad inputs ------------------------------------------------------------------------------------------
def test_unknown_preset_lists_the_valid_ones() -> None:
    with pytest.raises(ParacubeError) as err:
        load_topology("dgx-z100")
    assert "dgx-z100" in str(err.value) and all(name in str(err.value) for name in PRESETS)


@pytest.mark.parametrize(("text", "message"), [
    (COMPACT.replace("devices_per_node: 8\n", ""), r"field devices_per_node: Field required"),
    (COMPACT.replace("bandwidth: 300e9", "bandwidth: 0"), r"field intra_node\.bandwidth: .*greater than 0"),
    (COMPACT.replace("nodes: 4", "nodes: four"), r"field nodes: .*integer.*'four'"),
    (COMPACT.replace("fp16: 312e12", "half: 1"), r"field device.*fp16"),
    (COMPACT.replace("2.0e12}", "2.0e12"), r"c\.yaml: not valid YAML \(line \d+, column \d+\)"),
    (COMPACT.replace("{name: A100-80GB,", "{name: A100-80GB, color: red,"),
     r"field device\.color: unknown key; valid keys here: name, peak_flops"),
    ("- just a list", r"expected a mapping"),
])
def test_bad_yaml_names_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ParacubeError, match=message) as err:
        load_topology(str(path))
    assert str(path) in str(err.value)


def _tiny_graph() -> nx.Graph:
    g = nx.Graph()
    g.add_node("sw", kind="switch", node_index=0)
    for j in range(2):
        g.add_node(f"g{j}", kind="gpu", node_index=0, local_rank=j)
        g.add_edge(f"g{j}", "sw", bandwidth=10e9, latency=1e-6)
    return g


DEV = DeviceSpec("d", {"fp32": 1e12, "fp16": 2e12, "bf16": 2e12}, 1e9, 1e11)


def test_bad_graphs_name_the_element() -> None:
    assert Topology("t", _tiny_graph(), DEV, 1, 2).group_link([0, 1]).bandwidth == 10e9
    g = _tiny_graph()
    g.edges["g1", "sw"]["bandwidth"] = 0.0
    with pytest.raises(ParacubeError, match=r"link '(g1'-'sw|sw'-'g1)' has bandwidth=0\.0"):
        Topology("t", g, DEV, 1, 2)
    g = _tiny_graph()
    g.edges["g0", "sw"]["latency"] = -1e-6
    with pytest.raises(ParacubeError, match=r"link '(g0'-'sw|sw'-'g0)' has latency=-1e-06"):
        Topology("t", g, DEV, 1, 2)
    g = _tiny_graph()
    g.remove_edge("g1", "sw")
    with pytest.raises(ParacubeError, match=r"device 'g1' is disconnected"):
        Topology("t", g, DEV, 1, 2)
    with pytest.raises(ParacubeError, match=r"2 devices on the graph, expected .* = 3"):
        Topology("t", _tiny_graph(), DEV, 1, 3)
    g = _tiny_graph()
    g.nodes["sw"]["kind"] = "router"
    with pytest.raises(ParacubeError, match=r"node 'sw' has kind='router'"):
        Topology("t", g, DEV, 1, 2)
    with pytest.raises(ParacubeError, match=r"peak_flops lacks bf16"):
        DeviceSpec("d", {"fp32": 1e12, "fp16": 2e12}, 1e9, 1e11)


def test_explicit_yaml_graph_errors(tmp_path: Path) -> None:
    data = Topology("t", _tiny_graph(), DEV, 1, 2).to_dict()
    data["graph"]["links"][0]["bandwidth"] = -5.0
    with pytest.raises(ParacubeError, match=r"f\.yaml: .*link '(g0'-'sw|sw'-'g0)' has bandwidth=-5\.0"):
        topology_from_dict(data, "f.yaml")
    data = Topology("t", _tiny_graph(), DEV, 1, 2).to_dict()
    data["graph"]["links"].append({"a": "g0", "b": "ghost", "bandwidth": 1e9, "latency": 1e-6})
    with pytest.raises(ParacubeError, match=r"f\.yaml: link 'g0'-'ghost' names node 'ghost'"):
        topology_from_dict(data, "f.yaml")
    with pytest.raises(ParacubeError, match="cannot be resized"):
        topology_from_dict(Topology("t", _tiny_graph(), DEV, 1, 2).to_dict(), "f.yaml", gpus=4)


def test_ranks_not_on_the_graph() -> None:
    topo = load_topology("local-cpu")
    for call in (lambda: topo.group_link([0, 8]), lambda: topo.route(0, -1), lambda: topo.rank_node(99),
                 lambda: topo.group_link([0, 1], concurrent=np.array([[2, 30]]))):
        msg = r"rank -?\d+ is not on topology 'local-cpu'; valid ranks: 0..7"
        with pytest.raises(ParacubeError, match=msg):
            call()
    with pytest.raises(ParacubeError, match=r"lists a rank twice"):
        topo.group_link([1, 1])
    with pytest.raises(ParacubeError, match=r"lists a rank twice"):
        topo.group_link([0], concurrent=[[2, 2]])
    with pytest.raises(ParacubeError, match=r"rank 1\.5"):
        topo.group_link([0, 1.5])  # type: ignore[list-item]


# --- the hardware bought now (issue #23 item 1) ----------------------------------------------------------------
@pytest.mark.parametrize(("name", "nodes", "per_node", "device", "peaks", "memory", "hbm", "nvlink"), [
    # H200 datasheet: the H100's compute (dense fp8 1979, bf16 989 TF), 141 GB at 4.8 TB/s; NVLink 4 450 GB/s
    ("dgx-h200", 16, 8, "H200-SXM-141GB", (1979e12, 989e12), 141, 4.8e12, (450e9, "nvlink4-nvswitch")),
    # DGX B200: 72 PF fp8 sparse / 8 GPUs / 2 = 4.5 PF dense; bf16 2.25 PF; 180 GB, 8 TB/s; NVLink 5 900 GB/s
    ("dgx-b200", 16, 8, "B200-SXM-180GB", (4.5e15, 2.25e15), 180, 8e12, (900e9, "nvlink5-nvswitch")),
    # GB200 NVL72: 720 PF fp8 sparse / 72 / 2 = 5 PF dense; bf16 2.5 PF; 13.4 TB / 72 = 186 GB, 8 TB/s
    ("gb200-nvl72", 2, 72, "B200-GB200-186GB", (5e15, 2.5e15), 186, 8e12, (900e9, "nvlink5-nvswitch")),
])
def test_current_presets_load_size_and_plan(name: str, nodes: int, per_node: int, device: str,
                                            peaks: tuple[float, float], memory: int, hbm: float,
                                            nvlink: tuple[float, str]) -> None:
    from paracube.planner import search
    from paracube.topologies.listing import preset_sources
    from paracube.workload import ModelSpec, TrainingSpec

    topo = load_topology(name)
    assert (topo.num_nodes, topo.devices_per_node) == (nodes, per_node)
    d = topo.device
    assert d.name == device and (d.peak_flops["fp8"], d.peak_flops["bf16"]) == peaks
    assert d.memory_bytes == memory * 2**30 and d.memory_bandwidth == hbm and d.has_fp8
    h = topo.describe()
    assert h["intra_node_bandwidth"] == nvlink[0] * FABRIC_EFF[nvlink[1]]
    assert h["inter_node_bandwidth"] == 400e9 / 8 * FABRIC_EFF["ndr-ib"]  # ConnectX-7 NDR, one per GPU
    assert h["nics_per_node"] == per_node
    assert load_topology(name, gpus=4 * per_node).num_nodes == 4
    # launchers per host (the plan's launch): a GB200 NVL72 domain spans 18 hosts of 4 GPUs (Grace boards)
    assert getattr(topo, "devices_per_host", per_node) == (4 if name == "gb200-nvl72" else per_node)
    # where each figure came from: Hopper's fitted on the DGX H100 rows (m0 held, said so), NDR set to NCCL's bus
    # bandwidth and held there, Blackwell's FP8 curve on the DGX B200 and GB200 NVL72 rows; what no run exercises
    # is flagged NOT FITTED in `paracube topologies`
    sources = preset_sources(name)
    assert set(sources) == {"gemm", "fp8 gemm", "overlap drag", "straggler", f"intra-node {nvlink[1]}",
                            "inter-node ndr-ib", "all-to-all ndr-ib", "a2a overlap", "host wait", "host issue",
                            "host link"}
    # the a2a overlap's hidden share (moe_a2a_overlap.py): fitted on a DGX H100 row, which the H200 takes
    assert sources["a2a overlap"].startswith("NOT FITTED") == (name != "dgx-h200")
    # an all_to_all's share of the NDR line rate (moe_a2a.py): fitted on the DGX H100 MoE row, the fabric's for all
    assert sources["all-to-all ndr-ib"].startswith("fitted on qwen3-235b-256 of benchmarks/data/published_runs_moe")
    assert sources["host wait"].startswith("NOT FITTED")  # a dropless MoE block's host wait (host_sync.py)
    assert sources["host link"].startswith("NOT FITTED")  # activation offloading's link (host_link.py)
    # its host's seconds per op (host_issue.py): fitted on a DGX H100 MoE row, which the H200's Xeons take
    assert sources["host issue"].startswith("NOT FITTED") == (name != "dgx-h200")
    assert sources["host issue"].endswith("(devices.HOST_ISSUE_SCALE)")
    assert sources["overlap drag"].startswith("fitted on the dgx-")  # Hopper's / Blackwell's refits (goes to 0)
    assert sources["straggler"].startswith("fitted on the dgx-")  # Hopper's (H200: its generation), Blackwell's (0)
    today = "benchmarks/data/published_runs_today.csv"
    assert sources["inter-node ndr-ib"].startswith("set to NCCL's NDR bus bandwidth")
    assert "m0 NOT FITTED" in sources["fp8 gemm"]
    if name == "dgx-h200":
        assert sources["gemm"].startswith(f"fitted on the dgx-h100 rows of {today}; m0 NOT FITTED")
        assert sources["intra-node nvlink4-nvswitch"].startswith(f"fitted on the dgx-h100 rows of {today} (fit5; held")
    else:
        assert sources["gemm"].startswith("NOT FITTED: borrowed from hopper; no 16-bit Blackwell run")
        assert sources["fp8 gemm"].startswith(f"fitted on the dgx-b200 and gb200-nvl72 rows of {today}")
        assert sources["intra-node nvlink5-nvswitch"].startswith("NOT FITTED: borrowed from nvlink4-nvswitch")
    # it plans, bf16 and fp8, on one node and across two
    model = ModelSpec("m", layers=4, hidden=1152, heads=72, ffn_hidden=4608, vocab=1024, seq_len=256)
    for gpus in (per_node, 2 * per_node):
        for dtype in ("bf16", "fp8"):
            res = search(model, TrainingSpec(global_batch=4 * per_node, dtype=dtype), load_topology(name, gpus=gpus),
                         gpus, top_k=1)
            layout, est = res.ranked[0]
            assert layout.world_size == gpus and est.step_time_s > 0 and est.memory.total < d.memory_bytes


def test_fitted_generations_keep_their_sources() -> None:
    from paracube.topologies.listing import preset_sources

    a100 = preset_sources("dgx-a100")
    wait = "NOT FITTED: 50 us, an estimate (devices.HOST_SYNC_S)"  # every GPU's (cost_models/host_sync.py)
    issue = a100["host issue"]  # every GPU host's seconds per op (cost_models/host_issue.py)
    assert issue.startswith("NOT FITTED") and "borrowed from the DGX H100's host" in issue
    h100 = preset_sources("dgx-h100")["host issue"]
    assert h100.endswith("fitted on qwen3-30b-16-fp8 of benchmarks/data/published_runs_moe.csv "
                         "(devices.HOST_ISSUE_SCALE)") and "NOT FITTED" not in h100
    assert a100 == {**{k: "fitted on the dgx-a100 rows of benchmarks/data/published_runs.csv"
                       for k in ("gemm", "overlap drag", "intra-node nvlink3-nvswitch", "inter-node hdr-ib")},
                    "straggler": "fitted on the dgx-a100 rows of benchmarks/data/published_runs.csv (0.0015 beside the "
                                 "drag, under 0.4% of any A100 step: 0 shipped)",
                    "host wait": wait, "host issue": issue, "all-to-all hdr-ib": a100["all-to-all hdr-ib"],
                    "a2a overlap": a100["a2a overlap"],
                    "host link": "NOT FITTED: 32 GB/s per direction to the host, 250 GB host memory per GPU, datasheet "
                                 "figures (topologies/host_link.py; no run offloads activations)"}
    assert a100["all-to-all hdr-ib"].startswith("NOT FITTED: borrowed from ndr-ib")  # no MoE run on HDR
    assert a100["a2a overlap"].startswith("NOT FITTED: borrowed from hopper")  # no A100 run overlaps its all_to_alls
    assert preset_sources("dgx-h100")["a2a overlap"].startswith("fitted on qwen3-235b-256-fp8")
    assert preset_sources("dgx2-v100")["inter-node edr-ib"].startswith("NOT FITTED: borrowed from hdr-ib")
    assert preset_sources("dgx2-v100")["overlap drag"].startswith("NOT FITTED: no run of the set overlaps")
    assert preset_sources("dgx2-v100")["straggler"].startswith("NOT FITTED: no run of the set has data-parallel")
    assert preset_sources("longhorn") == {"gemm": "model defaults (eff_max 0.85, m0 64, mem_eff 0.8): no fit for "
                                          "this device", "host wait": wait, "host issue": issue}
