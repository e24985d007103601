"""The explicit list of CommEvents of one training step, collective by collective.

serial / dp / 1d / 2d / 3d follow docs/algorithms.md to the letter. Derived here (the executor does not
run them yet; documented so the executor can follow):
- 1d + sequence parallelism (Korthikanti et al. 2022): every block all_reduce [T, h] becomes an all_gather
  before the column-parallel linear (fwd; its backward is a reduce_scatter) and a reduce_scatter after the
  row-parallel linear (fwd; backward all_gather). The embedding's fwd all_reduce becomes a reduce_scatter
  (bwd all_gather, fp32); the head gets fwd all_gather / bwd reduce_scatter [T, h] (c). Parameters used on
  sequence shards (norms, row-parallel biases, pos_emb) get one fused all_reduce of their gradients over
  `tp` per step (phase grad_sync, fp32).
- 2.5d (Tesseract): each depth layer `dep` runs the 2d algorithm on its T/d tokens (axes row/col unchanged,
  payloads with T/d); weights are replicated over `dep`, so the per-step gradient all_reduce runs over
  ("dp", "dep") (one fused group, data-parallel style) instead of ("dp",).
- pipeline (pp > 1): the events of ONE stage (layers / pp blocks; embedding on the first stage, final norm,
  head and loss on the last). Per micro-batch, a `send` of the stage's local activation shard
  [T, h] / act_split (compute dtype) over ("pp",) at every virtual-stage boundary it owns: first stage
  v fwd + (v-1) bwd, middle v + v, last (v-1) fwd + v bwd. The grad-norm all_reduce runs over
  ("pp", *tensor axes).
A group of size 1 issues nothing.
"""

from __future__ import annotations

from paracube.cost_models.dims import Dims, padded_vocab, vocab_split
from paracube.estimate import CommEvent
from paracube.layout import Layout

F32 = "float32"


class _Log:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.events: list[CommEvent] = []

    def add(self, kind: str, axes: tuple[str, ...], payload: int, dtype: str, phase: str, label: str) -> None:
        n = 1
        for a in axes:
            n *= self.layout.axis_size(a)
        if n > 1:
            self.events.append(CommEvent(kind, axes, n, int(payload), dtype, phase, label))


def _phases(d: Dims) -> tuple[str, ...]:
    return ("fwd", "recompute") if d.recompute == "full" else ("fwd",)


def _block_1d(log: _Log, d: Dims, T: int, sp: bool, i: int) -> None:
    c, h = d.c, d.h
    for ph in _phases(d):
        for name in ("attn", "mlp"):
            if sp:
                log.add("all_gather", ("tp",), c * T * h, d.dtype, ph, f"layers.{i}.{name}.in")
                log.add("reduce_scatter", ("tp",), c * T * h, d.dtype, ph, f"layers.{i}.{name}.out")
            else:
                log.add("all_reduce", ("tp",), c * T * h, d.dtype, ph, f"layers.{i}.{name}.g")
    for name in ("attn", "mlp"):
        if sp:
            log.add("reduce_scatter", ("tp",), c * T * h, d.dtype, "bwd", f"layers.{i}.{name}.in")
            log.add("all_gather", ("tp",), c * T * h, d.dtype, "bwd", f"layers.{i}.{name}.out")
        else:
            log.add("all_reduce", ("tp",), c * T * h, d.dtype, "bwd", f"layers.{i}.{name}.f")


