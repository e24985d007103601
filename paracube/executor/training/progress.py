"""What rank 0 shows while training: a rich progress bar with elapsed time and the step rate.

No time remaining: steps of the first few seconds (warm-up, a resumed run's first step) mislead any
estimate, and a bar whose estimate ends at 0:00:00 says nothing. A no-op on other ranks and with
--no-progress.
"""

from __future__ import annotations


class Progress:
    """A progress bar over steps `start+1..total` (rank 0 only)."""

    def __init__(self, enabled: bool, total: int, start: int) -> None:
        self.bar = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self.bar = Bar(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.fields[info]}"), transient=False)
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()

    def update(self, loss: float, step_time_s: float, skipped: bool = False) -> None:
        if self.bar is not None:
            info = f"{step_time_s * 1e3:,.0f} ms/step, loss {loss:.4f}" + (" (skipped)" if skipped else "")
            self.bar.update(self.task, advance=1, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


__all__ = ["Progress"]
