"""The papers' closed forms for the bytes of one transformer layer, next to what the cost model predicts.

Per-rank bytes sent by one transformer layer (forward + backward, one micro-batch of T = b*s tokens,
hidden h, FFN hidden f, p tensor ranks, e bytes per element; ring collectives: an all-reduce of n bytes
sends 2(g-1)/g n per rank, an all-gather / reduce-scatter / pipelined broadcast or reduce (g-1)/g n).
The layer's linears (h_in, h_out): qkv (h, 3h), proj (h, h), fc (h, f), fc2 (f, h); with f = 4h:
sum h_in = 7h, sum h_out = 9h, sum h_in*h_out = 12h^2. Each closed form is declared by its mode
(`TensorMode.paper_layer_bytes` and `.paper` in paracube/modes/<mode>.py, derivation in its docstring);
this overview restates them:

- 1D, Megatron-LM (Shoeybi et al. 2019, section 3; per layer two `g` all-reduces forward and two `f`
  all-reduces backward, each of the [T, h] block output):   4 * 2(p-1)/p * T h e          = O(bsh)
- 2D, Optimus (Xu et al. 2021), SUMMA on a q x q grid (p = q^2): forward C = AB takes q steps, each a
  broadcast of an activation block (T h_in / q^2) along the row and of a weight block (h_in h_out / q^2)
  along the column; backward runs the two SUMMA variants (dX = dY B^T: broadcast B, reduce dX blocks;
  dB = X^T dY: broadcast X, reduce dB blocks), i.e. twice the forward volume:
      3 * (q-1)/q * sum(T h_in + h_in h_out) / q * e                                  = O((bsh + h^2)/p^(1/2))
- 2.5D, Tesseract (Wang et al. 2021), p = q^2 d: SUMMA on each of d layers over T/d tokens, weights
  replicated over depth and their gradients all-reduced over it:
      3 * (q-1)/q * sum(T h_in / d + h_in h_out) / q * e + 2(d-1)/d * sum(h_in h_out) / q^2 * e
- 3D (Bian et al. 2021), p = q^3: per linear all-gather X over the input group (T h_in / q^2), all-gather
  A over the weight group (h_in h_out / q^2), reduce-scatter Y over the output group (T h_out / q^2),
  and the three mirrored collectives backward:
      2 * (q-1)/q * sum(T h_in + T h_out + h_in h_out) / q^2 * e                      = O((bsh + h^2)/p^(2/3))
The constants above are derived here from each paper's algorithm as stated (and in
/work/shared/docs/tensor-parallel.md), counting every element at e bytes; they are not copied from the
papers' tables. Where the model's constant differs, and why:
- 1D: none (ratio 1 exactly; the model's per-layer events are exactly these four all-reduces).
- 2D / 2.5D: the executor all-gathers X and A once forward and keeps them for backward, where only dX and
  dA are reduce-scattered: 2 instead of SUMMA's 3 passes (ratio -> 2/3). Plus LayerNorm statistics
  (all-reduce [T/q, 2] fp32 per norm, fwd and bwd) and norm / bias slices gathered in fp32. The 2.5D
  depth gradient all-reduce is one per-step fp32 buffer (`grad_sync`): its per-layer share is counted
  in proportion to the layer's parameters, at 4 bytes instead of e.
- 2D SUMMA variant (`tp=2d:QxQ,summa`, the closed form above as the model issues it: q broadcast steps per
  GEMM operand, broadcast + reduce backward): ratio 1 plus the same norm / bias traffic as 2D.
- 3D: LayerNorm statistics ([T/q^2, 2] fp32 over the hidden axis) and norm / bias slices all-gathered in
  fp32 over a plane of q^2 ranks: a few per cent at realistic sizes (ratio -> 1 as T h grows).
Not in any per-layer count: the embedding, head and loss (see planner/verdict.py for their share of a step).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from paracube.layout import Layout
from paracube.modes import MODES as DECLARED
from paracube.modes import TensorMode
from paracube.workload import DTYPE_BYTES, ModelSpec, TrainingSpec

MODES = tuple(name for name, m in DECLARED.items() if m.axes)  # the tensor modes: each has a paper's closed form


def layer_linears(h: int, f: int | None = None) -> list[tuple[str, int, int]]:
    """(name, h_in, h_out) of the four linears of one GPT block."""
    f = 4 * h if f is None else f
    return [("qkv", h, 3 * h), ("proj", h, h), ("fc", h, f), ("fc2", f, h)]


def _mode(mode: str) -> TensorMode:
    """The declaration of a tensor mode (ValueError naming the valid ones otherwise)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}; valid: {', '.join(MODES)}")
    return DECLARED[mode]


