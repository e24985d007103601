"""One (kind, axes, dtype) line of a step's communication (comm.py's closed form): its calls and summed payload per
layout of a batch, and their alpha-beta time on a link (collective.py), calibrated where `paracube calibrate` measured
that kind and group size."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paracube.cost_models.collective import Table, calibrated_link, collective_time, latency_factor, sent_factor

Arr = np.ndarray


@dataclass
class Entry:
    kind: str
    axes: tuple[str, ...]
    dtype: str
    count: Arr
    payload: Arr
    n: Arr  # group size
    per_step: bool = False  # once per step (gradients, grad norm, metrics), not per micro-batch
    factors: tuple[Arr, Arr] | None = None  # (latency_factor, sent_factor) of (kind, n): computed once
    tpo: str = ""  # the GEMM these calls overlap with under tpo (modes.base.Collective.tpo; cost_models/tpo.py)
    backward: Arr | float = 0.0  # bytes of `payload` sent during backward (layer backward, full recompute's forward)

    def _factors(self) -> tuple[Arr, Arr]:
        if self.factors is None:
            self.factors = (latency_factor(self.kind, self.n), sent_factor(self.kind, self.n))
        return self.factors

    def latency_steps(self) -> Arr:
        """Latency-bound steps of one call (collective.latency_factor)."""
        return self._factors()[0]

    def sent(self) -> Arr:
        return self._factors()[1] * self.payload

    def time(self, bw: Arr, lat: Arr, table: Table = (), alternating: bool = False) -> Arr:
        bw, lat = calibrated_link(table, self.kind, self.n, bw, lat, alternating)
        return collective_time(self.kind, self.n, self.count, self.payload, bw, lat)


__all__ = ["Entry"]
