"""Pictures of estimates: step-time breakdown and memory per device, one bar per layout.

Made to be read: each bar is labelled with its total, the x axis names only the mode (or a short label) and
the full layouts go in a caption under the axes, legends sit below the axes (never over a bar), and the
caption says what is drawn and where the figures come from.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from paracube.estimate import StepEstimate

CAPTION = ("Predicted by paracube's analytic cost model. Left: one training step split into compute, exposed "
           "(not overlapped) communication and pipeline bubble. Right: memory per device by part.")


def _short(labels: Sequence[str]) -> tuple[list[str], list[str]]:
    """Tick labels (a label's first line) and the caption's lines (`tick: rest`) where a label has more."""
    ticks, notes = [], []
    for i, label in enumerate(labels):
        head, _, rest = label.partition("\n")
        if not rest and len(head) > 14:  # one long layout: a number on the axis, the layout in the caption
            head, rest = f"#{i + 1}", head
        ticks.append(head)
        if rest:
            notes.append(f"{head}: {rest}")
    return ticks, notes


def plot_estimates(estimates: Sequence[StepEstimate], labels: Sequence[str], path: str | Path,
                   title: str = "", rotation: int = 15) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    ticks, notes = _short(labels)
    n = len(estimates)
    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(max(9.0, 1.6 * n + 4), 5.2 + 0.17 * len(notes)))
    x = list(range(n))
    scale, unit = (1.0, "s") if max(e.step_time_s for e in estimates) > 5 else (1e3, "ms")
    compute = [e.compute_time_s * scale for e in estimates]
    comm = [e.exposed_comm_time_s * scale for e in estimates]
    bubble = [e.bubble_time_s * scale for e in estimates]
    ax_time.bar(x, compute, label="compute", color="#4c72b0")
    ax_time.bar(x, comm, bottom=compute, label="exposed communication", color="#dd8452")
    top = ax_time.bar(x, bubble, bottom=[c + m for c, m in zip(compute, comm, strict=True)], label="pipeline bubble",
                      color="#8c8c8c")
    ax_time.bar_label(top, labels=[f"{e.step_time_s * scale:#.3g}" for e in estimates], fontsize=8, padding=2)
    ax_time.set_ylabel(f"time per training step ({unit})")
    ax_time.set_title("step time breakdown")

    gib = 1024**3
    parts = [("parameters", "#4c72b0"), ("gradients", "#55a868"), ("optimizer", "#c44e52"),
             ("activations", "#8172b3"), ("temporaries", "#ccb974")]
    bottom = [0.0] * n
    bars = None
    for name, color in parts:
        values = [getattr(e.memory, name) / gib for e in estimates]
        bars = ax_mem.bar(x, values, bottom=bottom, label=name, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if bars is not None:
        ax_mem.bar_label(bars, labels=[f"{e.memory.total / gib:#.3g}" for e in estimates], fontsize=8, padding=2)
    ax_mem.set_ylabel("memory per device (GiB)")
    ax_mem.set_title("memory per device")
    for ax in (ax_time, ax_mem):
        ax.set_xticks(x, ticks, fontsize=9)
        ax.margins(y=0.12)  # room for the totals above the tallest bar
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, frameon=False)
    if title:
        fig.suptitle(title)
    caption = CAPTION + ("\n" + "\n".join(notes) if notes else "")
    fig.text(0.01, 0.01, caption, fontsize=8, ha="left", va="bottom", family="monospace" if notes else None)
    fig.tight_layout(rect=(0, (1.3 + len(notes)) * 0.17 / fig.get_figheight() + 0.02, 1, 1))
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
