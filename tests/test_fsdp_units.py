"""fsdp_units.unit_totals (every stage shape of a batch at once) against its per-shape reference `_unit_totals`
(the Python walk of one stage's chunk births and deaths, cost_models/fsdp_units.py): equal integers for every
layout, over pipelines of 1 to 8 stages, interleaving 1 to 3, one to many micro-batches, zero groups of 1 to 8
ranks, tied and untied embeddings, a batch mixing them all. Integers: exact, so compared with ==."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from paracube.cost_models.dims import dims_of, param_dims
from paracube.cost_models.fsdp_units import _unit_totals, unit_totals
from paracube.modes import LayoutBatch
from paracube.modes.stages import stage_layers
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("units", layers=24, hidden=64, heads=8, ffn_hidden=256, vocab=128, seq_len=16)


def _batch() -> LayoutBatch:
    """(dp, pp, t, q, depth, mb, v, sp) rows: every combination below whose blocks split over pp x v."""
    rows = [(dp, pp, t, 1, 1, mb, v, 0)
            for dp, pp, t, mb, v in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2), (1, 2, 4), (1, 2, 3))
            if (pp > 1 or v == 1) and SPEC.layers % (pp * v) == 0]
    return LayoutBatch.of_rows(rows)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("stage", ["first", "middle", "last"])
def test_unit_totals_match_per_shape(tied: bool, stage: str) -> None:
    spec = replace(SPEC, tied_embeddings=tied)
    d = dims_of(spec, TrainingSpec(global_batch=32))
    b = _batch()
    single = b.pp == 1
    first = (single | (stage == "first")).astype(np.int64)
    last = (single | (stage == "last")).astype(np.int64)
    n = b.dp  # the zero group: dp (1 to 8 ranks)
    got = np.stack(unit_totals(d, "1d", b, first, last, n), axis=1)
    layers = stage_layers(d.L, b.pp, b.v, first, last)
    n_micro = np.maximum(d.global_batch // (b.dp * b.mb), 1)
    want = np.array([_unit_totals("1d", param_dims(d), int(b.t[i]), int(b.q[i]), int(layers[i]), bool(first[i]),
                                  bool(last[i]), int(n[i]), int(b.pp[i]), int(b.v[i]), int(n_micro[i]))
                     for i in range(len(b))], dtype=np.int64)
    assert len(b) > 100 and (b.pp > 1).sum() > 50 and (n_micro == 1).any()  # the cases the batch must cover
    np.testing.assert_array_equal(got, want)
