"""A run directory read for the report: the job, the step lines of ``metrics.jsonl``, measured vs predicted."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainplan.errors import TrainplanError
from trainplan.run.metrics import read_metrics
from trainplan.run.rundir import RunPaths

THROUGHPUT_KEYS = ("tokens_per_s", "samples_per_s", "rows_per_s")
#: per-step memory keys a metrics line may carry (GiB); plotted as curves when present
MEMORY_KEYS = ("allocated_gib", "reserved_gib", "memory_gib", "peak_gib", "rss_gib")


@dataclass(frozen=True)
class RunData:
    """What the report shows of one run."""

    root: Path
    job: dict[str, Any]  # the job as run.json stored it (after command-line overrides)
    steps: tuple[dict[str, Any], ...]  # metric lines with a step (events left out)
    summary: dict[str, Any] = field(default_factory=dict)  # summary.json ({} while the run is unfinished)

    @property
    def measured(self) -> dict[str, Any]:
        return dict(self.summary.get("measured") or {})

    @property
    def predicted(self) -> dict[str, Any]:
        return dict(self.summary.get("predicted") or {})

    @property
    def throughput_key(self) -> str | None:
        """The throughput the step lines carry (tokens/s, samples/s or rows/s)."""
        return next((k for k in THROUGHPUT_KEYS if any(r.get(k) is not None for r in self.steps)), None)

    def predicted_throughput(self) -> float | None:
        """The plan's throughput for this run: ``summary.json`` names samples of torch jobs ``rows_per_s``."""
        p = self.predicted
        return next((float(p[k]) for k in ("tokens_per_s", "rows_per_s", "samples_per_s") if p.get(k) is not None), None)

    def memory_keys(self) -> list[str]:
        return [k for k in MEMORY_KEYS if any(r.get(k) is not None for r in self.steps)]


def is_run_dir(path: Path) -> bool:
    return Path(path).is_dir() and RunPaths(Path(path)).run_config.exists()


def read_run(path: Path) -> RunData:
    """Read a trainplan run directory; one-line :class:`TrainplanError` when it is not one."""
    paths = RunPaths(Path(path))
    if not paths.run_config.exists():
        raise TrainplanError(f"{path} is not a trainplan run directory (no run.json)", field="RUN_DIR")
    try:
        config = json.loads(paths.run_config.read_text(encoding="utf-8"))
        job = dict(config["job"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TrainplanError(f"{paths.run_config} is unreadable ({exc})", field="RUN_DIR") from None
    summary: dict[str, Any] = {}
    if paths.summary.exists():
        try:
            summary = json.loads(paths.summary.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            summary = {}
    steps = tuple(r for r in read_metrics(paths.metrics) if "event" not in r and "step" in r)
    return RunData(root=paths.root, job=job, steps=steps, summary=summary if isinstance(summary, dict) else {})
