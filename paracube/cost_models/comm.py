"""One step's communication in closed form, vectorized over layouts, and its alpha-beta time.

`comm_entries` returns, per (kind, axes, dtype), the number of calls and the summed payload of one step on
one rank of one pipeline stage, as numpy arrays over a LayoutBatch. It is derived from the SAME
declaration as the explicit list (traffic.py): each collective a mode declares (paracube/modes) has its
payload evaluated once on the batch's arrays and is counted
    layer forward:  N * R * Ls   (R = 2 with full recomputation: forward collectives issued twice)
    layer backward: N * Ls
    layer again:    N * Ls       (rcm=: recompute_modules_cost.again_collectives; with tpo, per configuration, the
                                  rings issued inside their GEMM's Function too)
    embedding:      N * F        head / loss: N * H
    per step:       1 (gradients: one call per bucket, counted from the same bucket list as traffic.py)
    kept (kw=1):    a `kept` collective (weight gather / its gradient's reduce-scatter) Ls, F or H times
                    (once per step: no N, no R)
with N micro-batches, Ls blocks per stage, F / H = 1 when the stage holds the embedding / the head. Entries
whose group has one rank count zero calls. tests/test_cost_model.py proves, for many layouts, that these
sums equal the sums over the explicit list.

Time of `count` calls on a group of n ranks (cost_models/collective.py: ring latency and bytes sent), on
the link the topology's group_link reports, or on the calibrated (latency, bandwidth) of that kind and
group size (`paracube calibrate`, measured with every rank busy). Modes whose consecutive collectives
alternate mesh axes (mode.alternating: 2D, 2.5D, 3D) read the alternating-groups fit. No overlap: the
executor runs tensor-parallel collectives in line with compute and the data-parallel gradient all_reduce
after the last backward, so all communication time is exposed (the event engine's `overlap` option models
gradient buckets issued during the backward). With `tpo` (Layout.tpo) the collectives a mode declares
overlappable (Collective.tpo) are summed apart, one entry per GEMM they overlap (Entry.tpo), so that
analytic.py can price their exposed part only (cost_models/tpo.py); their bytes are the same.

`zero` (a scalar for the whole batch, the layout's zero): 1 prices the distributed optimizer's
reduce_scatter + all_gather per bucket over grad_axes (dp; 2.5D: dp, dep) and the grad-norm all_reduce over
dp too (traffic.py). zero=2/3 (traffic._zero_micro_batch; `shard`: the HSDP shard group, None = all of dp),
per FSDP unit u of padded length P_u: per micro-batch a reduce_scatter of 4 P_u (count N units) and, zero=3,
all_gathers of c P_u before every unit's forward and all but the last unit's backward (N (2 units - 1) calls);
with pipelines one reduce_scatter per unit per step (the last micro-batch's) and 2 N units gathers;
per step, HSDP's all_reduce of 4 P_u / n over dp_replicate and zero=2's fp32 all_gather of 4 P_u.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

import numpy as np

from paracube.cost_models import fp8
from paracube.cost_models.collective import latency_factor, sent_factor
from paracube.cost_models.comm_axes import cp_after_dp
from paracube.cost_models.comm_entry import Entry
from paracube.cost_models.context_parallel import is_ring
from paracube.cost_models.dims import Dims, local_params
from paracube.cost_models.fsdp_units import unit_totals
from paracube.cost_models.local_parameters import parameter_units
from paracube.cost_models.param_dims import param_dims
from paracube.cost_models.recompute_again import again_collectives
from paracube.modes import MODES, LayoutBatch, context
from paracube.modes.base import COMPUTE, F32, Collective, Sizes, padded
from paracube.modes.buckets import BUCKET_BYTES, bucket_sizes, padded_numel
from paracube.modes.sinks import sink_collectives
from paracube.modes.stages import stage_layers

Arr = np.ndarray
Key = tuple[str, tuple[str, ...], str]  # (kind, axes, dtype)
SOURCES = ("layer_fwd", "layer_bwd", "embedding", "head")

__all__ = ["Entry", "StepTraffic", "comm_entries", "stage_layers_params"]


def stage_layers_params(d: Dims, mode: str, b: LayoutBatch, first: Arr, last: Arr) -> Arr:
    """Closed form of local parameters per rank of a stage (dims.local_params, vectorized)."""
    return local_params(d, mode, b.t, b.q, stage_layers(d.L, b.pp, b.v, first, last), first, last)


@lru_cache(maxsize=64)
def _declared(mode: str, d: Dims) -> tuple[tuple[str, tuple[Collective, ...]], ...]:
    """The mode's per-micro-batch collectives by source (built once per mode and model dimensions)."""
    m = MODES[mode]
    out = [(source, tuple(getattr(m, source)(d))) for source in SOURCES]
    out.append(("layer_bwd", tuple(sink_collectives(d, m))))  # GPT-OSS's sinks (modes/sinks.py; none without)
    fwd = m.layer_fwd(d)
    again = again_collectives(d, fwd)
    out.append(("layer_again", tuple(again)))  # rcm=mlp (recompute_modules_cost.py)
    # and with tpo (the layouts whose StepTraffic.tpo is set): the output's ring reduce-scatter inside fc2's Function
    ids = set(map(id, again))
    out.append(("layer_again_tpo", tuple(c for c in again_collectives(d, fwd, True) if id(c) not in ids)))
    if d.cp > 1:  # the key / value exchange (modes/context.py); its p2p ring steps: context_parallel.py
        unit = context.attention_unit(m)
        for source, colls in (("layer_fwd", context.layer_fwd(d, d.cp_comm, unit)),
                              ("layer_bwd", context.layer_bwd(d, d.cp_comm, unit))):
            out.append((source, tuple(c for c in colls if not is_ring(c.kind, c.axes))))
        cp_again = again_collectives(d, context.layer_fwd(d, d.cp_comm, unit))  # the core's re-run (Megatron-core)
        out.append(("layer_again", tuple(c for c in cp_again if not is_ring(c.kind, c.axes))))
    return tuple(out)