def _micro_1d(log: _Log, d: Dims, T: int, first: bool, last: bool, layers: int) -> None:
    sp = log.layout.sequence_parallel
    if first:
        if sp:
            log.add("reduce_scatter", ("tp",), 4 * T * d.h, F32, "fwd", "embedding")
            log.add("all_gather", ("tp",), 4 * T * d.h, F32, "bwd", "embedding")
        else:
            log.add("all_reduce", ("tp",), 4 * T * d.h, F32, "fwd", "embedding")
    for i in range(layers):
        _block_1d(log, d, T, sp, i)
    if last:
        if sp:
            log.add("all_gather", ("tp",), d.c * T * d.h, d.dtype, "fwd", "head.in")
            log.add("reduce_scatter", ("tp",), d.c * T * d.h, d.dtype, "bwd", "head.in")
        else:
            log.add("all_reduce", ("tp",), d.c * T * d.h, d.dtype, "bwd", "head.f")
        log.add("all_reduce", ("tp",), 4 * T, F32, "fwd", "loss.max")
        log.add("all_reduce", ("tp",), 8 * T, F32, "fwd", "loss.sum")


def _linear_2d(
    log: _Log,
    d: Dims,
    Tq: int,
    q: int,
    h_in: int,
    h_out: int,
    bias: bool,
    phase: str,
    label: str,
    backward: bool,
) -> None:
    c = d.c
    if not backward:
        log.add("all_gather", ("col",), c * Tq * h_in, d.dtype, phase, f"{label}.X")
        log.add("all_gather", ("row",), c * h_in * h_out // q, d.dtype, phase, f"{label}.A")
        if bias:
            log.add("all_gather", ("row",), 4 * h_out // q, F32, phase, f"{label}.bias")
    else:
        log.add("reduce_scatter", ("col",), c * Tq * h_in, d.dtype, "bwd", f"{label}.dX")
        log.add("reduce_scatter", ("row",), c * h_in * h_out // q, d.dtype, "bwd", f"{label}.dA")
        if bias:
            log.add("reduce_scatter", ("row",), 4 * h_out // q, F32, "bwd", f"{label}.dbias")


def _norm_2d(log: _Log, d: Dims, Tq: int, q: int, phase: str, label: str, backward: bool) -> None:
    log.add(
        "all_reduce", ("col",), 4 * d.stat_width * Tq, F32, "bwd" if backward else phase, f"{label}.stats"
    )
    for _ in range(d.norm_vectors):
        kind = "reduce_scatter" if backward else "all_gather"
        log.add(kind, ("row",), 4 * d.h // q, F32, "bwd" if backward else phase, f"{label}.param")


def _micro_2d(log: _Log, d: Dims, T: int, first: bool, last: bool, layers: int) -> None:
    lay = log.layout
    q = lay.q
    Td = T // lay.depth  # 2.5d: each depth layer works on T/d tokens
    Tq = Td // q
    h = d.h
    V = padded_vocab(d.V, vocab_split(lay.mode, lay.tensor_size, q))
    if first:
        log.add("reduce_scatter", ("row",), 4 * Td * h // q, F32, "fwd", "tok_emb")
        log.add("all_gather", ("row",), 4 * Td * h // q, F32, "bwd", "tok_emb")
        if d.family == "gpt":
            log.add("all_gather", ("row",), 4 * d.s * h // q, F32, "fwd", "pos_emb")
            log.add("reduce_scatter", ("row",), 4 * d.s * h // q, F32, "bwd", "pos_emb")
    for i in range(layers):
        for backward, phases in ((False, _phases(d)), (True, ("bwd",))):
            for ph in phases:
                for n, (name, h_in, h_out, bias) in enumerate(d.linears):
                    if n in (0, 2):
                        _norm_2d(log, d, Tq, q, ph, f"layers.{i}.ln{n // 2 + 1}", backward)
                    _linear_2d(log, d, Tq, q, h_in, h_out, bias, ph, f"layers.{i}.{name}", backward)
    if last:
        for backward in (False, True):
            _norm_2d(log, d, Tq, q, "fwd", "ln_f", backward)
            _linear_2d(log, d, Tq, q, h, V, False, "fwd", "head", backward)
        log.add("all_reduce", ("col",), 4 * Tq, F32, "fwd", "loss.max")
        log.add("all_reduce", ("col",), 8 * Tq, F32, "fwd", "loss.sum")


def _linear_3d(
    log: _Log,
    d: Dims,
    T: int,
    q: int,
    h_in: int,
    h_out: int,
    bias: bool,
    roles: str,
    phase: str,
    label: str,
    backward: bool,
) -> None:
    I, W, O = roles  # noqa: N806 (the paper's names)
    c, q2 = d.c, q * q
    if not backward:
        log.add("all_gather", (I,), c * T * h_in // q2, d.dtype, phase, f"{label}.X")
        log.add("all_gather", (W,), c * h_in * h_out // q2, d.dtype, phase, f"{label}.A")
        log.add("reduce_scatter", (O,), c * T * h_out // q2, d.dtype, phase, f"{label}.Y")
        if bias:
            log.add("all_gather", (W, O), 4 * h_out // q, F32, phase, f"{label}.bias")
    else:
        log.add("all_gather", (O,), c * T * h_out // q2, d.dtype, "bwd", f"{label}.dY")
        log.add("reduce_scatter", (I,), c * T * h_in // q2, d.dtype, "bwd", f"{label}.dX")
        log.add("reduce_scatter", (W,), c * h_in * h_out // q2, d.dtype, "bwd", f"{label}.dA")
        if bias:
            log.add("reduce_scatter", (W, O), 4 * h_out // q, F32, "bwd", f"{label}.dbias")


def _norm_3d(log: _Log, d: Dims, T: int, q: int, phase: str, label: str, backward: bool) -> None:
    ph = "bwd" if backward else phase
    log.add("all_reduce", ("z",), 4 * d.stat_width * T // (q * q), F32, ph, f"{label}.stats")
    for _ in range(d.norm_vectors):
        log.add(
            "reduce_scatter" if backward else "all_gather",
            ("x", "y"),
            4 * d.h // q,
            F32,
            ph,
            f"{label}.param",
        )


ROLES_3D = ("yxz", "zxy", "yxz", "zxy")  # qkv, proj, fc, fc2: (I, W, O)


def _micro_3d(log: _Log, d: Dims, T: int, first: bool, last: bool, layers: int) -> None:
    q = log.layout.q
    h = d.h
    V = padded_vocab(d.V, q * q)
    if first:
        log.add("reduce_scatter", ("x", "y"), 4 * T * h // q, F32, "fwd", "tok_emb")
        log.add("all_gather", ("x", "y"), 4 * T * h // q, F32, "bwd", "tok_emb")
        if d.family == "gpt":
            log.add("all_gather", ("x", "y"), 4 * d.s * h // q, F32, "fwd", "pos_emb")
            log.add("reduce_scatter", ("x", "y"), 4 * d.s * h // q, F32, "bwd", "pos_emb")
    for i in range(layers):
        for backward, phases in ((False, _phases(d)), (True, ("bwd",))):
            for ph in phases:
                for n, (name, h_in, h_out, bias) in enumerate(d.linears):
                    if n in (0, 2):
                        _norm_3d(log, d, T, q, ph, f"layers.{i}.ln{n // 2 + 1}", backward)
                    _linear_3d(
                        log, d, T, q, h_in, h_out, bias, ROLES_3D[n], ph, f"layers.{i}.{name}", backward
                    )
    if last:
        for backward in (False, True):
            _norm_3d(log, d, T, q, "fwd", "ln_f", backward)
            _linear_3d(log, d, T, q, h, V, False, "yxz", "fwd", "head", backward)
        log.add("all_reduce", ("y",), 4 * T // (q * q), F32, "fwd", "loss.max")
        log.add("all_reduce", ("y",), 8 * T // (q * q), F32, "fwd", "loss.sum")


def act_split(layout: Layout) -> int:
    """Ways one rank's share of the block-boundary activations [T, h] is split."""
    if layout.mode == "1d":
        return layout.tensor_size if layout.sequence_parallel else 1
    return layout.tensor_size


def stage_events(layout: Layout, d: Dims, mb: int, stage: str = "first") -> list[CommEvent]:
    """All collectives of one step on one rank of pipeline stage `stage` (first | middle | last)."""
    log = _Log(layout)
    pp, v = layout.pp, layout.interleave
    first = pp == 1 or stage == "first"
    last = pp == 1 or stage == "last"
    layers = d.L // pp
    n_micro = d.global_batch // (layout.dp * mb)
    T = mb * d.s
    micro = {"none": None, "1d": _micro_1d, "2d": _micro_2d, "2.5d": _micro_2d, "3d": _micro_3d}[layout.mode]
    for _ in range(n_micro):
        if micro is not None:
            micro(log, d, T, first, last, layers)
        if pp > 1:
            shard = d.c * T * d.h // act_split(layout)
            for _ in range(v - (1 if last else 0)):
                log.add("send", ("pp",), shard, d.dtype, "pipeline", "activations")
            for _ in range(v - (1 if first else 0)):
                log.add("send", ("pp",), shard, d.dtype, "pipeline", "activation_grads")
    # Per step.
    if layout.sequence_parallel:
        sp_params = (
            layers * (2 * d.norm_vectors * d.h + d.row_bias)
            + (d.pos_params if first else 0)
            + (d.norm_vectors * d.h if last else 0)
        )
        log.add("all_reduce", ("tp",), 4 * sp_params, F32, "grad_sync", "sequence_parallel_params")
    grad_axes = ("dp", "dep") if layout.mode == "2.5d" else ("dp",)
    n_local = local_parameter_count(layout, d, stage)
    log.add("all_reduce", grad_axes, 4 * n_local, F32, "grad_sync", "gradients")
    opt_axes = (("pp",) if pp > 1 else ()) + layout.tensor_axes
    log.add("all_reduce", opt_axes, 4, F32, "optimizer", "grad_norm")
    log.add("all_reduce", ("dp", *layout.tensor_axes), 8, F32, "metrics", "loss")
    return log.events


def local_parameter_count(layout: Layout, d: Dims, stage: str = "first") -> int:
    """Parameters one rank stores, summed shard by shard from docs/algorithms.md (independent of the closed
    form in dims.local_params, which tests compare against this)."""
    pp, t, q = layout.pp, layout.tensor_size, layout.q
    first, last = pp == 1 or stage == "first", pp == 1 or stage == "last"
    h, mode = d.h, layout.mode
    V = padded_vocab(d.V, vocab_split(mode, t, q))
    nv = d.norm_vectors
    total = 0
    for _ in range(d.L // pp):
        for n, (_, h_in, h_out, bias) in enumerate(d.linears):
            if mode == "none":
                total += h_in * h_out + (h_out if bias else 0)
            elif mode == "1d":
                row = n in (1, 3)
                total += h_in * h_out // t + ((h_out if row else h_out // t) if bias else 0)
            elif mode in ("2d", "2.5d"):
                total += (h_in // q) * (h_out // q) + ((h_out // q) // q if bias else 0)
            else:
                total += (h_in // (q * q)) * (h_out // q) + ((h_out // q) // (q * q) if bias else 0)
        total += 2 * nv * _vec(h, mode, t, q)
    if first:
        pos = d.pos_params // d.h if d.family == "gpt" else 0
        total += {
            "none": V * h + pos * h,
            "1d": V // t * h + pos * h,
            "2d": V // q * (h // q) + pos // q * (h // q),
            "2.5d": V // q * (h // q) + pos // q * (h // q),
            "3d": V // (q * q) * (h // q) + pos // (q * q) * (h // q),
        }[mode]
    if last:
        total += nv * _vec(h, mode, t, q)
        total += {
            "none": h * V,
            "1d": h * V // t,
            "2d": (h // q) * (V // q),
            "2.5d": (h // q) * (V // q),
            "3d": (h // (q * q)) * (V // q),
        }[mode]
    return total


def _vec(h: int, mode: str, t: int, q: int) -> int:
    """Local length of one norm parameter vector."""
    return {"none": h, "1d": h, "2d": h // q // q, "2.5d": h // q // q, "3d": h // q // (q * q)}[mode]
