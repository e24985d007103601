"""Each parallel layer against its serial counterpart, per tensor mode: output, input gradient and every
parameter gradient (fp32, relative error <= 1e-5), plus the collectives one linear issues.

Layers: LayerNorm, one linear of each role (1D column/row; 3D roles (y, x, z) and (z, x, y)), the MLP
and attention sub-blocks, the embeddings, and head + cross-entropy. One process pool per layout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from dist_helpers import rel_err, run_distributed

from paracube.executor import Mesh, build_model, serial_reference
from paracube.executor.layers.shards import block
from paracube.layout import Layout
from paracube.layout_parse import parse_layout
from paracube.modes import MODES
from paracube.workload import ModelSpec

SPEC = ModelSpec("test", layers=1, hidden=32, heads=8, ffn_hidden=128, vocab=64, seq_len=16)
B = 4
TOL = 1e-5
LAYOUTS = ["dp=1,tp=1d:4", "dp=1,tp=2d:2x2", "dp=1,tp=3d:2x2x2"]

# Activation layouts: (sequence axes, hidden axes) for the block boundary and after qkv/fc.
ACTS: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "1d": {"block": ((), ()), "inner": ((), ("tp",))},
    "2d": {"block": (("row",), ("col",)), "inner": (("row",), ("col",))},
    "3d": {"block": (("x", "y"), ("z",)), "inner": (("x", "z"), ("y",))},
}


def local_block(t: torch.Tensor, mesh: Mesh, axes: tuple[tuple[str, ...], tuple[str, ...]]) -> torch.Tensor:
    """This rank's block of a full activation [b, s, h]: sequences (the flat token layout of 2D / 3D: the
    flattened b x s tokens, executor/layers/tokens.py) over axes[0], hidden over axes[1]."""
    if MODES[mesh.layout.mode].token_axes:
        t = t.reshape(-1, t.shape[-1])
    (b0, bn), (h0, hn) = block(t.shape[0], mesh, axes[0]), block(t.shape[-1], mesh, axes[1])
    return t[b0:b0 + bn, ..., h0:h0 + hn]


def compare(name: str, errs: dict[str, float], mesh: Mesh, par: torch.nn.Module, ref: torch.nn.Module,
            par_fn: Callable, ref_fn: Callable, x_full: torch.Tensor,
            cut_in: Callable[[torch.Tensor], torch.Tensor], cut_out: Callable[[torch.Tensor], torch.Tensor]) -> list:
    """Forward both, backward a random cotangent, record relative errors; returns the parallel events."""
    gen = torch.Generator().manual_seed(99)
    differentiable = x_full.is_floating_point()
    x_ref = x_full.clone().requires_grad_(differentiable)
    y_ref = ref_fn(x_ref)
    dy = torch.randn(y_ref.shape, generator=gen)
    (y_ref * dy).sum().backward()

    x = cut_in(x_full).clone().requires_grad_(differentiable)
    mesh.recorder.reset()
    with mesh.recorder.phase("fwd"):
        y = par_fn(x)
    with mesh.recorder.phase("bwd"):
        (y * cut_out(dy)).sum().backward()
    errs[f"{name}.out"] = rel_err(y, cut_out(y_ref))
    if differentiable:
        errs[f"{name}.dx"] = rel_err(x.grad, cut_in(x_ref.grad))
    ref_params = dict(ref.named_parameters())
    for pname, p in par.named_parameters():
        spec = _spec(par, pname)
        errs[f"{name}.grad:{pname}"] = rel_err(p.grad, spec.take(_padded_like(ref_params[pname].grad,
                                                                                spec.global_shape)))
    return list(mesh.recorder.events)


def _padded_like(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The serial tensor with its vocabulary padding (zeros) matched to the parallel model's (Megatron pads to a
    multiple of 128 x the vocab split, so the two pad differently)."""
    out = t.new_zeros(shape)
    common = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, shape, strict=True))
    out[common] = t[common]
    return out


def _spec(module: torch.nn.Module, name: str) -> Any:
    owner, _, leaf = name.rpartition(".")
    return (module.get_submodule(owner) if owner else module).shard_specs[leaf]


