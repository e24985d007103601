"""The pipeline bubble on CPU ranks that share cores: an idle stage's ranks give their core to the busy ones.

On accelerators (and on a host with a core per rank) a stage that waits in the pipeline's fill or drain leaves
its device idle: the bubble costs its nominal time, (pp - 1) / (v N) x W (analytic_scores.py). When r ranks share
each core (DeviceSpec.ranks_per_core; the local-cpu preset, topologies/local_cpu.py), the work of a step is priced
at 1/r of a core per rank, and while some ranks wait in the bubble the scheduler runs the busy ones on the cores
they leave. The stages' ranks are spread over the cores alike (executor/launch/affinity.py: rank i on core
i mod C, the stages consecutive blocks of the rank grid), so in a ramp step of nominal time t in which k of
the pp stages run, the busy ranks' CPU work (k/pp x t of each core's) runs on min(C, k/pp x ranks) cores:
    wall = t x max(k/pp, 1/r)
of which t x k/pp is work already counted in W; what the step adds beyond W is t x max(0, 1/r - k/pp) (the
cores' idle time), against t x (1 - k/pp) unshared. The fill (and the drain, alike) has ramp steps
k = 1 .. pp - 1, so the bubble's share that still costs is
    share(pp, r) = sum_k max(0, 1/r - k/pp) / sum_k (1 - k/pp)
                 = (K/r - K (K + 1) / (2 pp)) / ((pp - 1) / 2),   K = min(pp - 1, ceil(pp/r) - 1)
(the terms with k >= pp/r are 0): 1 at r = 1 (every accelerator), 0 when even one stage's ranks fill the cores
(k/pp >= 1/r for k = 1, i.e. r >= pp: pp = 2 with 8 ranks on 2 cores), between for fewer ranks per core.
Measured on a 2-core VM, 8 ranks (r = 4), the tiny GPT, dp=2,pp=2,tp=1d:2 with 1, 2 and 4 micro-batches
(benchmarks/validate_local.py's 1D pipeline; 38 / 56 / 95 ms, 2026-12-03): priced with the nominal bubble
(21-23 ms) 60 / 79 / 120 ms, with share = 0 37 / 58 / 99 ms (with a send at one collective message's wait
of 0.35 ms; with the send wait and the 0.28 ms step wait of topologies/local_cpu.py 35.1 / 56.4 / 98.9 ms).
Both engines price it alike: the analytic bubble times `share`, and the event engine's simulated bubble of
its critical stage (step - compute - exposed) likewise (the simulation runs each stage at its 1/r share).
"""

from __future__ import annotations

import numpy as np

Arr = np.ndarray


def bubble_share(pp: int | Arr, ranks_per_core: float) -> Arr:
    """The fraction of the nominal pipeline bubble a step pays when `ranks_per_core` ranks share each core
    (module docstring); 1 where pp == 1 (no bubble to scale) or ranks_per_core <= 1."""
    pp = np.asarray(pp, dtype=float)
    r = max(1.0, float(ranks_per_core))
    if r == 1.0:
        return np.ones_like(pp)
    k = np.minimum(pp - 1.0, np.ceil(pp / r - 1e-9) - 1.0)
    ramp = np.maximum(pp - 1.0, 1.0) / 2.0
    return np.where(pp > 1, np.maximum(0.0, k / r - k * (k + 1.0) / (2.0 * pp)) / ramp, 1.0)


__all__ = ["bubble_share"]
