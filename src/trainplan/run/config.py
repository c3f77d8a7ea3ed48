"""The resolved configuration of one run, shared by the launcher and the workers.

``trainplan run`` resolves everything (strategy, processes, batch split,
precision, DeepSpeed config) once, in the parent process, and writes it as
``run.json`` in the run directory.  Workers — the built-in ones and a user's
script through :mod:`trainplan.runtime` — read it back from the path in
``$TRAINPLAN_RUN_CONFIG``; they never re-decide anything.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

from trainplan.errors import TrainplanError
from trainplan.measure.probe import Accelerator
from trainplan.spec import JobKind, Precision
from trainplan.strategies import Engine, Strategy

CONFIG_ENV = "TRAINPLAN_RUN_CONFIG"
CONFIG_VERSION = 1


class DistBackend(StrEnum):
    """The ``torch.distributed`` backend of a run."""

    NCCL = "nccl"  # CUDA
    GLOO = "gloo"  # CPU (and anything else)


@dataclass(frozen=True)
class RunConfig:
    """Everything a worker needs to know about its run.

    ``job`` is the job as JSON (a transformer's preset already resolved to an
    inline architecture), re-validated by :meth:`load_job`.  ``strategy``,
    ``accelerator`` and ``precision`` are enums (strings are accepted and
    converted); in ``run.json`` they are their string values.
    """

    job: dict[str, Any]
    out_dir: str
    strategy: Strategy  # SINGLE for tabular jobs
    world_size: int  # processes
    accelerator: Accelerator
    threads_per_process: int
    total_steps: int
    grad_accum: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    precision: Precision = Precision.FP32  # the precision actually used (fp32 on CPU)
    checkpoint_every: int | None = None  # steps
    checkpoint_minutes: float | None = None
    keep_checkpoints: int = 2
    deepspeed: dict[str, Any] | None = None
    tp: int = 1  # tensor-parallel degree (fsdp over world_size / tp data-parallel ranks)
    sequence_parallel: bool = False
    ep: int = 1  # expert-parallel degree (fsdp over world_size / ep ranks for the experts)
    pp: int = 1  # pipeline stages (fsdp over world_size / pp ranks of a stage)
    vpp: int = 1  # chunks per pipeline rank (interleaved 1F1B)
    parallel_fits: int = 1  # tabular: fits run at once
    threads_per_fit: int = 1  # tabular: library threads per fit
    script: str | None = None
    version: int = CONFIG_VERSION
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        object.__setattr__(self, "accelerator", Accelerator(self.accelerator))
        object.__setattr__(self, "precision", Precision(self.precision))

    @property
    def kind(self) -> JobKind:
        """The job's kind (transformer, torch, tabular)."""
        return JobKind(self.job["kind"])

    @property
    def engine(self) -> Engine:
        """The library that implements the strategy (plain torch, FSDP, DeepSpeed)."""
        return self.strategy.engine

    @property
    def dist_backend(self) -> DistBackend:
        """NCCL on CUDA, else gloo."""
        return DistBackend.NCCL if self.accelerator is Accelerator.CUDA else DistBackend.GLOO

    def load_job(self) -> Any:
        """The job, validated again by the spec."""
        from trainplan.spec import parse_job

        return parse_job(self.job, source=str(Path(self.out_dir) / "run.json"))

    def to_json(self) -> dict[str, Any]:
        data = {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(self).items()}
        data["notes"] = list(self.notes)
        # fields added after version 1 are written only when used, so an older run.json reads and writes unchanged
        for key, default in (("tp", 1), ("sequence_parallel", False), ("ep", 1), ("pp", 1), ("vpp", 1)):
            if data[key] == default:
                del data[key]
        return data

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown or data.get("version") != CONFIG_VERSION:
            raise TrainplanError(
                f"run.json was written by another trainplan version (fields {sorted(unknown)}, "
                f"version {data.get('version')}); start a new run with --overwrite"
            )
        kwargs = dict(data)
        kwargs["notes"] = tuple(kwargs.get("notes", ()))
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise TrainplanError(f"run.json is not a run configuration ({exc}); start a new run with --overwrite") from None

    @classmethod
    def read(cls, path: str | Path) -> "RunConfig":
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise TrainplanError(f"cannot read the run configuration: {exc}", source=str(p)) from None
        return cls.from_json(data)

    @classmethod
    def from_env(cls) -> "RunConfig | None":
        """The configuration named by ``$TRAINPLAN_RUN_CONFIG``, if set."""
        path = os.environ.get(CONFIG_ENV)
        return cls.read(path) if path else None
