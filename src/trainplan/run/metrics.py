"""Metrics as JSON lines, and the figures measured from them.

Rank 0 appends one line per optimizer step (neural jobs) or per progress tick
(tabular jobs) to ``metrics.jsonl``.  A line has ``step`` and, when known,
``loss``, ``step_time_s``, ``tokens_per_s`` / ``rows_per_s``, ``elapsed_s``
and ``warmup`` (the first step after start or resume, which carries set-up
time and is left out of the step-time figure).  Event lines have an
``event`` key instead (``start``, ``resume``, ``checkpoint``, ``preempted``).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from trainplan.files import write_text_atomic


class MetricsWriter:
    """Append-only JSON-lines writer (one ``write`` + flush per line)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        record = {"time": round(time.time(), 3), **record}
        self._fh.write(json.dumps(record, sort_keys=True) + "\n")
        self._fh.flush()

    def event(self, name: str, **fields: Any) -> None:
        self.write({"event": name, **fields})

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a metrics file (a torn last line is skipped)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def truncate_after(path: Path, step: int) -> None:
    """Drop the step lines past ``step`` (work lost since the checkpoint), atomically."""
    p = Path(path)
    if not p.exists():
        return
    kept = [r for r in read_metrics(p) if "event" in r or r.get("step", 0) <= step]
    write_text_atomic(p, "".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))


class MetricsTail:
    """Reads lines appended to a metrics file since the last call (for progress display)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset = 0
        self._inode: int | None = None

    def new_records(self) -> list[dict[str, Any]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._inode != st.st_ino or st.st_size < self._offset:  # replaced by truncate_after
            self._inode, self._offset = st.st_ino, 0
        with open(self.path, "rb") as fh:
            fh.seek(self._offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1  # leave a partial last line for next time
        self._offset += end
        out = []
        for line in chunk[:end].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


@dataclass(frozen=True)
class StepFigures:
    """Figures measured from the step lines of one run."""

    steps: int
    step_time_s: float | None  # median, warm-up steps excluded
    final_loss: float | None


def step_figures(records: Iterable[dict[str, Any]]) -> StepFigures:
    """Median step time (warm-up steps left out unless nothing else) and the last loss."""
    steps = [r for r in records if "event" not in r and "step" in r]
    times = [r["step_time_s"] for r in steps if r.get("step_time_s") is not None and not r.get("warmup")]
    if not times:
        times = [r["step_time_s"] for r in steps if r.get("step_time_s") is not None]
    losses = [r["loss"] for r in steps if r.get("loss") is not None]
    return StepFigures(
        steps=max((r["step"] for r in steps), default=0),
        step_time_s=statistics.median(times) if times else None,
        final_loss=losses[-1] if losses else None,
    )
