"""The search's activation-offloading passes (Layout off=N; dimensions.OFF; cost_models/offload.py).

Offloading never shortens a layout's step in the model (it adds exposed copies, cost_models/offload.py) and only
frees device memory, so the search takes it only where it is what fits: per recomputation and context-parallel pass,
a pass without offloading, then, while some configuration of the previous pass was refused for memory, a pass per
offloaded count of the runtime's ladder (runtimes/offload.offload_counts: k/16 of the blocks, fewest first) in which
only the configurations whose layout fits with no micro-batch at fewer offloaded blocks are scored, each within the
host's memory (cost_models/offload.host_bytes <= DeviceSpec.host_memory_bytes less the memory headroom); `valid`
counts the others as rejected. Offloading is not bought for a larger micro-batch of a layout that fits without it
(the model puts such gains at a fraction of a percent: l2-7B-64K, 15.348 -> 15.343 s with mb=8, off=26, inside what
it leaves out, cost_models/offload.py). A layout offloading turns from refused into fitting (a pinned micro-batch, no
recomputation instead of full) is then priced like any other and wins where faster.
Offered where the runtime offloads with the pass's recomputation (Runtime.offload), at pp = 1, on a device with a
host link (DeviceSpec.host_bandwidth > 0: every GPU preset; local-cpu has none: its host memory is its device
memory, offloading frees nothing); a layout's pin `off=N` (0 included) is the only count searched.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from paracube.cost_models.dims import Dims
from paracube.cost_models.offload import host_bytes
from paracube.errors import check
from paracube.layout import Layout
from paracube.modes import LayoutBatch
from paracube.modes.stages import stage_layers
from paracube.planner.dimensions import OFF, values
from paracube.planner.fits import _valid
from paracube.planner.search_state import _Search
from paracube.runtimes import Runtime
from paracube.runtimes.offload import offload_counts, offload_refusal

MEMORY = "memory >"  # the start of the fit pass's memory rejection (fits._valid)


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
    """Set `s` up for each count of `rungs` in turn (s.d, s.offload) and yield; stop after a pass that refused no
    configuration for memory (a larger count would fit no more). `s.offload_fitted` collects, per mode, the layouts
    (but for the micro-batch) found valid by the ladder's passes so far (`valid` skips them)."""
    s.offload_fitted = {} if len(rungs) > 1 else None
    for n in rungs:
        s.d, s.offload = replace(base, offload_frac=n / base.L), n
        before = _memory_rejections(s.rejected)
        yield
        if _memory_rejections(s.rejected) == before:
            break
    s.offload, s.offload_fitted = 0, None


def _memory_rejections(rejected: Counter) -> int:
    return sum(v for k, v in rejected.items() if k.startswith(MEMORY))


def valid(s: _Search, mode: str, batch: LayoutBatch, n_places: np.ndarray, rejected: Counter
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fits._valid, in an offloading pass less the configurations whose layout (but for its micro-batch) an earlier
    pass of the ladder found valid, those at pp > 1 and those whose offloaded activations exceed the host's memory
    (each counted once per placement as rejected)."""
    idx, zero, kw = _valid(s, mode, batch, n_places, rejected)
    fitted = s.offload_fitted.setdefault(mode, set()) if s.offload_fitted is not None else None
    keep = np.ones(len(idx), dtype=bool)
    if s.offload and len(idx):
        sub = batch.take(idx)
        drop = np.array([k in (fitted or set()) for k in _keys(batch, idx)], dtype=bool)
        _count(rejected, "fits with fewer offloaded blocks", idx[drop], n_places)
        piped = ~drop & (sub.pp > 1)  # every runtime offloads at pp = 1 only (runtimes/offload.py)
        _count(rejected, "offloads activations at pp = 1 only", idx[piped], n_places)
        Ls = stage_layers(s.d.L, sub.pp, sub.v, np.ones_like(sub.pp), np.ones_like(sub.pp))
        over = ~drop & ~piped & (host_bytes(s.d, mode, sub, Ls, np.ones(len(idx))) > s.host_cap)
        _count(rejected, f"host memory > {s.host_cap / 2**30:.0f} GiB per device (off={s.offload})", idx[over],
               n_places)
        keep = ~(drop | piped | over)
    if fitted is not None:
        fitted.update(_keys(batch, idx[keep]))
    return idx[keep], zero[keep], kw[keep]


def _keys(batch: LayoutBatch, rows: np.ndarray) -> list[tuple[int, ...]]:
    """Per configuration of `rows`, its layout but for the micro-batch (LayoutBatch FIELDS less mb)."""
    return list(zip(*(getattr(batch, k)[rows].tolist() for k in ("dp", "pp", "t", "q", "depth", "v", "sp")),
                    strict=True))


def _count(rejected: Counter, why: str, configs: np.ndarray, n_places: np.ndarray) -> None:
    """Each configuration once (one may be valid at several zero stages), per placement of its structure."""
    n = int(n_places[np.unique(configs)].sum())
    if n:
        rejected[why] += n


__all__ = ["offload_passes", "offload_rungs", "valid"]
