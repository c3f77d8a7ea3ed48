"""A rich progress bar that follows ``metrics.jsonl`` while the workers train.

The parent process draws it (on stderr, so ``--json`` keeps stdout for the
result): step / total, loss, tokens/s or rows/s, elapsed and ETA.  It reads
only what rank 0 appended since the last refresh.  ``trainplan run`` passes
:class:`ProgressView` to :func:`trainplan.run.execute` as its ``progress``
factory (a :data:`trainplan.run.api.ProgressFactory`); the library itself draws nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from trainplan.run.metrics import MetricsTail


def _rate(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{prefix} {unit}"
    return f"{value:.1f} {unit}"


class ProgressView:
    """Progress of one run; call :meth:`refresh` periodically, then :meth:`close`."""

    def __init__(self, metrics_path: Path, total_steps: int, description: str, *, console: Console | None = None) -> None:
        self._tail = MetricsTail(metrics_path)
        self._console = console or Console(stderr=True)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[loss]}"),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self._console,
            transient=False,
        )
        # the bar has no total until the workers report their first step: a script that never calls
        # ctx.end_of_step shows "waiting for the first step", not 0/N
        self._total = total_steps
        self._task = self._progress.add_task(description, total=None, loss="waiting for the first step", rate="")
        self._progress.start()
        self.last: dict[str, Any] = {}

    def refresh(self) -> None:
        """Fold in the metric lines written since the last call."""
        for record in self._tail.new_records():
            if "event" in record:
                if record["event"] == "resume" and "step" in record:
                    self._progress.update(self._task, completed=record["step"], total=self._total)
                continue
            self.last = record
            fields: dict[str, Any] = {}
            if record.get("loss") is not None:
                fields["loss"] = f"loss {record['loss']:.4g}"
            if record.get("tokens_per_s") is not None:
                fields["rate"] = _rate(record["tokens_per_s"], "tok/s")
            elif record.get("rows_per_s") is not None:
                fields["rate"] = _rate(record["rows_per_s"], "rows/s")
            elif record.get("samples_per_s") is not None:
                fields["rate"] = _rate(record["samples_per_s"], "samples/s")
            total = record.get("total_steps") or self._total
            fields.setdefault("loss", "")
            self._progress.update(self._task, completed=record.get("step", 0), total=total, **fields)

    def close(self) -> None:
        self.refresh()
        self._progress.stop()


class TokenizeView:
    """A progress bar while ``trainplan run`` tokenizes a pretrained job's data: call it with (done, total)."""

    def __init__(self, *, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._progress: Progress | None = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("[bold]tokenizing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                console=self._console, transient=True,
            )
            self._task = self._progress.add_task("tokenizing", total=total)
            self._progress.start()
        self._progress.update(self._task, completed=done, total=total)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
