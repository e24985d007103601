"""Timeline of an event-engine run: Chrome / Perfetto trace JSON and a matplotlib Gantt chart.

One track per device stream: each simulated (representative) device has a `compute` and a `comm` stream.
Chrome trace format: "X" (complete) events with microsecond timestamps, one process per device, one
thread per stream (open the file in https://ui.perfetto.dev or chrome://tracing).
Neither truncates: past `max_spans` (trace: TRACE_SPANS, ~130 bytes each: a 175B step's file under 20 MB; chart:
PLOT_SPANS, more bars than its pixels) spans are merged by event_reduce.py's rule, which the trace states in its
metadata (otherData.paracube_spans) and the chart in its caption.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from paracube.cost_models.event_reduce import reduce_spans
from paracube.errors import ParacubeError

STREAMS = ("compute", "comm")
TRACE_SPANS = 100_000  # ~13 MB of trace JSON
PLOT_SPANS = 20_000


@dataclass(frozen=True)
class Span:
    device: int  # index into Timeline.devices
    stream: str  # compute | comm
    name: str
    start: float  # s
    end: float  # s
    category: str = ""  # fwd | bwd | recompute | pipeline | grad_sync | ... (comm: the collective kind too)


@dataclass
class Timeline:
    devices: list[str] = field(default_factory=list)  # e.g. "stage 0 (rank 0)"
    spans: list[Span] = field(default_factory=list)


def _timeline(result: object) -> Timeline:
    tl = result if isinstance(result, Timeline) else getattr(result, "timeline", None)
    if not isinstance(tl, Timeline):
        raise ParacubeError(f"no timeline in {type(result).__name__}; run the event engine with timeline=True")
    return tl


def chrome_trace(result: object, max_spans: int = TRACE_SPANS) -> dict:
    """The trace as a dict (what `write_chrome_trace` writes); at most `max_spans` spans (event_reduce.py)."""
    tl = _timeline(result)
    merged, how = reduce_spans(tl.spans, max_spans)
    events: list[dict] = []
    for pid, name in enumerate(tl.devices):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        for tid, stream in enumerate(STREAMS):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}})
    for m in merged:
        s = m.span
        ev = {"ph": "X", "name": s.name, "cat": s.category or s.stream, "pid": s.device,
              "tid": STREAMS.index(s.stream), "ts": s.start * 1e6, "dur": (s.end - s.start) * 1e6}
        if m.count > 1:
            ev["args"] = {"count": m.count, "busy_us": m.busy * 1e6}
        events.append(ev)
    meta = {"simulated": how.spans_simulated, "written": how.spans_kept, "limit": how.max_spans,
            "resolution_s": how.resolution_s, "categories_merged": how.mixed, "rule": how.rule()}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"paracube_spans": meta}}


def write_chrome_trace(result: object, path: str | Path, max_spans: int = TRACE_SPANS) -> Path:
    """Write Chrome/Perfetto trace JSON (one track per device stream); returns the path."""
    path = Path(path)
    try:
        path.write_text(json.dumps(chrome_trace(result, max_spans), separators=(",", ":")))
    except OSError as exc:
        raise ParacubeError(f"cannot write trace {str(path)!r}: {exc.strerror}") from None
    return path


COLORS = {"fwd": "tab:blue", "recompute": "tab:cyan", "bwd": "tab:green", "pipeline": "tab:purple",
          "grad_sync": "tab:red", "optimizer": "tab:brown", "metrics": "tab:gray", "mixed": "tab:olive"}


def plot_timeline(result: object, path_png: str | Path, max_spans: int = PLOT_SPANS, title: str = "") -> Path:
    """Gantt chart: one row per device stream, time in ms, coloured by phase; the legend to the right of the
    axes (never over the bars) and a caption saying what is drawn; returns the path."""
    # A bare Figure (no pyplot): no global backend or figure registry is touched; PNG goes through Agg.
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    tl = _timeline(result)
    merged, how = reduce_spans(tl.spans, max_spans)
    spans = [m.span for m in merged]
    fig = Figure(figsize=(12, 1.9 + 0.6 * 2 * max(1, len(tl.devices))))
    ax = fig.add_subplot(1, 1, 1)
    # A merged bar (event_reduce.py) is shaded by the busy fraction of its extent (quarters): idle gaps inside it
    # are not drawn as busy time.
    rows: dict[tuple[str, float], dict[float, list[tuple[float, float]]]] = {}
    for m in merged:
        s = m.span
        color = COLORS.get(s.category.split(":")[0], "tab:orange")
        y = s.device * len(STREAMS) + STREAMS.index(s.stream)
        width = s.end - s.start
        shade = 1.0 if m.count == 1 or width <= 0 else max(0.25, math.ceil(4 * min(1.0, m.busy / width)) / 4)
        rows.setdefault((color, shade), {}).setdefault(y, []).append((s.start * 1e3, width * 1e3))
    for (color, shade), by_row in rows.items():
        for y, bars in by_row.items():
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=color, alpha=shade)
    labels = [f"{d} {st}" for d in tl.devices for st in STREAMS]
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("device stream")
    ax.set_title(title or "event-engine timeline of one training step", fontsize="medium")
    used = {c.split(":")[0] for c in (s.category for s in spans)}
    handles = [Patch(color=c, label=k) for k, c in COLORS.items() if k in used]
    if handles:  # outside the axes: a legend inside would hide the step's last spans
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    fig.text(0.01, 0.01, "Each bar is one span of the simulated step on a representative device: kernels on the "
             "compute stream, collectives on the comm stream, coloured by phase (forward, backward, gradient "
             f"sync, optimizer). {how.rule()}{'; a merged bar is shaded by its busy fraction' if how.merged else ''}.",
             fontsize="small", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = Path(path_png)
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise ParacubeError(f"cannot write plot {str(path)!r}: {exc.strerror}") from None
    return path


__all__ = ["Span", "Timeline", "chrome_trace", "plot_timeline", "write_chrome_trace"]
