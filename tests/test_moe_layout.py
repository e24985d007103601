"""Layout fields ep= and etp=: parse/print round trip, MoE Parallel Folding's groups (arXiv 2504.14960), and
bad values refused in one line naming the valid ones."""

from __future__ import annotations

import numpy as np
import pytest

from paracube.errors import ParacubeError
from paracube.layout_parse import parse_layout


@pytest.mark.parametrize("text", ["dp=4,ep=2,etp=2,tp=1d:2", "dp=8,ep=8,tp=none", "dp=2,pp=2,cp=2,ep=4,tp=1d:2,sp",
                                  "dp=2,tp=1d:4,ep=1"])
def test_ep_etp_round_trip(text: str) -> None:
    layout = parse_layout(text)
    assert parse_layout(str(layout)) == layout
    assert layout.expert_data * layout.ep * layout.etp == layout.dp * layout.cp * layout.tensor_size


def test_folding_regroups_each_stage_in_rank_order() -> None:
    lay = parse_layout("dp=4,pp=2,ep=2,etp=2,tp=1d:2")  # 16 ranks, stage 0 = ranks 0..7
    etp, ep, edp = (lay.expert_groups(a) for a in ("etp", "ep", "edp"))
    assert etp[:4].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]  # innermost: consecutive ranks
    assert ep[:2].tolist() == [[0, 2], [1, 3]]
    assert edp[:2].tolist() == [[0, 4], [1, 5]]
    assert ep.shape == (8, 2) and edp.shape == (8, 2)
    # every rank sits in exactly one group of each kind, and the stages stay apart
    for groups in (etp, ep, edp, lay.expert_groups("ep.etp")):
        assert sorted(groups.ravel().tolist()) == list(range(16))
        assert all(len({int(r) // 8 for r in g}) == 1 for g in groups)
    # experts may use other groups than attention: ep=4 over dp=2 x tp=2 crosses the tp group
    lay = parse_layout("dp=2,ep=4,tp=1d:2")
    assert np.array_equal(lay.expert_groups("ep"), [[0, 1, 2, 3]])


@pytest.mark.parametrize(("text", "message"), [
    ("dp=3,ep=2", r"ep=2 x etp=1 must divide the dp x cp x tp = 3 ranks it folds over; valid ep: 1, 3"),
    ("dp=4,ep=0", "layout 'dp=4,ep=0': ep='0' must be a positive integer"),
    ("dp=2,ep=4,etp=2,tp=1d:2", r"ep=4 x etp=2 must divide the dp x cp x tp = 4 ranks it folds over; valid ep: 1, 2"),
    ("dp=2,ep=2,tp=2d:2x2", r"expert parallelism\) applies to tp=none/1d only, not 2d"),
    ("dp=8,ep=8,etp=3", r"etp=3 must divide the dp x cp x tp = 8 ranks experts fold over; valid etp: 1, 2, 4, 8"),
])
def test_bad_ep_is_refused_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ParacubeError, match=message) as info:
        parse_layout(text)
    assert "\n" not in str(info.value)
