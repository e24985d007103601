"""Why the planner chose each part of the best layout: pinned vs chosen, and the runner-up it beat.

Works on the search's ranked results only (planner.search's `ranked`, plus `best_per_mode`): for each
part of the best layout (dp, pp, cp and its exchange cpc, tensor mode and shape, micro-batch, interleave v, sequence
parallelism, overlap, tpo, recompute modules rcm, attention kernel fa, placement) that was not pinned by the user's
--layout, the runner-up is the best-ranked layout with a different value of that part (for placement: the same
layout otherwise), and the margin is its predicted step time relative to the best: (t_runner_up - t_best) / t_best;
for cp > 1 the runner-up is the best layout without context parallelism (cp=1). v is a choice only with pp > 1,
sp only with 1d, placement only with two or more axes of size > 1. When the ranked list holds every valid layout
(fewer rows than asked for), a part with no other value is reported as the only valid one, except the recomputation
and the placement, whose dominated or identically priced twins the search leaves unranked (UNRANKED_TWINS), and the
parts it did not vary (SearchResult.unsearched): their lines say why instead.
Rows that differ only in where size-1 axes sit are the same layout (size-1 axes change no group):
`dedupe` keeps the first of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from paracube.estimate import StepEstimate
from paracube.layout import Layout

Ranked = Sequence[tuple[Layout, StepEstimate]]


def big_placement(layout: Layout) -> tuple[str, ...]:
    """The placement (innermost first) without axes of size 1."""
    return tuple(a for a in layout.effective_placement if layout.axis_size(a) > 1)


def canonical_key(layout: Layout) -> tuple:
    return (layout.dp, layout.pp, layout.cp, layout.cp_comm, layout.mode, layout.shape, layout.micro_batch,
            layout.interleave,
            layout.sequence_parallel, layout.zero, layout.recompute, layout.recompute_modules, layout.overlap,
            layout.tpo, layout.uses_flash, big_placement(layout))


def dedupe(ranked: Ranked) -> list[tuple[Layout, StepEstimate]]:
    seen: set[tuple] = set()
    out = []
    for lay, est in ranked:
        key = canonical_key(lay)
        if key not in seen:
            seen.add(key)
            out.append((lay, est))
    return out


def _tensor(lay: Layout) -> str:
    return "tp=none" if lay.mode == "none" else f"tp={lay.mode}:{'x'.join(map(str, lay.shape))}"


# part -> (value label of a layout, is the part pinned by `fixed`)
PARTS: dict[str, tuple[Callable[[Layout], str], Callable[[Layout], bool]]] = {
    "dp": (lambda lay: f"dp={lay.dp}", lambda f: f.dp != 1),
    "pp": (lambda lay: f"pp={lay.pp}", lambda f: f.pp != 1),
    "cp": (lambda lay: f"cp={lay.cp}", lambda f: f.cp != 1),
    "cpc": (lambda lay: f"cpc={lay.cp_comm or 'p2p'}", lambda f: f.cp_comm is not None),
    "tensor": (_tensor, lambda f: f.mode != "none"),
    "ep": (lambda lay: f"ep={lay.ep}", lambda f: f.ep != 1),  # MoE models only (planner/experts.py)
    "etp": (lambda lay: f"etp={lay.etp}", lambda f: f.etp != 1),
    "mb": (lambda lay: f"mb={lay.micro_batch}", lambda f: f.micro_batch is not None),
    "v": (lambda lay: f"v={lay.interleave}", lambda f: f.interleave != 1 or f.forbid_interleave),
    "sp": (lambda lay: "sp" if lay.sequence_parallel else "no sp", lambda f: f.sequence_parallel),
    "zero": (lambda lay: f"zero={lay.zero}", lambda f: f.zero != 0 or f.forbid_zero),
    # rcm= implies rc=selective (layout.py): a module rung's layout is a selective runner-up, not "rc=None"
    "recompute": (lambda lay: f"rc={lay.recompute or ('selective' if lay.recompute_modules else 'none')}",
                  lambda f: f.recompute is not None),
    # selective recomputation by module: told where some ranked layout has it (dimensions.RCM, planner/experts.py)
    "rcm": (lambda lay: "rcm=" + "+".join(lay.recompute_modules) if lay.recompute_modules else "no rcm",
            lambda f: f.recompute_modules is not None),
    "overlap": (lambda lay: "overlap" if lay.overlap else "no overlap", lambda f: f.overlap),
    "tpo": (lambda lay: "tpo" if lay.tpo else "no tpo", lambda f: f.tpo),
    "a2ao": (lambda lay: "a2ao" if lay.a2ao else "no a2ao", lambda f: f.a2ao or f.forbid_a2ao),  # MoE a2a overlap
    "attention": (lambda lay: "fa=1" if lay.uses_flash else "fa=0", lambda f: f.flash is not None),
    # activation offloading: told where some ranked layout offloads (planner/offload_passes.py)
    "offload": (lambda lay: f"off={lay.offload or 0}", lambda f: f.offload is not None),
    "placement": (lambda lay: "place=" + ".".join(big_placement(lay) or ("-",)), lambda f: bool(f.placement)),
}


# Parts whose other values may be valid and still unranked (planner/scoring.py), with why: the search ranks a layout
# under a heavier recomputation only where the same layout under a lighter one is slower or does not fit, and ranks
# one placement of a configuration where others see the same links (the same estimate)
UNRANKED_TWINS = {"recompute": "a heavier recomputation is ranked only where the same layout gains by it",
                  "rcm": "a heavier recomputation is ranked only where the same layout gains by it",
                  "placement": "a placement whose groups see the same links as a ranked one is the same layout to "
                               "the model: ranked once"}


@dataclass(frozen=True)
class Choice:
    part: str
    value: str
    pinned: bool
    runner_up: str | None = None  # the other value's label
    runner_up_layout: str | None = None
    runner_up_step_time_s: float | None = None
    margin: float | None = None  # (t_runner_up - t_best) / t_best
    only_value: bool = False  # no other value is valid (the ranked list was exhaustive)
    unranked: str | None = None  # why other values may be valid and still unranked (UNRANKED_TWINS, unsearched)

    def line(self) -> str:
        if self.pinned:
            return f"{self.value} pinned"
        if self.runner_up is None:
            why = "the only valid value" if self.only_value else "no other value among the ranked layouts"
            if self.unranked and not self.only_value:
                why += f" ({self.unranked})"
            return f"{self.value} chosen; {why}"
        t = self.runner_up_step_time_s or 0.0
        shown = f"{t:.3f} s" if t >= 1 else f"{t * 1e3:.2f} ms"
        return (f"{self.value} chosen; best with {self.runner_up}: {shown} ({(self.margin or 0):+.1%})"
                f" [{self.runner_up_layout}]")

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "value": self.value, "pinned": self.pinned, "runner_up": self.runner_up,
                "runner_up_layout": self.runner_up_layout, "runner_up_step_time_s": self.runner_up_step_time_s,
                "margin": self.margin, "only_value": self.only_value, "line": self.line()}


def explain(ranked: Ranked, fixed: Layout | None = None, exhaustive: bool = False,
            unsearched: Mapping[str, str] | None = None) -> list[Choice]:
    """One Choice per part of ranked[0]'s layout (ranked: best first, by step time); `unsearched`: the parts the
    search did not vary, with why (SearchResult.unsearched), never reported as having one valid value."""
    untold = {**UNRANKED_TWINS, **(unsearched or {})}
    rows = sorted(dedupe(ranked), key=lambda r: r[1].step_time_s)
    best, best_est = rows[0]
    t0 = best_est.step_time_s
    out = []
    for part, (label, is_pinned) in PARTS.items():
        if (part == "v" and best.pp == 1) or (part == "sp" and not best.tensor_mode.sequence_parallel) or \
                (part == "placement" and len(big_placement(best)) < 2) or (part == "recompute" and not best.recompute) \
                or (part in ("overlap", "tpo", "a2ao") and not any(getattr(lay, part) for lay, _ in rows)) \
                or (part == "cpc" and best.cp == 1) or (part == "offload" and not any(lay.offload for lay, _ in rows)) \
                or (part == "rcm" and not any(lay.recompute_modules for lay, _ in rows)) \
                or (part in ("ep", "etp") and all(lay.ep == lay.etp == 1 for lay, _ in rows)):  # MoE: both told
            continue  # not a choice of its own (overlap, tpo, a2ao: the runtime does not offer it here)
        value = label(best)
        if fixed is not None and is_pinned(fixed):
            out.append(Choice(part, value, True))
            continue
        same = (lambda lay: canonical_key(lay)[:-1] == canonical_key(best)[:-1]) if part == "placement" else None
        # cp > 1: the runner-up is the best layout without context parallelism (search adds it to the ranking)
        other = next(((lay, est) for lay, est in rows[1:] if label(lay) != value and (same is None or same(lay))
                      and (part != "cp" or best.cp == 1 or lay.cp == 1)
                      and (part != "cpc" or lay.cp > 1)), None)  # cp=1 has no exchange: not cpc's runner-up
        if other is None:  # the search ranks no dominated recomputation nor placement twin: never exhaustive in them
            out.append(Choice(part, value, False, only_value=exhaustive and part not in untold,
                              unranked=untold.get(part)))
            continue
        lay, est = other
        out.append(Choice(part, value, False, label(lay), str(lay), est.step_time_s, est.step_time_s / t0 - 1))
    return out


__all__ = ["Choice", "big_placement", "canonical_key", "dedupe", "explain"]
