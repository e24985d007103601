"""Two sets of rings on shared links (topologies/sharing.py) and the analytic engine's price of the tensor
collectives that run beside the data-parallel stream (cost_models/contention.py), against the event engine."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.cost_models.contention import extra
from paracube.layout_parse import parse_layout
from paracube.topologies import load_topology
from paracube.topologies.sharing import ratios


def test_rings_through_one_port_split_it_and_disjoint_ones_do_not() -> None:
    """A tp pair and a dp ring leaving GPU 0 through the same NVSwitch port: max-min gives the pair half of it;
    groups on different nodes keep everything."""
    topo = load_topology("dgx-a100", gpus=16)
    lay = parse_layout("dp=8,tp=1d:2")
    tp, dp = lay.groups(("tp",)), lay.groups(("dp",))
    a, b = ratios(topo, tp[0], tp[1:], dp[0], dp[1:])
    assert a == pytest.approx(0.5) and 0.5 <= b <= 1.0
    assert ratios(topo, [0, 1], [], [8, 9], []) == (1.0, 1.0)


def test_extra_is_the_busy_share_of_the_slowdown() -> None:
    """rho x T x (1/r - 1), rho = stream / phase capped at 1; nothing without a stream or a shared link."""
    one = np.ones(3)
    got = extra(np.array([0.5, 2.0, 0.0]), 1.0 * one, 0.2 * one, 1.0 * one)
    assert got == pytest.approx([0.1, 0.2, 0.0])
    assert extra(one, one, one, 0 * one) == pytest.approx([0.0, 0.0, 0.0])
