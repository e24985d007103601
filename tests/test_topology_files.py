"""Topologies for users: the example files of examples/ load as docs/topologies.md describes them, `paracube
topologies NAME|FILE --gpus N` shows them sized as a preset is, and each mistake is one line naming the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from paracube.cli.main import main
from paracube.errors import ParacubeError
from paracube.topologies import load_topology, topology_from_dict
from paracube.topologies.efficiency import NDR

ROOT = Path(__file__).resolve().parents[1]
PCIE = ROOT / "examples" / "pcie-2x8-100gbe.yaml"
RAIL = ROOT / "examples" / "h100-rail-32x8.yaml"


def test_pcie_box_example_loads_with_its_commented_figures() -> None:
    topo = load_topology(str(PCIE))
    d = topo.describe()
    assert (d["nodes"], d["devices_per_node"], d["devices"]) == (2, 8, 16)
    assert d["device"] == "A100-PCIe-80GB" and d["peak_flops"]["bf16"] == 312e12
    # One NIC per node behind the PCIe switch: a cross-node ring of one GPU per node gets the NIC's 10.5e9.
    assert d["nics_per_node"] == 1 and d["inter_node_bandwidth"] == pytest.approx(10.5e9)
    assert d["intra_node_bandwidth"] == pytest.approx(22e9)
    assert load_topology(str(PCIE), gpus=8).num_nodes == 1  # --gpus 8: one of the two boxes


def test_rail_optimized_example_has_a_nic_per_gpu_on_its_rail() -> None:
    topo = load_topology(str(RAIL))
    d = topo.describe()
    assert (d["nodes"], d["devices_per_node"], d["nics_per_node"]) == (32, 8, 8)
    nic = 50e9 * NDR  # the file's NDR rate: nominal x the preset's fitted efficiency
    assert d["injection_bandwidth_per_node"] == pytest.approx(8 * nic)
    # Rails: NIC k of every node goes to leaf k, so a ring of local rank k over all nodes crosses no spine and
    # gets the NIC's rate; its latency is GPU -> NIC -> leaf -> NIC -> GPU (no spine hop).
    ring = topo.group_link(range(3, topo.num_devices, 8))
    assert ring.bandwidth == pytest.approx(nic)
    assert ring.latency == pytest.approx(2 * 1e-6 + 2 * 1e-6)
    # Equal to the dgx-h100 preset's figures where the file copies them (the preset's fitted efficiencies).
    preset = load_topology("dgx-h100", gpus=256).describe()
    for key in ("intra_node_bandwidth", "inter_node_bandwidth", "memory_bytes", "peak_flops"):
        assert d[key] == pytest.approx(preset[key]), key


def test_docs_explicit_graph_example_loads() -> None:
    block = re.search(r"```yaml\n(.*?)```", (ROOT / "docs" / "topologies.md").read_text(), re.S)
    assert block is not None
    topo = topology_from_dict(yaml.safe_load(block.group(1)), "docs/topologies.md")
    assert topo.num_devices == 2 and topo.describe()["intra_node_bandwidth"] == 150e9


def test_topologies_command_shows_presets_and_files_alike(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    assert main(["topologies", "dgx-h100", "--gpus", "24", "--json"]) == 0
    (preset,) = json.loads(capsys.readouterr().out)
    sources = preset.pop("efficiency_sources")  # a preset's listing also says where each efficiency came from
    assert preset == json.loads(json.dumps(load_topology("dgx-h100", gpus=24).describe()))
    # The 16-bit curve is fitted on the H100 rows (m0 held at fit2's, said so); the FP8 curve's m0 is the 16-bit one.
    assert sources["gemm"].startswith("fitted on the dgx-h100 rows") and "NOT FITTED: borrowed" not in sources["gemm"]
    assert "fp8_m0 NOT FITTED" in sources["fp8 gemm"]
    assert main(["topologies", str(RAIL), "--gpus", "64", "--json"]) == 0
    (mine,) = json.loads(capsys.readouterr().out)
    assert (mine["devices"], mine["nodes"]) == (64, 8)
    assert main(["topologies", "--gpus", "256", "--json"]) == 0  # the README's "--gpus N sizes them"
    sized = json.loads(capsys.readouterr().out)
    assert {d["name"] for d in sized} >= {"longhorn", "dgx-a100", "dgx-h100", "local-cpu"}
    assert all(d["devices"] == 256 for d in sized)
    assert main(["topologies"]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if "local-cpu" in line)
    assert " 0 GB/s" not in row and "0.5 GB/s" in row  # a process's 0.5 GB/s link, not rounded to 0


BASE = {"name": "mine", "device": "A100-SXM-80GB", "nodes": 2, "devices_per_node": 8,
        "intra_node": {"bandwidth": 300e9, "latency": 2e-6},
        "inter_node": {"bandwidth": 25e9, "latency": 5e-6, "nics_per_node": 8}}


@pytest.mark.parametrize(("change", "expected"), [
    ({"device_per_node": 8, "devices_per_node": None},
     "mine.yaml: field device_per_node: unknown key; did you mean devices_per_node?"),
    ({"inter_node": {"bandwith": 25e9, "latency": 5e-6}},
     "mine.yaml: field inter_node.bandwith: unknown key; did you mean bandwidth?"),
    ({"device": {"name": "x", "peak_flop": {}, "memory_bytes": 1, "memory_bandwidth": 1}},
     "mine.yaml: field device.peak_flop: unknown key; did you mean peak_flops?"),
    ({"device": "H100-SXM-80G"}, "unknown device 'H100-SXM-80G'; did you mean H100-SXM-80GB?"),
])
def test_field_errors_name_the_bad_key(change: dict, expected: str) -> None:
    data = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(ParacubeError) as err:
        topology_from_dict(data, "mine.yaml")
    assert str(err.value).startswith(expected) or expected in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_and_misspelt_preset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, expected in [
        (["plan", "--cluster", "my.yml"], "topology file 'my.yml' does not exist"),
        (["plan", "--cluster", str(tmp_path)], "is a directory"),
        (["plan", "--cluster", "dgxh100"], "unknown topology 'dgxh100'; did you mean dgx-h100?"),
        (["topologies", "DGX-H100"], "did you mean dgx-h100?"),
        (["topologies", "dgx-h100", "--gpus", "12"], "gpus=12 is not a multiple of the 8 devices per node"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert expected in err and len(err.strip().splitlines()) == 1, (argv, err)