def exact_shapes(mode: str, p: int) -> list[tuple[int, ...]]:
    """The mode's shapes of exactly p ranks with every axis > 1 (all p GPUs in one tensor group)."""
    return [s for s in _mode(mode).shapes(p) if math.prod(s) == p and all(x > 1 for x in s)]


def shape_for(mode: str, p: int, depth: int | None = None) -> tuple[int, ...] | None:
    """The tensor shape of `mode` over p ranks used in the tables: the largest grid side among
    `exact_shapes` (a mode with a depth axis, 2.5D: depth `depth`, or by default the largest q with depth
    >= 2)."""
    m, shapes = _mode(mode), exact_shapes(mode, p)
    if depth and any(m.depth(s) != 1 for s in shapes):
        shapes = [s for s in shapes if m.depth(s) == depth]
    return max(shapes, key=lambda s: s[0], default=None)


def ring_factor(mode: str, shape: tuple[int, ...]) -> float:
    """(g-1)/g of the groups the mode's main collectives run over (p for 1D, q otherwise): divide bytes
    by it to read the asymptotic exponent of p off a small grid."""
    g = shape[0]
    return (g - 1) / g


def theory_layer_bytes(mode: str, b: int, s: int, h: int, shape: tuple[int, ...], e: int = 2,
                       f: int | None = None) -> float:
    """Bytes one rank sends for one transformer layer, forward + backward, per the papers (the mode's
    `paper_layer_bytes`; module docstring)."""
    return _mode(mode).paper_layer_bytes(b * s, layer_linears(h, f), shape, e)


def model_layer_bytes(model: ModelSpec, training: TrainingSpec, layout: Layout, topo: object,
                      layer: int = 0) -> float:
    """Bytes one rank sends for transformer layer `layer` in one micro-batch, from the cost model's events.

    `training.global_batch` must equal dp * micro-batch (one micro-batch per step). A mode whose gradients
    are also all-reduced over tensor axes (`grad_axes` beyond dp; 2.5D's depth): plus the layer's share of
    that per-step all-reduce, unless the model already labels it per layer."""
    from paracube.cost_models.analytic import estimate  # local: the tables are optional

    est = estimate(model, training, layout, topo)
    prefix = f"layers.{layer}."
    mine = [ev for ev in est.events if ev.label.startswith(prefix)]
    sent = sum(ev.sent_bytes() for ev in mine)
    tensor_grad = set(DECLARED[layout.mode].grad_axes) - {"dp"}
    if tensor_grad and not any(tensor_grad & set(ev.axes) for ev in mine):
        share = model.layer_parameters() / model.num_parameters()
        sent += share * sum(ev.sent_bytes() for ev in est.events
                            if ev.phase == "grad_sync" and tensor_grad & set(ev.axes))
    return sent


@dataclass(frozen=True)
class LayerRow:
    mode: str
    b: int
    s: int
    h: int
    p: int
    model_bytes: float
    theory_bytes: float
    shape: tuple[int, ...] = ()

    @property
    def ratio(self) -> float:
        """model / theory."""
        return self.model_bytes / self.theory_bytes


