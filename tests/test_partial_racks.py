"""A rack-scale NVLink domain used in part (gb200-nvl72: 72 GPUs a rack, 4 per host): the GPU count is split into
the fewest racks of equal whole hosts, as NVIDIA's GB200 runs of 64-512 GPUs use racks of 64
(topologies/loader.partial_racks); whole-node presets keep refusing counts that are not whole nodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from paracube.calibration.run_prediction import preset_topology
from paracube.calibration.runs_csv import read_runs
from paracube.errors import ParacubeError
from paracube.topologies.loader import load_topology, partial_racks
from paracube.topologies.presets import PRESETS

PER_RACK, PER_HOST = 72, 4
DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data"


@pytest.mark.parametrize("gpus", range(PER_HOST, 8 * PER_RACK + 1, PER_HOST))
def test_split_is_whole_hosts_in_the_fewest_equal_racks(gpus: int) -> None:
    split = partial_racks(gpus, PER_RACK, PER_HOST)
    assert split is not None  # one host per rack always divides: a split exists for every multiple of 4
    racks, per = split
    assert racks * per == gpus and per % PER_HOST == 0 and per <= PER_RACK
    # No fewer racks holds the count in equal whole hosts.
    assert not any(gpus % r == 0 and (gpus // r) % PER_HOST == 0 and gpus // r <= PER_RACK for r in range(1, racks))


def test_counts_that_are_not_whole_hosts_have_no_split() -> None:
    assert all(partial_racks(g, PER_RACK, PER_HOST) is None for g in range(1, 300) if g % PER_HOST)
    assert partial_racks(128, 8, 0) is None  # whole-node presets (no hosts inside a node) never split


def test_gb200_builds_what_the_published_rows_run() -> None:
    """The CLI's topology for each published GB200 row is the benchmark's (the rows' 128 GPUs: 2 racks of 64)."""
    rows = [r for f in ("published_runs_today.csv", "published_runs_moe.csv")
            for r in read_runs(DATA / f, tuple(PRESETS)) if r.cluster == "gb200-nvl72"]
    assert {r.gpus for r in rows} >= {8, 64, 128}
    for run in rows:
        cli, bench = load_topology(run.cluster, gpus=run.gpus), preset_topology(run)
        assert (cli.num_nodes, cli.devices_per_node) == (bench.num_nodes, bench.devices_per_node)


def test_partial_racks_refuse_in_one_line() -> None:
    with pytest.raises(ParacubeError, match=r"^gb200-nvl72: gpus=130 is not a multiple of the 4 GPUs of a host; "
                                            r"try 128 or 132$"):
        load_topology("gb200-nvl72", gpus=130)
    with pytest.raises(ParacubeError, match=r"gpus=128 run as 2 racks of 64 \(whole hosts of 4\), but nodes=3"):
        load_topology("gb200-nvl72", gpus=128, nodes=3)
    with pytest.raises(ParacubeError, match=r"gpus=12 is not a multiple of the 8 devices per node"):
        load_topology("dgx-h100", gpus=12)
