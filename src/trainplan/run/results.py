"""What a worker measured: the typed form of ``result.json``.

Rank 0 of a neural run (through :meth:`trainplan.runtime.Context.finish`) and
the tabular worker each write one :class:`WorkerResult`; the launcher reads it
back to build the run summary and the calibration record.  The JSON on disk
is the first format (version 1 of ``run.json``): :meth:`WorkerResult.to_dict`
writes the keys it always had and :meth:`WorkerResult.from_dict` reads files
written before these types existed.  Keys a user's script adds to
``workload`` are kept as they are.

Importing this module imports nothing heavy (no torch, no numpy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Mapping

from trainplan.measure.probe import Accelerator
from trainplan.spec import Precision
from trainplan.strategies import Strategy

GIB = 1024**3


class RunStatus(StrEnum):
    """How a run (or one worker's part of it) ended."""

    COMPLETED = "completed"
    PREEMPTED = "preempted"  # SIGTERM: a checkpoint was written; --resume continues
    FAILED = "failed"


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class Measured:
    """Figures measured over a run (None where not measured).

    ``tokens_per_s`` is set for transformer jobs, ``rows_per_s`` for torch
    jobs (samples) and tabular jobs (training rows).
    """

    step_time_s: float | None = None
    peak_gib: float | None = None
    train_s: float | None = None
    final_loss: float | None = None
    tokens_per_s: float | None = None
    rows_per_s: float | None = None

    #: always written (null when unknown); the throughput keys only when measured
    _ALWAYS = ("step_time_s", "peak_gib", "train_s", "final_loss")

    def figure(self, name: str) -> float | None:
        """The figure called ``name`` (a field name such as ``"tokens_per_s"``), None when not measured."""
        if name not in _MEASURED_FIELDS:
            raise KeyError(f"{name!r} is not a measured figure; figures: {', '.join(_MEASURED_FIELDS)}")
        return getattr(self, name)

    def to_dict(self) -> dict[str, float | None]:
        return {f: getattr(self, f) for f in _MEASURED_FIELDS if f in self._ALWAYS or getattr(self, f) is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measured":
        return cls(**{f: _number(data.get(f)) for f in _MEASURED_FIELDS})


_MEASURED_FIELDS = tuple(f.name for f in fields(Measured))


@dataclass(frozen=True)
class WorkloadFacts:
    """What was trained, as the worker saw it.

    Neural jobs fill the first five fields, tabular jobs the rest; a user's
    script gives what it likes (``ctx.finish(workload={...})``) and keys that
    are not fields here are kept in ``extra``.
    """

    # neural jobs
    params: int | None = None
    trainable_params: int | None = None
    samples_per_step: float | None = None
    tokens_per_step: float | None = None
    flops_per_token: float | None = None
    # tabular jobs
    rows: int | None = None
    features: int | None = None
    classes: int | None = None
    fits: int | None = None
    rows_per_fit: float | None = None
    rounds_per_fit: int | None = None
    depth: int | None = None
    parallel_fits: int | None = None
    threads_per_fit: int | None = None
    #: keys given that are not fields above (user scripts)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are set (unknown ones are left out, as readers expect), then ``extra``."""
        out = {f: getattr(self, f) for f in _WORK_FIELDS if getattr(self, f) is not None}
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "WorkloadFacts":
        data = dict(data or {})
        known = {k: data.pop(k) for k in list(data) if k in _WORK_FIELDS}
        return cls(**known, extra=data)


_WORK_FIELDS = tuple(f.name for f in fields(WorkloadFacts) if f.name != "extra")


@dataclass(frozen=True)
class FitResult:
    """One finished fit (fold) of a tabular job."""

    fold: int
    loss: float
    fit_s: float
    rows: int
    rounds: int

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FitResult":
        return cls(
            fold=int(data["fold"]),
            loss=float(data["loss"]),
            fit_s=float(data["fit_s"]),
            rows=int(data["rows"]),
            rounds=int(data["rounds"]),
        )


@dataclass(frozen=True)
class WorkerResult:
    """One run's measurement, as rank 0 (or the tabular worker) writes it to ``result.json``.

    ``folds`` is None for neural jobs and the finished fits for tabular ones.
    """

    status: RunStatus
    steps: int
    measured: Measured
    workload: WorkloadFacts = field(default_factory=WorkloadFacts)
    world_size: int = 1
    strategy: Strategy = Strategy.SINGLE
    device: Accelerator = Accelerator.CPU
    precision: Precision = Precision.FP32
    restarts: int = 0
    peak_method: str | None = None
    folds: tuple[FitResult, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", RunStatus(self.status))
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        object.__setattr__(self, "device", Accelerator(self.device))
        object.__setattr__(self, "precision", Precision(self.precision))

    @property
    def completed(self) -> bool:
        return self.status is RunStatus.COMPLETED

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``result.json`` (enum values as their strings)."""
        out: dict[str, Any] = {
            "status": self.status.value,
            "steps": self.steps,
            "world_size": self.world_size,
            "strategy": self.strategy.value,
            "device": self.device.value,
            "precision": self.precision.value,
            "restarts": self.restarts,
            "peak_method": self.peak_method,
            "measured": self.measured.to_dict(),
            "workload": self.workload.to_dict(),
        }
        if self.folds is not None:
            out["folds"] = [f.to_dict() for f in self.folds]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WorkerResult":
        """Read a ``result.json`` object; raises ``ValueError`` / ``KeyError`` / ``TypeError`` on a bad one."""
        folds = data.get("folds")
        return cls(
            status=RunStatus(data["status"]),
            steps=int(data.get("steps", 0)),
            measured=Measured.from_dict(data.get("measured") or {}),
            workload=WorkloadFacts.from_dict(data.get("workload")),
            world_size=int(data.get("world_size", 1)),
            strategy=Strategy(data.get("strategy", Strategy.SINGLE.value)),
            device=Accelerator(data.get("device", Accelerator.CPU.value)),
            precision=Precision(data.get("precision", Precision.FP32.value)),
            restarts=int(data.get("restarts", 0)),
            peak_method=data.get("peak_method"),
            folds=None if folds is None else tuple(FitResult.from_dict(f) for f in folds),
        )

    @classmethod
    def read(cls, path: Path) -> "WorkerResult | None":
        """The result in ``path``; None when it is missing or unreadable (the run then counts as failed)."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            return None
