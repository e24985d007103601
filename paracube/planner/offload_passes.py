"""The search's activation-offloading passes (Layout off=N; dimensions.OFF; cost_models/offload.py).

Offloading never shortens a layout's step in the model (it adds exposed copies, cost_models/offload.py) and only
frees device memory, so the search takes it only where it is what fits: per recomputation and context-parallel pass,
a pass without offloading, then a pass per offloaded count of the runtime's ladder (runtimes/offload.offload_counts:
k/8 of the blocks, fewest first) over the configurations that pass refused for memory and whose layout fits with no
micro-batch at fewer offloaded blocks, while any is left; one that fits the device is valid where its offloaded
bytes fit the host's memory too (cost_models/offload.host_bytes <= DeviceSpec.host_memory_bytes less the memory
headroom), and counted then as refused for host memory, not device memory (`valid`: each layout counted once, so
`enumerated` is the pass without offloading's). Offloading is not bought for a larger micro-batch of a layout that
fits without it (the model puts such gains at a fraction of a percent: l2-7B-64K, 15.348 -> 15.343 s with mb=8, off=26,
inside what it leaves out, cost_models/offload.py). A layout offloading turns from refused into fitting (a pinned
micro-batch, no recomputation instead of full) is then priced like any other and wins where faster.
Offered where the runtime offloads with the pass's recomputation (Runtime.offload), at pp = 1, on a device with a
host link (DeviceSpec.host_bandwidth > 0: every GPU preset; local-cpu has none: its host memory is its device
memory, offloading frees nothing); a layout's pin `off=N` (0 included) is the only count searched.
A pass of the ladder looks only at the configurations still pending that its count may fit (`pending_configs`: kept
with their structures in the order the pass without offloading enumerated them, and with the least peak that pass
found): nothing else is enumerated or fit-checked again. What a pass finds valid is scored and pruned as any layout
(a floor pruning these before their fit check was measured not to pay: on GPT-3 175B over 64-512 H100s it cost
0.045 s and saved 0.03 s of scoring, 2026-12-03).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from paracube.cost_models.block_acts import saved_block_bytes
from paracube.cost_models.dims import Dims
from paracube.cost_models.offload import host_bytes, resident_blocks
from paracube.cost_models.validity import first_violation
from paracube.errors import check
from paracube.layout import Layout
from paracube.modes import LayoutBatch
from paracube.modes.stages import stage_layers
from paracube.planner.dimensions import OFF, values
from paracube.planner.enumerate import Structure
from paracube.planner.fits import _valid, memory_line
from paracube.planner.search_state import _Search
from paracube.runtimes import Runtime
from paracube.runtimes.offload import offload_counts, offload_refusal


def offload_rungs(rt: Runtime, fixed: Layout | None, layers: int, recompute: str, host_link: bool) -> list[int]:
    """The offloaded block counts to pass over for one recomputation, fewest first: the pin, else 0 then the runtime's
    ladder where offloading is offered (module docstring). A pin the runtime cannot run: one line."""
    pin = fixed.offload if fixed is not None else None
    if pin is not None:
        why = offload_refusal(rt.name, rt.offload, fixed, layers, recompute)
        check(why is None, f"layout {fixed}: runtime {rt.name} ({rt.title}) {why}")
        check(not pin or host_link, f"layout {fixed}: off={pin} offloads to the host, but the device has no host link "
              "figure (DeviceSpec.host_bandwidth; topologies/host_link.py); valid: off=0")
        return [pin]
    if 1 not in values(OFF, rt, fixed) or not host_link or rt.offload is None or recompute not in rt.offload.recomputes:
        return [0]
    return [0, *offload_counts(rt.offload, layers)]


def offload_passes(s: _Search, base: Dims, rungs: list[int]) -> Iterator[None]:
    """Set `s` up for each count of `rungs` in turn (s.d, s.offload) and yield; stop once no configuration is left
    that offloading could make fit (`valid` keeps, per mode, the layouts found valid so far and the configurations
    still refused for memory whose layout no micro-batch fitted)."""
    ladder = len(rungs) > 1
    s.offload_fitted, s.offload_pending = ({}, {}) if ladder else (None, None)
    s.offload_need = {} if ladder else None
    # after the pass without offloading, a probe at the most blocks keeps only what some count can fit (`valid`)
    for n, probe in [(rungs[0], False), *([(rungs[-1], True)] if ladder else []), *((m, False) for m in rungs[1:])]:
        s.d, s.offload, s.offload_probe = replace(base, offload_frac=n / base.L), n, probe
        yield
        if not ladder or not any(s.offload_pending.values()):  # type: ignore[union-attr]
            break
    s.offload, s.offload_fitted, s.offload_pending, s.offload_need, s.offload_probe = 0, None, None, None, False


def skips(s: _Search, mode: str) -> bool:
    """A ladder's offloading pass has nothing to look at in this mode (no configuration of it is pending); a pinned
    off=N (no ladder: its one pass) skips nothing."""
    return bool(s.offload) and s.offload_pending is not None and not s.offload_pending.get(mode)


def pending_configs(s: _Search, mode: str) -> tuple[list[tuple[int, ...]], list[Structure]] | None:
    """On a ladder's offloading pass, the mode's pending configurations that may fit at its count (their rows in the
    order the pass without offloading enumerated them, and their structures): all that pass looks at, so nothing
    else is enumerated; None on any other pass. May fit: the least peak the pass without offloading found, less
    the saved activations the count takes off the device, within the memory cap (`_freed`: exact, the activations
    being the only memory offloading changes, memory.stage_memory; 1e-9 of the cap spares rounding); the others
    cannot fit, so fits._valid would refuse them: on the probe (the most blocks) they leave the ladder, on a rung
    they stay pending, unchecked."""
    if not s.offload or s.offload_pending is None or s.offload_need is None:
        return None
    pending, need = s.offload_pending.get(mode, {}), s.offload_need.get(mode, {})
    freed = _freed(s.d)
    may = [r for r in pending if need[r][0] - freed * need[r][1] <= s.mem_cap * (1 + 1e-9)]
    if s.offload_probe:
        keep = set(may)
        for r in [r for r in pending if r not in keep]:
            del pending[r]
    return may, [pending[r] for r in may]


def _freed(d: Dims) -> float:
    """Blocks' worth of saved activations `d`'s offloaded count takes off the device at pp = 1 (a stage of all L
    blocks, one micro-batch in flight: memory.in_flight): L less the resident blocks (offload.resident_blocks)."""
    return float(d.L - resident_blocks(d, np.array([float(d.L)]), np.ones(1))[0])


def valid(s: _Search, mode: str, batch: LayoutBatch, owners: list[Structure], n_places: np.ndarray,
          rejected: Counter) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fits._valid; along a ladder, its first pass also notes what fitted and what was refused for memory only, and
    each offloading pass looks at those refused configurations whose layout no micro-batch fitted yet: the ones that
    fit now (device and host) are valid and no longer counted as refused for memory (a layout counts once: refused
    only where no count fits it), the ones past the host's memory are counted as such."""
    if s.offload_fitted is None or s.offload_pending is None:
        return _valid(s, mode, batch, n_places, rejected)
    fitted, pending = s.offload_fitted.setdefault(mode, set()), s.offload_pending.setdefault(mode, {})
    if not s.offload:
        least: list[np.ndarray] = []
        idx, zero, kw = _valid(s, mode, batch, n_places, rejected, least)
        fitted.update(_keys(batch, idx))
        refused = (first_violation(mode, s.d, batch) < 0) & ~np.isin(np.arange(len(batch)), idx) & (batch.pp == 1)
        cand = np.nonzero(refused)[0]
        rows = _rows(batch, cand)
        new = [i for i, r in enumerate(rows) if r[:5] + r[6:] not in fitted]
        pending.update((rows[i], owners[int(cand[i])]) for i in new)
        if new and s.offload_need is not None:  # (least peak, one block's saved bytes): pending_configs
            at = cand[new]
            saved = np.broadcast_to(saved_block_bytes(s.d, mode, batch.take(at)), (len(new),))
            need = zip(least[0][at].tolist(), saved.tolist(), strict=True)
            s.offload_need.setdefault(mode, {}).update(zip([rows[i] for i in new], need, strict=True))
        return idx, zero, kw
    single = np.nonzero(batch.pp == 1)[0]  # pending configurations are pp = 1 ones
    cand = single[np.array([r in pending for r in _rows(batch, single)], dtype=bool)] if len(single) else single
    found, zero, kw = _valid(s, mode, batch.take(cand), n_places[cand], Counter())  # rules and memory: counted
    idx = cand[found]
    if s.offload_probe:  # the most blocks: what cannot fit even so leaves the ladder; nothing is valid yet
        fit = set(_rows(batch, idx))
        for r in [r for r in pending if r not in fit]:
            del pending[r]
        return idx[:0], zero[:0], kw[:0]
    sub = batch.take(idx)
    Ls = stage_layers(s.d.L, sub.pp, sub.v, np.ones_like(sub.pp), np.ones_like(sub.pp))
    over = host_bytes(s.d, mode, sub, Ls, np.ones(len(idx))) > s.host_cap
    memory = memory_line(s.mem_cap)  # fits._valid's line
    _count(rejected, memory, idx, n_places, -1)
    host = f"{memory_line(s.host_cap, 'host memory')} (off={s.offload})"
    _count(rejected, host, idx[over], n_places)
    if over.any() and not (~over).any():
        s.explanations[mode] = f"{host} ({int(n_places[np.unique(idx[over])].sum())} layouts)"
    keep = ~over
    fitted.update(_keys(batch, idx[keep]))
    for r in [*_rows(batch, idx), *(r for r in pending if r[:5] + r[6:] in fitted)]:
        pending.pop(r, None)
    return idx[keep], zero[keep], kw[keep]


_FIELDS = ("dp", "pp", "t", "q", "depth", "mb", "v", "sp")  # LayoutBatch.FIELDS; a layout but its mb: all but [5]


def _rows(batch: LayoutBatch, rows: np.ndarray) -> list[tuple[int, ...]]:
    """Per configuration of `rows`, its fields."""
    return list(zip(*(getattr(batch, k)[rows].tolist() for k in _FIELDS), strict=True))


def _keys(batch: LayoutBatch, rows: np.ndarray) -> list[tuple[int, ...]]:
    """Per configuration of `rows`, its layout but for the micro-batch."""
    return [r[:5] + r[6:] for r in _rows(batch, rows)]


def _count(rejected: Counter, why: str, configs: np.ndarray, n_places: np.ndarray, sign: int = 1) -> None:
    """Each configuration once (one may be valid at several zero stages), per placement of its structure."""
    n = int(n_places[np.unique(configs)].sum())
    if n:
        rejected[why] += sign * n


__all__ = ["offload_passes", "offload_rungs", "pending_configs", "skips", "valid"]