def check_layers(rank: int, world: int, layout_text: str) -> dict[str, Any]:
    layout = parse_layout(layout_text)
    mesh = Mesh(layout, rank)
    model, ref = build_model(SPEC, mesh, seed=3), serial_reference(SPEC, seed=3)
    acts = ACTS[layout.mode]
    gen = torch.Generator().manual_seed(5)
    h, f, s = SPEC.hidden, SPEC.ffn_hidden, SPEC.seq_len
    x = torch.randn(B, s, h, generator=gen) + 0.5  # a non-zero mean exercises the LayerNorm statistics
    x_inner = torch.randn(B, s, f, generator=gen)
    ids = torch.randint(0, SPEC.vocab, (B, s), generator=gen)
    labels = torch.randint(0, SPEC.vocab, (B, s), generator=gen)

    def cut(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda t: local_block(t, mesh, acts[kind])

    errs: dict[str, float] = {}
    events: dict[str, list] = {}
    pb, rb = model.blocks[0], ref.blocks[0]
    cases = [
        ("ln", pb.ln1, rb.ln1, x, "block", "block"),
        ("fc", pb.mlp.fc, rb.mlp.fc, x, "block", "inner"),  # 1D column; 3D roles (y, x, z)
        ("fc2", pb.mlp.fc2, rb.mlp.fc2, x_inner, "inner", "block"),  # 1D row; 3D roles (z, x, y)
        ("mlp", pb.mlp, rb.mlp, x, "block", "block"),
        ("attn", pb.attn, rb.attn, x, "block", "block"),
    ]
    for name, par, refm, inp, kin, kout in cases:
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        par_fn = (lambda t, m=par: m(t, None, s)) if name == "attn" else par  # attention: sequences of s tokens
        events[name] = compare(name, errs, mesh, par, refm, par_fn, refm, inp, cut(kin), cut(kout))

    # Embeddings: every rank sees the whole micro-batch of ids; output in the block layout.
    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    emb_par = torch.nn.ModuleDict({"tok_emb": model.tok_emb, "pos_emb": model.pos_emb})
    emb_ref = torch.nn.ModuleDict({"tok_emb": ref.tok_emb, "pos_emb": ref.pos_emb})
    events["embed"] = compare("embed", errs, mesh, emb_par, emb_ref, model.embed, ref.embed, ids,
                              lambda t: t, cut("block"))

    # Head + cross-entropy: per-token losses of this rank's sequences (labels split by the model).
    model.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    split = model.mode.split_tokens
    events["head"] = compare("head", errs, mesh, model.head, ref.head,
                             lambda xl: model.token_losses(xl, split(labels)),
                             lambda xf: ref.token_losses(xf, labels), x, cut("block"), split)
    summary = {k: Counter((e.kind, e.axes, e.phase) for e in v) for k, v in events.items()}
    return {"errors": errs, "events": summary}


@pytest.fixture(scope="module", params=LAYOUTS)
def layer_results(request: pytest.FixtureRequest) -> tuple[Layout, list[dict[str, Any]]]:
    layout = parse_layout(request.param)
    return layout, run_distributed(check_layers, layout.world_size, request.param)


def test_every_layer_matches_serial(layer_results: tuple[Layout, list[dict]]) -> None:
    _, results = layer_results
    for rank, r in enumerate(results):
        names = {k.split(".")[0] for k in r["errors"]}
        assert names == {"ln", "fc", "fc2", "mlp", "attn", "embed", "head"}
        assert "head.grad:weight" in r["errors"] and "embed.grad:tok_emb.weight" in r["errors"]
        bad = {k: v for k, v in r["errors"].items() if not v <= TOL}
        assert not bad, f"rank {rank}: relative errors above {TOL}: {bad}"


def expected_linear_events(layout: Layout, kind: str) -> Counter:
    """The collectives of one biased linear, fwd + bwd (docs/algorithms.md)."""
    if layout.mode == "1d":  # column: f all-reduces dX in backward; row: g all-reduces Y in forward
        return Counter({("all_reduce", ("tp",), "bwd" if kind == "fc" else "fwd"): 1})
    if layout.mode == "2d":
        return Counter({("all_gather", ("col",), "fwd"): 1, ("all_gather", ("row",), "fwd"): 2,
                        ("reduce_scatter", ("col",), "bwd"): 1, ("reduce_scatter", ("row",), "bwd"): 2})
    i, w, o = ("y", "x", "z") if kind == "fc" else ("z", "x", "y")
    return Counter({("all_gather", (i,), "fwd"): 1, ("all_gather", (w,), "fwd"): 1,
                    ("reduce_scatter", (o,), "fwd"): 1, ("all_gather", (w, o), "fwd"): 1,
                    ("all_gather", (o,), "bwd"): 1, ("reduce_scatter", (i,), "bwd"): 1,
                    ("reduce_scatter", (w,), "bwd"): 1, ("reduce_scatter", (w, o), "bwd"): 1})


def test_linear_collectives(layer_results: tuple[Layout, list[dict]]) -> None:
    layout, results = layer_results
    for r in results:
        for kind in ("fc", "fc2"):
            assert r["events"][kind] == expected_linear_events(layout, kind)
        # A LayerNorm's statistics: one all-reduce each way over the axis holding the hidden split.
        ln = r["events"]["ln"]
        stats_axis = {"1d": None, "2d": ("col",), "3d": ("z",)}[layout.mode]
        if stats_axis is None:
            assert ln == Counter()  # replicated LayerNorm: no communication
        else:
            assert ln[("all_reduce", stats_axis, "fwd")] == 1 and ln[("all_reduce", stats_axis, "bwd")] == 1
