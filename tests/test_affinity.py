"""CPU binding of local ranks: which cores each rank gets, and bad policies refused."""

from __future__ import annotations

import pytest

from paracube.errors import ParacubeError
from paracube.executor.launch.affinity import cores_for


def test_more_ranks_than_cores_spread_round_robin() -> None:
    # 8 ranks on cores 0, 1: consecutive ranks (one tensor group) alternate cores.
    assert [cores_for(r, 8, [0, 1]) for r in range(8)] == [[0], [1]] * 4
    # Cores need not start at 0 (taskset / cgroups).
    assert [cores_for(r, 3, [4, 6]) for r in range(3)] == [[4], [6], [4]]


def test_fewer_ranks_than_cores_get_disjoint_blocks() -> None:
    cores = list(range(10))
    blocks = [cores_for(r, 3, cores) for r in range(3)]
    assert blocks == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert cores_for(0, 1, [0, 1]) == [0, 1]


def test_policy_none_keeps_every_core_and_bad_values_are_refused() -> None:
    assert cores_for(3, 8, [0, 1], "none") == [0, 1]
    with pytest.raises(ParacubeError, match="PARACUBE_CPU_BIND='core' is not a CPU binding policy; valid: "
                                            "spread, none"):
        cores_for(0, 2, [0, 1], "core")
    with pytest.raises(ParacubeError, match="local rank 2 is outside 0..1"):
        cores_for(2, 2, [0, 1])