class StepTraffic:
    """The declared collectives of one mode summed per (kind, axes, dtype) and per source (layer forward,
    layer backward, embedding, head) for every layout of a batch; `entries` scales them to a stage."""

    def __init__(self, d: Dims, mode: str, b: LayoutBatch, zero: int = 0, bucket_bytes: int = BUCKET_BYTES,
                 kw: Arr | int = 0, tpo: bool | Arr = False, shard: int | None = None) -> None:
        """`tpo`: for every configuration of `b`, or per configuration (a bool array): its overlappable collectives
        summed apart (module docstring) and, under rcm=mlp, the rings its recomputation issues again counted."""
        self.d, self.mode, self.b = d, MODES[mode], b
        tpo_cfg = np.broadcast_to(np.asarray(tpo, dtype=np.int64), (len(b),))
        tpo = bool(np.any(tpo_cfg))
        self.zero, self.bucket_bytes = zero, bucket_bytes
        self.kw = np.asarray(kw) if self.mode.keeps_weights else np.zeros((), dtype=np.int64)
        m = self.mode
        n = b.dp if shard is None else np.minimum(shard, b.dp)
        self.groups = {"dp": b.dp, "pp": b.pp, "dp_shard": n, "dp_replicate": b.dp // n, "cp": d.cp,
                       **m.axis_sizes(b.q, b.t, b.depth)}
        self.data_axes = cp_after_dp(m.grad_axes, d.cp)  # Layout.data_axes: dp x cp with context parallelism
        self.hybrid = shard is not None and bool(np.any(n < b.dp))
        self.zero_axes = tuple("dp_shard" if a == "dp" and self.hybrid else a for a in self.data_axes)
        self.sizes = Sizes(T=b.mb * d.s, t=b.t, q=b.q, depth=b.depth, sp=b.sp, V=padded(d.V, m.vocab_split(b.t, b.q)),
                           cp=d.cp)
        self.sums: dict[Key, dict[str, list]] = {}
        # tpo: the overlappable collectives summed apart, per GEMM they overlap (same bytes, less exposed time)
        self.tpo_sums: dict[tuple[str, str, tuple[str, ...], str], dict[str, list]] = {}
        self._groups: dict[tuple, tuple[Arr, Arr, dict]] = {}  # (axes, tag) -> (n, live, factors by kind)
        for source, colls in _declared(mode, d):
            if source == "layer_again_tpo" and not tpo:
                continue
            for c in colls:
                mask = self._mask(c) * (tpo_cfg if source == "layer_again_tpo" else 1)
                table = self.tpo_sums.setdefault((c.tpo, *self._key(c)), {}) if tpo and c.tpo else \
                    self.sums.setdefault(self._key(c), {})
                slot = table.setdefault(source + ".kept" * c.kept, [0, 0])
                slot[0] = slot[0] + mask
                slot[1] = slot[1] + mask * c.payload(self.sizes)

    def _key(self, c: Collective) -> Key:
        return (c.kind, c.axes, self.d.dtype if c.dtype == COMPUTE else c.dtype)

    def _mask(self, c: Collective) -> Arr | int:
        when = {"": 1, "sp": self.b.sp, "no_sp": 1 - self.b.sp}[c.when]
        if c.calls is not None:  # several calls per issue (SUMMA's q steps): counted, their payloads summed
            when = when * np.asarray(c.calls(self.sizes), dtype=np.int64)
        return when if c.applies is None else when * np.asarray(c.applies(self.sizes), dtype=np.int64)

    def group_size(self, axes: tuple[str, ...]) -> Arr:
        n = np.ones_like(self.b.dp)
        for a in axes:
            n = n * self.groups[a]
        return n

    def entries(self, first: Arr, last: Arr) -> list[Entry]:
        """Every (kind, axes, dtype) of one step on a stage with these edge flags, then the per-step ones."""
        d, b = self.d, self.b
        N = b.micro_batches(d.global_batch)
        layers = stage_layers(d.L, b.pp, b.v, first, last)
        recompute = 2 if d.recompute == "full" else 1
        scale = {"layer_fwd": N * recompute * layers, "layer_bwd": N * layers, "embedding": N * first,
                 "head": N * last, "layer_again": N * layers, "layer_again_tpo": N * layers}
        once = {"layer_fwd": layers, "layer_bwd": layers, "embedding": first, "head": last, "layer_again": 0,
                "layer_again_tpo": 0}  # kw=1
        for s in (*SOURCES, "layer_again", "layer_again_tpo"):
            scale[s + ".kept"] = np.where(self.kw == 1, once[s], scale[s])
        out: list[Entry] = []
        # in backward: the layers' backward lists and, under full recomputation, their recomputed forward
        late = {"layer_bwd": N * layers, "layer_bwd.kept": scale["layer_bwd.kept"],
                "layer_fwd": N * (recompute - 1) * layers, "layer_again": N * layers,
                "layer_again.kept": scale["layer_again.kept"], "layer_again_tpo": N * layers}
        for (kind, axes, dtype), by_source in self.sums.items():
            count = sum(scale[s] * c for s, (c, _) in by_source.items())
            payload = sum(scale[s] * p for s, (_, p) in by_source.items())
            back = sum(late[s] * p for s, (_, p) in by_source.items() if s in late)
            out.append(self._entry(kind, axes, dtype, count, payload, backward=back))
        for (tag, kind, axes, dtype), by_source in self.tpo_sums.items():
            count = sum(scale[s] * c for s, (c, _) in by_source.items())
            payload = sum(scale[s] * p for s, (_, p) in by_source.items())
            back = sum(late[s] * p for s, (_, p) in by_source.items() if s in late)
            out.append(self._entry(kind, axes, dtype, count, payload, backward=back, tpo=tag))
        totals = self.units(first, last) if self.zero >= 2 else None  # the stage's FSDP units (unit_totals)
        if totals is not None:  # per micro-batch: unit reduce-scatters; zero=3 gathers (traffic._zero_micro_batch)
            units, padded, held, _, _ = totals  # pp > 1: none held (unit_totals)
            single = b.pp == 1
            once = single * (1 + int(d.tied) * first * last)  # units gathered once per micro-batch (unit_totals)
            rs = np.where(single, N, 1)  # pipelines: in the last micro-batch's backward only
            out.append(self._entry("reduce_scatter", self.zero_axes, F32, rs * units, rs * 4 * padded))
            if self.zero == 3:
                out.append(self._entry("all_gather", self.zero_axes, d.dtype, N * (2 * units - once),
                                       N * d.c * (2 * padded - held)))
        sends = N * (2 * b.v - first - last)
        shard = d.c * self.sizes.T * d.h // self.mode.act_split(b.t, b.sp)
        out.append(self._entry("send", ("pp",), d.dtype, sends, sends * shard,
                               n=lambda: np.where(b.pp > 1, 2, 1), tag="send"))
        return out + self._per_step(first, last, layers, totals)

    def _per_step(self, first: Arr, last: Arr, layers: Arr, totals: tuple[Arr, ...] | None) -> list[Entry]:
        """The mode's per-step collectives, gradients, grad norm, metrics (`totals`: the stage's unit_totals,
        zero=2/3)."""
        b, m = self.b, self.mode
        one = np.ones_like(b.dp)
        at_stage = replace(self.sizes, layers=layers, first=first, last=last)
        out = [self._entry(*self._key(c), self._mask(c) * one, self._mask(c) * c.payload(at_stage), per_step=True)
               for c in m.step_collectives(self.d)]
        count, grads, padded_grads = self._buckets(first, last)
        tensor = m.axes
        single = b.pp == 1
        dp: tuple[str, ...] = ()
        if self.zero == 1:  # sharded over grad_axes (dp; 2.5D: dp, dep), as traffic.py lists them
            g = self.d.grad_bytes  # the buckets' element (Dims.grad_dtype): fp32, or 16-bit gradients
            out.append(self._entry("reduce_scatter", self.data_axes, self.d.grad_dtype, count, padded_grads * g // 4,
                                   per_step=True))
            # fp32 masters or the 16-bit parameters; FP8 ones for the block linears' weights (fp8.py)
            gathered = padded_grads * self.d.gather_bytes // 4
            if fp8.fp8_params(self.d):
                gathered = gathered * fp8.gathered_fraction(self.d, self.mode.name, b, first, last, grads / 4)
            out.append(self._entry("all_gather", self.data_axes, F32 if self.d.gather_bytes == 4 else self.d.dtype,
                                   count, gathered, per_step=True))
            dp = cp_after_dp(("dp",), self.d.cp)
        elif totals is not None:  # per step: HSDP's replica all_reduce; zero=2's parameter all_gather (fp32)
            units, padded, _, _, _ = totals
            shards = self.group_size(self.zero_axes)
            out.append(self._entry("all_reduce", ("dp_replicate",), F32, units * one, 4 * padded // shards,
                                   per_step=True))
            if self.zero == 2:
                out.append(self._entry("all_gather", self.zero_axes, F32, units * one, 4 * padded, per_step=True))
            dp = cp_after_dp(("dp_shard",) if self.hybrid else ("dp",), self.d.cp)
        else:
            out.append(self._entry("all_reduce", self.data_axes, self.d.grad_dtype, count,
                                   grads * self.d.grad_bytes // 4, per_step=True))
        # Tied embeddings, pp > 1: the first and last stage sum their copies' gradients (traffic.stage_events).
        tied = int(self.d.tied) * (b.pp > 1) * np.maximum(first, last)
        emb = 4 * m.embedding_shard(self.sizes.V, 0, self.d.h, b.t, b.q)
        out.append(self._entry("all_reduce", ("pp",), F32, tied * one, tied * emb,
                               lambda: np.where(b.pp > 1, 2, 1), True, "embedding"))
        if fp8.amax_reduced(self.d):  # the FP8 amaxes, max-reduced over the data and tensor ranks (delayed scaling)
            out.append(self._entry("all_reduce", ("dp", *tensor), F32, (layers > 0) * one,
                                   fp8.amax_bytes(self.d, layers) * one, per_step=True))
        k = self.group_size(dp) if self.zero else 1
        norm = tuple(dict.fromkeys((*dp, *tensor)))
        out.append(self._entry("all_reduce", norm, F32, single * one, 4 * one,
                               lambda: np.where(single, k * b.t, 1), True, "norm"))
        out.append(self._entry("all_reduce", ("pp", *norm), F32, ~single * one, 4 * one,
                               lambda: np.where(single, 1, b.pp * k * b.t), True, "norm"))
        dpc, cp = cp_after_dp(("dp",), self.d.cp), self.d.cp  # the loss: over dp x cp (traffic.metric_data_axes)
        out.append(self._entry("all_reduce", (*dpc, *tensor), F32, single * one, 8 * one,
                               lambda: np.where(single, b.dp * cp * b.t, 1), True, "metrics"))
        out.append(self._entry("all_reduce", ("pp", *dpc, *tensor), F32, ~single * one, 8 * one,
                               lambda: np.where(single, 1, b.pp * b.dp * cp * b.t), True, "metrics_pp"))
        return out

    def _buckets(self, first: Arr, last: Arr) -> tuple[Arr, Arr, Arr]:
        """Per layout: gradient buckets, their fp32 bytes, and their bytes padded to a multiple of the zero=1
        shard group (dp x the other grad_axes; keyed by the stage's shape: t, q, blocks, edge flags, group)."""
        b = self.b
        cols = [np.broadcast_to(np.asarray(x, dtype=np.int64), b.dp.shape)
                for x in (b.t, b.q, stage_layers(self.d.L, b.pp, b.v, first, last), first, last,
                          self.group_size(self.data_axes) if self.zero == 1 else 1)]
        key = np.zeros(b.dp.shape, dtype=np.int64)  # one int per stage shape: 1-D unique is fast
        for c, bits in zip(cols, (13, 13, 13, 1, 1, 22), strict=True):
            key = (key << bits) | c
        _, first_row, inverse = np.unique(key, return_index=True, return_inverse=True)
        pd, shapes = param_dims(self.d), np.stack([c[first_row] for c in cols], axis=1).tolist()
        per = np.array([_bucket_totals(self.mode.name, pd, t, q, n_layers, bool(f), bool(h), n, self.bucket_bytes)
                        for t, q, n_layers, f, h, n in shapes], dtype=np.int64)
        out = per[inverse.reshape(-1)]
        return out[:, 0], out[:, 1], out[:, 2]

    def units(self, first: Arr, last: Arr) -> tuple[Arr, Arr, Arr, Arr, Arr]:
        """zero=2/3, per layout: FSDP units, their summed padded length, the last unit's, and the largest
        sum of two consecutive units (unit_totals)."""
        return unit_totals(self.d, self.mode.name, self.b, first, last, self.group_size(self.zero_axes))

    def _entry(self, kind: str, axes: tuple[str, ...], dtype: str, count: Arr, payload: Arr,
               n: Callable[[], Arr] | None = None, per_step: bool = False, tag: str = "",
               backward: Arr | float = 0.0, tpo: str = "") -> Entry:
        """An Entry on the group of `axes` (size n(), default the product of the axes' sizes); group sizes
        and the collective factors of (kind, n) are computed once per batch, shared by the stages."""
        slot = (axes, tag)  # `tag` names a group whose size is not the product of its axes' sizes
        if slot not in self._groups:
            size = self.group_size(axes) if n is None else np.asarray(n()) * np.ones_like(self.b.dp)
            self._groups[slot] = (size, (size > 1).astype(np.int64), {})
        size, live, factors = self._groups[slot]
        if kind not in factors:
            factors[kind] = (latency_factor(kind, size), sent_factor(kind, size))
        return Entry(kind, axes, dtype, count * live, payload * live, size, per_step, factors[kind], tpo, backward)


@lru_cache(maxsize=4096)
def _bucket_totals(mode: str, d: Dims, t: int, q: int, layers: int, first: bool, last: bool, dp: int,
                   bucket_bytes: int) -> tuple[int, int, int]:
    # bucket_sizes: bucket_numels of the flattened units, packed unit by unit (a stage's blocks repeat)
    buckets = bucket_sizes(parameter_units(mode, d, t, q, layers, first, last), bucket_bytes)[0]
    total = sum(buckets)
    return len(buckets), 4 * total, 4 * (sum(padded_numel(n, dp) for n in buckets) if dp > 1 else total)


def comm_entries(d: Dims, mode: str, b: LayoutBatch, first: Arr, last: Arr, zero: int = 0,
                 bucket_bytes: int = BUCKET_BYTES, kw: Arr | int = 0, tpo: bool | Arr = False,
                 shard: int | None = None) -> list[Entry]:
    return StepTraffic(d, mode, b, zero, bucket_bytes, kw, tpo, shard).entries(first, last)
