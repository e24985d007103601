"""The one search configuration of `paracube plan`, `compare`, `sweep` and benchmarks/search_speed.py.

What a command searches is decided here once, so that the commands cannot drift apart (they did: `sweep`
searched the training's recomputation only while `plan` searched every one, so the two chose different layouts
for the same job). `SearchConfig` holds the choices a command does not pin:
    recomputes       every recomputation (layout.RECOMPUTES) unless the user pins one (--recompute)
    top_k            the ranked pool (POOL = 100): the layouts `plan` explains its choice among (planner/explain.py)
                     and re-prices with `estimate` (zero=1 with its gather overlapped, HSDP: planner/search.py), so
                     the best layout depends on it; every command uses the same pool
    memory_headroom  the fraction of device memory held back (DEFAULT_MEMORY_HEADROOM = 0.10; cli/train_terms.py
                     states where the 10% comes from)
    mode_bests       each tensor mode's best layout, exact (`compare`'s table); `plan` shows the ranked pool only and
                     turns it off, so that the search prunes what cannot enter the pool (planner/search.py)
Zero stages, overlap, tpo and every other searched dimension come from the runtime (planner/dimensions.py).

Size guard (`check_size`): before a topology is built or a layout enumerated, the number of layouts the
search would enumerate is estimated from the structures alone (per structure: micro-batches x interleavings
x sp x axis orders x recomputations, x 2 where zero=1 shards the optimizer beside zero=0; the distinct placements are
at most the orders of the axes of size > 1; zero=2/3 rows, counted once more per stage that fits, are left out, and
a configuration that fits at neither zero=0 nor 1 counts once: within 10% of `SearchResult.enumerated`,
tests/test_search_config.py). A search above MAX_LAYOUTS layouts or MAX_GPUS ranks is
refused in one line naming the size, instead of swapping: at the goal of 1M layouts/s, MAX_LAYOUTS is about a
minute of scoring, and a topology graph of MAX_GPUS ranks (networkx, ~1 KiB per node and link) is what fits this
machine's memory with the search's arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from paracube.errors import check
from paracube.layout import Layout
from paracube.layout_checks import RECOMPUTES, TENSOR_MODES
from paracube.modes import MODES
from paracube.modes.base import divisors
from paracube.modes.stages import split_ok
from paracube.planner.enumerate import structures
from paracube.runtimes import RUNTIMES
from paracube.workload import ModelSpec, TrainingSpec

if TYPE_CHECKING:
    from paracube.planner.search import SearchResult

POOL = 100  # ranked layouts kept (planner/explain.py's runner-ups are looked for among them)
DEFAULT_MEMORY_HEADROOM = 0.10
MAX_LAYOUTS = 60_000_000
MAX_GPUS = 65_536


@dataclass(frozen=True)
class SearchConfig:
    """What a planning command searches beyond the job (model, training, topology, GPUs, pinned layout)."""

    search_recompute: bool = True  # every recomputation (False: the training's, e.g. --recompute given)
    top_k: int = POOL
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM
    runtime: str = "paracube"
    mode_bests: bool = True  # each mode's best exact (compare's table); False: the ranked pool only (plan)

    def recomputes(self) -> list[str] | None:
        return list(RECOMPUTES) if self.search_recompute else None

    def run(self, model: ModelSpec, training: TrainingSpec, topo: object, gpus: int,
            fixed: Layout | None = None) -> SearchResult:
        from paracube.planner.search import search  # the cost models: loaded when a search runs

        return search(model, training, topo, gpus, fixed=fixed, top_k=self.top_k, recomputes=self.recomputes(),
                      runtime=self.runtime, memory_headroom=self.memory_headroom, mode_bests=self.mode_bests)

    def size(self, model: ModelSpec, training: TrainingSpec, gpus: int) -> int:
        """About how many layouts the search enumerates (module docstring)."""
        rt = RUNTIMES[self.runtime]
        n_rc = len(RECOMPUTES) if self.search_recompute else 1
        total = 0
        for mode in (m for m in rt.modes if m in TENSOR_MODES and MODES[m].searched):
            m = MODES[mode]
            for st in structures(mode, gpus, model.layers):
                per_replica = training.global_batch // st.dp if training.global_batch % st.dp == 0 else 1
                vs = sum(1 for v in divisors(-(-model.layers // st.pp)) if split_ok(model.layers, st.pp, v)
                         ) if st.pp > 1 and rt.interleave else 1
                big = sum(1 for size in st.sizes().values() if size > 1)
                # zero=1 beside zero=0 where the optimizer shards (memory.zero_shards: the mode's grad_axes)
                sizes = st.sizes()
                zeros = 2 if 1 in rt.zeros_at(st.pp) and math.prod(sizes[a] for a in m.grad_axes) > 1 else 1
                total += (len(divisors(per_replica)) * vs * (2 if m.sequence_parallel else 1) * math.factorial(big)
                          * zeros)
        return total * n_rc


def check_size(config: SearchConfig, model: ModelSpec, training: TrainingSpec, gpus: int) -> int:
    """Refuse, in one line with the sizes, a search too large for this machine; return its size."""
    check(gpus <= MAX_GPUS, f"--gpus {gpus:,}: a topology of {gpus:,} ranks is above the {MAX_GPUS:,} the planner "
          f"builds in memory; valid: --gpus up to {MAX_GPUS:,} (plan a replica group and scale dp)")
    n = config.size(model, training, gpus)
    check(n <= MAX_LAYOUTS, f"--gpus {gpus:,}: the search would enumerate about {n:,} layouts, above the "
          f"{MAX_LAYOUTS:,} it scores in about a minute; valid: fewer GPUs, or pin part of the layout (--layout)")
    return n


__all__ = ["DEFAULT_MEMORY_HEADROOM", "MAX_GPUS", "MAX_LAYOUTS", "POOL", "SearchConfig", "check_size"]
