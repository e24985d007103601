"""Each tensor mode's declaration (paracube/modes) against what the executor's layers really issue.

tests/test_fidelity.py compares whole training steps; here every piece of the model is run alone on the
ranks of one layout (embedding, one transformer block, final norm + head + cross-entropy), forward then
backward, and the collectives the executor records (kind, mesh axes, payload bytes, dtype, phase) must be
exactly the multiset the mode declares for that piece (`embedding`, `layer_fwd` + `layer_bwd`, `head`),
in fp32 and in bf16 (parameters in bf16). Plus the registry's own consistency: shapes, axis sizes, splits and the
executor's implementations.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest
import torch
from dist_helpers import run_distributed

from paracube.cost_models.dims import Dims, dims_of
from paracube.cost_models.traffic import layout_sizes
from paracube.executor import Mesh, build_model
from paracube.executor.model.gpt import MODES as EXECUTOR_MODES
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.modes import MODES, runnable_modes
from paracube.modes.base import COMPUTE, Collective
from paracube.workload import ModelSpec, TrainingSpec

SPEC = ModelSpec("modes", layers=1, hidden=32, heads=8, ffn_hidden=128, vocab=64, seq_len=16)
B = 4  # sequences of the micro-batch
LAYOUTS = ["dp=1,tp=1d:2", "dp=1,tp=2d:2x2", "dp=1,tp=2.5d:2x2x2", "dp=1,tp=3d:2x2x2"]  # every runnable mode
# with a tensor group
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
Key = tuple[str, tuple[str, ...], int, str, str]  # kind, axes, payload bytes, dtype, phase


def _keys(events: list) -> list[Key]:
    return [(e.kind, tuple(e.axes), e.payload_bytes, e.dtype, e.phase) for e in events]


def _record(model: Any, ids: torch.Tensor, labels: torch.Tensor) -> dict[str, list[Key]]:
    """Forward each piece (its input a detached leaf), then backward each: the events of each piece."""
    rec = model.mesh.recorder
    spans: dict[str, list] = {"embedding": [], "block": [], "head": []}

    def run(piece: str, phase: str, fn: Any) -> Any:
        start = len(rec.events)
        with rec.phase(phase):
            y = fn()
        spans[piece] += rec.events[start:]
        return y

    x0 = run("embedding", "fwd", lambda: model.embed(ids))
    x1_in = x0.detach().requires_grad_()
    x1 = run("block", "fwd", lambda: model.blocks[0](x1_in, None, ids.shape[1]))
    x2_in = x1.detach().requires_grad_()
    loss = run("head", "fwd", lambda: model.token_losses(x2_in, labels).sum())
    run("head", "bwd", loss.backward)
    run("block", "bwd", lambda: x1.backward(x2_in.grad.to(x1.dtype)))
    run("embedding", "bwd", lambda: x0.backward(x1_in.grad.to(x0.dtype)))
    model.zero_grad(set_to_none=True)
    rec.reset()
    return {piece: _keys(evs) for piece, evs in spans.items()}


def _pieces(rank: int, world: int, layout_text: str) -> dict[str, dict[str, list[Key]]]:
    """Per dtype, per piece (embedding, block, head): the collectives this rank recorded."""
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, SPEC.vocab, (B, SPEC.seq_len), generator=gen)
    labels_full = torch.randint(0, SPEC.vocab, (B, SPEC.seq_len), generator=gen)
    out: dict[str, dict[str, list[Key]]] = {}
    for dtype, torch_dtype in DTYPES.items():
        model = build_model(SPEC, mesh, seed=1, dtype=torch_dtype)
        out[dtype] = _record(model, ids, model.mode.split_tokens(labels_full))
    return out


def _declared(layout: Layout, d: Dims, colls: list[Collective], phase: str | None = None) -> list[Key]:
    """The declared collectives on this layout, as the executor would record them."""
    sizes = layout_sizes(layout, d, B)
    out = []
    for c in colls:
        if (c.when == "sp") != layout.sequence_parallel and c.when:
            continue
        if c.applies is not None and not c.applies(sizes):  # e.g. a split sequence's key / value gather
            continue
        if math.prod(layout.axis_size(a) for a in c.axes) > 1:
            out.append((c.kind, c.axes, int(c.payload(sizes)), d.dtype if c.dtype == COMPUTE else c.dtype,
                        phase or c.phase))
    return out


def declared_pieces(layout: Layout, dtype: str) -> dict[str, list[Key]]:
    mode = layout.tensor_mode
    d = dims_of(SPEC, TrainingSpec(global_batch=B, dtype={"float32": "fp32", "bfloat16": "bf16"}[dtype]))
    return {
        "embedding": _declared(layout, d, mode.embedding(d)),
        "block": _declared(layout, d, mode.layer_fwd(d), "fwd") + _declared(layout, d, mode.layer_bwd(d), "bwd"),
        "head": _declared(layout, d, mode.head(d)),
    }


@pytest.fixture(scope="module", params=LAYOUTS)
def recorded(request: pytest.FixtureRequest) -> tuple[Layout, list[dict]]:
    layout = parse_layout(request.param)
    return layout, run_distributed(_pieces, layout.world_size, request.param)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_layers_issue_the_declared_collectives(recorded: tuple[Layout, list[dict]], dtype: str) -> None:
    """Per piece of the model: recorded == declared, as multisets of (kind, axes, bytes, dtype, phase)."""
    layout, results = recorded
    want = declared_pieces(layout, dtype)
    assert all(want.values()), want  # every piece of a tensor-parallel mode communicates
    for rank, pieces in enumerate(results):
        for piece, events in pieces[dtype].items():
            got, exp = Counter(events), Counter(want[piece])
            assert got == exp, (rank, piece, {"unpredicted": got - exp, "missing": exp - got})


def test_the_executor_runs_what_the_registry_says() -> None:
    assert tuple(EXECUTOR_MODES) == runnable_modes()
    for name, cls in EXECUTOR_MODES.items():
        assert cls.name == name
    assert {parse_layout(t).mode for t in LAYOUTS} | {"none"} == set(runnable_modes())


@pytest.mark.parametrize("name", list(MODES))
def test_registry_shapes_axes_and_splits(name: str) -> None:
    """Every enumerated shape is valid, its axis sizes multiply to the tensor size, and the token and
    vocabulary splits divide it."""
    mode = MODES[name]
    assert mode.name == name and set(mode.axis_sizes(2, 8, 2)) == set(mode.axes)
    for shape in mode.shapes(64):
        layout = Layout(mode=name, shape=shape)
        sizes = [layout.axis_size(a) for a in layout.tensor_axes]
        assert mode.shape_ok(shape) and math.prod(sizes) == layout.tensor_size and 64 % layout.tensor_size == 0
        assert layout.tensor_size % layout.token_split == 0
        assert layout.tensor_size % mode.vocab_split(layout.tensor_size, layout.q) == 0


def test_a_mode_is_named_only_where_it_is_declared() -> None:
    """Issue 11: no branch on a mode's name outside its own modules (paracube/modes/<mode>.py, the executor's
    <mode>.py) and the registry; everything else reads the declaration (`MODES[name].<field>`)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[1] / "paracube"
    names = [re.escape(f'"{m}"') for m in MODES if MODES[m].axes]
    pattern = re.compile("|".join(names))
    found = {str(p.relative_to(root)) for p in root.rglob("*.py") if pattern.search(p.read_text())}
    own = {f"{pkg}/{stem}.py" for pkg in ("modes", "executor/layers")
           for stem in ("one_d", "two_d", "two_d_summa", "two_half_d", "three_d")}
    assert found <= own | {"modes/__init__.py"}, sorted(found - own)
    for name, mode in MODES.items():  # the declarations those readers use
        assert mode.dispatches_like in ("", *MODES) and mode.dispatches_like != name
        assert (not mode.axes) == math.isnan(mode.paper_layer_bytes(64, [("qkv", 8, 24)], (2,) * len(mode.axes), 2))