def _spec(h: int, shape: tuple[int, ...], mode: str, s: int) -> ModelSpec:
    """A GPT whose sizes divide the mode at this shape (64 heads, or the mode's head split if larger)."""
    heads = max(64, int(_mode(mode).head_split(math.prod(shape), shape[0])))
    return ModelSpec(f"theory-h{h}", layers=2, hidden=h, heads=min(heads, h), ffn_hidden=4 * h,
                     vocab=51200, seq_len=s)


def layer_bytes_table(modes: Sequence[str] = MODES, batches: Iterable[int] = (64,), seqs: Iterable[int] = (512,),
                      hiddens: Iterable[int] = (4096,), ps: Iterable[int] = (8, 64, 512), dtype: str = "fp16",
                      topo: object | None = None, depth: int | None = None) -> list[LayerRow]:
    """Rows (mode, b, s, h, p, model bytes, theory bytes; .ratio) of one layer's bytes per rank, for every
    grid point where the mode has a shape over p and the model's size rules hold (others are skipped)."""
    from paracube.errors import ParacubeError
    from paracube.topologies import load_topology

    rows: list[LayerRow] = []
    e = DTYPE_BYTES[dtype]
    grid = [(m, b, s, h, p) for m in modes for b in batches for s in seqs for h in hiddens for p in ps]
    topos: dict[int, object] = {}
    for mode, b, s, h, p in grid:
        shape = shape_for(mode, p, depth)
        if shape is None:
            continue
        lay = Layout(mode=mode, shape=shape, micro_batch=b)  # type: ignore[arg-type]
        if topo is None and p not in topos:
            topos[p] = load_topology("dgx-h100", gpus=p)  # bytes do not depend on the machine
        try:
            got = model_layer_bytes(_spec(h, shape, mode, s), TrainingSpec(global_batch=b, dtype=dtype),  # type: ignore[arg-type]
                                    lay, topo or topos[p])
        except ParacubeError:
            continue
        rows.append(LayerRow(mode, b, s, h, p, got, theory_layer_bytes(mode, b, s, h, shape, e), shape))
    return rows


def scaling_exponent(rows: Sequence[LayerRow], var: str, which: str = "model", strip_ring: bool = True) -> float:
    """Least-squares slope of log(bytes) against log(var) (var: "p", "h" or "T" = b*s) over `rows`.

    `strip_ring` divides by the ring factor (g-1)/g first, so the slope is the asymptotic exponent."""
    xs, ys = [], []
    for r in rows:
        x = {"p": r.p, "h": r.h, "T": r.b * r.s}[var]
        y = r.model_bytes if which == "model" else r.theory_bytes
        if strip_ring:
            y /= ring_factor(r.mode, r.shape)
        xs.append(math.log(x))
        ys.append(math.log(y))
    if len(set(xs)) < 2:
        raise ValueError(f"need at least two distinct values of {var} to fit a slope")
    return float(np.polyfit(xs, ys, 1)[0])


def format_table(rows: Sequence[LayerRow]) -> str:
    """The rows as aligned text (MB = 10^6 bytes)."""
    lines = [f"{'mode':5} {'shape':9} {'b':>4} {'s':>5} {'h':>6} {'p':>4} {'model MB':>10} {'theory MB':>10} "
             f"{'ratio':>6}"]
    for r in rows:
        shape = "x".join(map(str, r.shape))
        lines.append(f"{r.mode:5} {shape:9} {r.b:4d} {r.s:5d} {r.h:6d} {r.p:4d} {r.model_bytes / 1e6:10.1f} "
                     f"{r.theory_bytes / 1e6:10.1f} {r.ratio:6.3f}")
    return "\n".join(lines)


__all__ = ["MODES", "LayerRow", "exact_shapes", "format_table", "layer_bytes_table", "layer_linears",
           "model_layer_bytes", "ring_factor", "scaling_exponent", "shape_for", "theory_layer_bytes"]
