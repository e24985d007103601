"""The bars the search's exact pruning compares lower bounds with (planner/scoring.py, planner/offload_passes.py):
the top_k-th best step time found so far (`_kth`), the mode's best (`_mode_best`, where mode bests are kept) and, in a
cp=1 pass, the best cp=1 step (`_cp1_best`). Each only falls as the search finds layouts, so a configuration whose
lower bound exceeds the bar now exceeds it at the end: it cannot enter the ranking, nor be a mode's best or the cp=1
runner-up. The search's contract: planner/search.py."""

from __future__ import annotations

import numpy as np

from paracube.planner.search_state import _Search


def _kth(s: _Search, found: np.ndarray | None = None) -> float:
    """The top_k-th best step time among the layouts kept so far (every pass, every mode: `s.best`) and `found`
    (real layouts the pins allow): no layout slower than it enters the ranking. inf while fewer are known."""
    times = np.array([t for t, _ in s.best] + ([] if found is None else found.tolist()))
    return float(np.partition(times, s.top_k - 1)[s.top_k - 1]) if len(times) >= s.top_k else float("inf")


def _mode_best(s: _Search, mode: str, found: np.ndarray) -> float:
    """The mode's best step time so far (its earlier passes and `found`): what its best layout must beat; -inf (no
    bar of its own) where the search keeps no exact mode bests (`s.mode_bests`: search.py)."""
    if not s.mode_bests:
        return -float("inf")
    known = [s.per_mode_best[mode][0]] if mode in s.per_mode_best else []
    return float(min([*known, *found.tolist()], default=float("inf")))


def _cp1_best(s: _Search, found: np.ndarray) -> float:
    """In a cp=1 pass, the best step time without context parallelism so far (`s.best` and `found`): what the
    best cp=1 layout must beat (search.py names it as a cp > 1 layout's runner-up, from `s.best`); -inf in a
    cp > 1 pass (no bar of its own)."""
    if s.d.cp > 1:
        return -float("inf")
    return float(min([t for t, lay in s.best if lay.cp == 1] + found.tolist(), default=float("inf")))


def _bar(s: _Search, mode: str, found: np.ndarray | None = None) -> float:
    """What a configuration of `mode` in this pass must be within to stay: the largest of the three bars (`found`:
    step times of real layouts the pins allow, not yet kept)."""
    f = np.zeros(0) if found is None else found
    return max(_kth(s, f), _mode_best(s, mode, f), _cp1_best(s, f))


__all__ = ["_bar", "_cp1_best", "_kth", "_mode_best"]
