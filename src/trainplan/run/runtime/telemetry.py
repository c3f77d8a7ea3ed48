"""Clocks, metric lines, the end-of-run measurement, and the fault-injection test aid.

Pure bookkeeping: nothing here touches torch or the process group.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from trainplan.measure.probe import Accelerator
from trainplan.run.metrics import read_metrics, step_figures
from trainplan.run.results import GIB, Measured, RunStatus, WorkerResult, WorkloadFacts
from trainplan.run.runtime.process import env_int
from trainplan.spec import Precision
from trainplan.strategies import Strategy

#: Test aid: a worker SIGKILLs itself at this step on its first attempt (see docs/run.md).
FAULT_STEP_ENV = "TRAINPLAN_FAULT_SIGKILL_AT_STEP"
#: The rank that kills itself (default 0).
FAULT_RANK_ENV = "TRAINPLAN_FAULT_RANK"


@dataclass(frozen=True)
class FaultInjection:
    """Where a worker kills itself to test recovery; read once from the environment at start-up."""

    at_step: int | None = None
    rank: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "FaultInjection":
        env = os.environ if env is None else env
        at = env_int(env, FAULT_STEP_ENV, 0)
        return cls(at_step=at or None, rank=env_int(env, FAULT_RANK_ENV, 0))

    def due(self, step: int, *, rank: int, restart_count: int) -> bool:
        """Whether this rank dies after ``step`` (first attempt only: a restarted group runs on)."""
        return self.at_step is not None and step == self.at_step and restart_count == 0 and rank == self.rank

    def strike(self, step: int, *, rank: int, restart_count: int) -> None:
        """SIGKILL this process when :meth:`due`."""
        if self.due(step, rank=rank, restart_count=restart_count):
            os.kill(os.getpid(), signal.SIGKILL)


class RunClock:
    """Training time over the segments of a run (a resume starts a new segment).

    Step time is wall time between two :meth:`mark` calls divided by the
    steps done in between; checkpoint writing happens after the mark's
    reading, so it is not counted as step time.
    """

    def __init__(self) -> None:
        now = time.perf_counter()
        self.last_step = 0
        self.last_mark = now
        self.segment_start = now
        self.train_s_before = 0.0  # training time of earlier segments
        self.peak_before = 0  # peak bytes of earlier segments
        self.first_in_segment = True

    def step_time(self, step: int, now: float) -> float:
        return (now - self.last_mark) / max(1, step - self.last_step)

    def elapsed(self, now: float | None = None) -> float:
        """Training seconds of the run so far, earlier segments included."""
        return self.train_s_before + ((time.perf_counter() if now is None else now) - self.segment_start)

    def mark(self, step: int) -> None:
        self.last_step = step
        self.last_mark = time.perf_counter()
        self.first_in_segment = False

    def new_segment(self, *, step: int = 0, train_s_before: float | None = None, peak_before: int | None = None) -> None:
        """Start timing again (at start, or after a resume from ``step``)."""
        if train_s_before is not None:
            self.train_s_before = train_s_before
        if peak_before is not None:
            self.peak_before = peak_before
        self.last_step = step
        self.segment_start = self.last_mark = time.perf_counter()
        self.first_in_segment = True


class CheckpointSchedule:
    """When checkpoints are due: every ``every`` steps and/or every ``minutes`` of wall time."""

    def __init__(self, every: int | None, minutes: float | None) -> None:
        self.every = every
        self.minutes = minutes
        self.last_time = time.monotonic()
        self.last_step = -1

    def due_by_time(self) -> bool:
        return bool(self.minutes and time.monotonic() - self.last_time >= self.minutes * 60)

    def due_by_step(self, step: int) -> bool:
        return bool(self.every and step % self.every == 0)

    def written(self, step: int) -> None:
        self.last_step = step
        self.last_time = time.monotonic()


def step_record(
    step: int,
    *,
    step_time_s: float,
    elapsed_s: float,
    total_steps: int | None,
    loss: float | None,
    tokens: float | None,
    samples: float | None,
    warmup: bool,
) -> dict[str, Any]:
    """One metrics line (see :mod:`trainplan.run.metrics` for the keys)."""
    record: dict[str, Any] = {"step": step, "step_time_s": step_time_s, "elapsed_s": elapsed_s}
    if total_steps:
        record["total_steps"] = total_steps
    if loss is not None:
        record["loss"] = loss
    if tokens is not None:
        record["tokens_per_s"] = tokens / step_time_s
    if samples is not None:
        record["samples_per_s"] = samples / step_time_s
    if warmup:
        record["warmup"] = True
    return record


def measure_result(
    *,
    status: RunStatus,
    metrics_path: Path,
    peak_bytes: int,
    workload: WorkloadFacts,
    train_s_now: float,
    world_size: int,
    strategy: Strategy,
    device: Accelerator,
    precision: Precision,
    restarts: int,
    peak_method: str,
) -> WorkerResult:
    """The run's :class:`WorkerResult` from its metric lines; ``train_s_now`` when no step was logged."""
    records = read_metrics(metrics_path)
    figs = step_figures(records)
    steps = [r for r in records if "event" not in r and "step" in r]
    train_s = steps[-1]["elapsed_s"] if steps else train_s_now
    tokens, samples = workload.tokens_per_step, workload.samples_per_step
    step_s = figs.step_time_s
    measured = Measured(
        step_time_s=step_s,
        peak_gib=peak_bytes / GIB,
        train_s=train_s,
        final_loss=figs.final_loss,
        tokens_per_s=tokens / step_s if tokens and step_s else None,
        rows_per_s=samples / step_s if samples and step_s and not tokens else None,  # torch jobs: samples
    )
    return WorkerResult(
        status=status,
        steps=figs.steps,
        measured=measured,
        workload=workload,
        world_size=world_size,
        strategy=strategy,
        device=device,
        precision=precision,
        restarts=restarts,
        peak_method=peak_method,
    )
