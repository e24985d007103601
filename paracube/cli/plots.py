"""Pictures of estimates: step-time breakdown and memory per device, one bar per layout."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from paracube.estimate import StepEstimate


def plot_estimates(estimates: Sequence[StepEstimate], labels: Sequence[str], path: str | Path,
                   title: str = "", rotation: int = 15) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = range(len(estimates))
    scale, unit = (1.0, "s") if max(e.step_time_s for e in estimates) > 5 else (1e3, "ms")
    compute = [e.compute_time_s * scale for e in estimates]
    comm = [e.exposed_comm_time_s * scale for e in estimates]
    bubble = [e.bubble_time_s * scale for e in estimates]
    ax_time.bar(x, compute, label="compute", color="#4c72b0")
    ax_time.bar(x, comm, bottom=compute, label="exposed communication", color="#dd8452")
    ax_time.bar(x, bubble, bottom=[c + m for c, m in zip(compute, comm, strict=True)], label="pipeline bubble",
                color="#8c8c8c")
    ha = "right" if rotation else "center"
    ax_time.set_xticks(list(x), labels, rotation=rotation, ha=ha, fontsize=8)
    ax_time.set_ylabel(f"time per training step ({unit})")
    ax_time.set_title("step time breakdown")
    # Headroom above the bars for the legend, so that it covers none of them.
    ax_time.set_ylim(0, 1.4 * max(c + m + b for c, m, b in zip(compute, comm, bubble, strict=True)))
    ax_time.legend(fontsize=7, ncol=2, loc="upper center")

    gib = 1024**3
    parts = [("parameters", "#4c72b0"), ("gradients", "#55a868"), ("optimizer", "#c44e52"),
             ("activations", "#8172b3"), ("temporaries", "#ccb974")]
    bottom = [0.0] * len(estimates)
    for name, color in parts:
        values = [getattr(e.memory, name) / gib for e in estimates]
        ax_mem.bar(x, values, bottom=bottom, label=name, color=color)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax_mem.set_xticks(list(x), labels, rotation=rotation, ha=ha, fontsize=8)
    ax_mem.set_ylabel("memory per device (GiB)")
    ax_mem.set_title("memory per device")
    ax_mem.set_ylim(0, 1.45 * max(bottom))
    ax_mem.legend(fontsize=7, ncol=3, loc="upper center")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
