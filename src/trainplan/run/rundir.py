"""The run directory: its layout, and the rules that keep a user's files safe.

A run directory holds ``run.json`` (the resolved configuration, also the
marker that says "trainplan made this"), ``job.yaml`` (a copy of the job
file), ``metrics.jsonl``, ``checkpoints/``, ``ranks/`` (one record per worker
process), ``launch.log`` (everything the workers printed), ``model.pt`` (the
final weights), ``result.json`` (the workers' measurement) and
``summary.json`` (measurement against prediction).

An existing directory is never clobbered: it is reused only when empty, with
``--resume`` (when it is a trainplan run of the same job), or replaced with
``--overwrite`` (only when it is a trainplan run directory).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainplan.errors import TrainplanError
from trainplan.run.results import RunStatus


@dataclass(frozen=True)
class RunPaths:
    """Where each file of a run lives."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def run_config(self) -> Path:
        return self.root / "run.json"

    @property
    def job(self) -> Path:
        return self.root / "job.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def ranks(self) -> Path:
        return self.root / "ranks"

    @property
    def log(self) -> Path:
        return self.root / "launch.log"

    @property
    def model(self) -> Path:
        return self.root / "model.pt"

    @property
    def result(self) -> Path:
        return self.root / "result.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def ds_config(self) -> Path:
        return self.root / "ds_config.json"

    @property
    def models(self) -> Path:
        """Tabular jobs: one model file per fold."""
        return self.root / "models"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


#: Everything trainplan writes at the top of a run directory (``run``) or a rendered launch folder (``launch``);
#: ``--overwrite`` deletes a directory only when it holds nothing else.
RUN_ENTRIES = frozenset({
    "run.json", "job.yaml", "metrics.jsonl", "checkpoints", "ranks", "launch.log", "result.json", "summary.json",
    "model.pt", "models", "final", "final.partial", "data", "ds_config.json", ".lock", "launch.json", "hostfile",
    "deepspeed_env", "job.sbatch", "task.yaml", "ray_driver.py", "dask_driver.py", "dask_result.json",
})  # fmt: skip


def foreign_entries(root: Path) -> list[str]:
    """Top-level entries of ``root`` that trainplan did not write (a user's files): not a run's own files, not
    a file ``launch.json`` lists as rendered, not a SLURM log or the rendered wheel."""
    rendered = _read_json(root / "launch.json") or {}
    listed = {str(name).split("/", 1)[0] for name in rendered.get("files", []) if isinstance(name, str)}
    return sorted(p.name for p in root.iterdir()
                  if p.name not in RUN_ENTRIES | listed and not p.name.startswith(("slurm-", "trainplan-")))  # fmt: skip


def prepare_run_dir(out: Path, *, job: dict[str, Any], resume: bool, overwrite: bool) -> RunPaths:
    """Check ``out`` against ``--resume`` / ``--overwrite`` and make it ready.

    ``job`` is the job as JSON (after command-line overrides); on
    ``--resume`` it must equal the run's job.  Raises
    :class:`TrainplanError` naming ``--out``, ``--resume`` or ``--overwrite``.
    """
    paths = RunPaths(Path(out))
    root = paths.root
    if resume and overwrite:
        raise TrainplanError("give --resume or --overwrite, not both", field="--resume")
    if root.is_symlink():
        raise TrainplanError(f"{root} is a symbolic link; give the directory it points to", field="--out")
    if root.exists() and not root.is_dir():
        raise TrainplanError(f"{root} exists and is not a directory; choose another --out", field="--out")
    is_run = paths.run_config.exists()
    if resume:
        if not is_run:
            raise TrainplanError(f"no trainplan run in {root} to resume (run.json missing)", field="--resume")
        previous = _read_json(paths.run_config)
        if previous is None or "job" not in previous:
            raise TrainplanError(f"{paths.run_config} is unreadable; use --overwrite to start again", field="--resume")
        if previous["job"] != job:
            raise TrainplanError(
                f"{root} was started with a different job; resume it with the same job file or use --overwrite",
                field="--resume",
            )
        summary = _read_json(paths.summary)
        if summary is not None and summary.get("status") == RunStatus.COMPLETED:
            raise TrainplanError(
                f"the run in {root} already completed; use --overwrite to run it again",
                field="--resume",
            )
        return paths
    if root.exists() and any(p.name != LOCK_NAME for p in root.iterdir()):
        if not overwrite:
            raise TrainplanError(
                f"{root} exists and is not empty; pass --resume to continue it or --overwrite to replace it",
                field="--out",
            )
        if not is_run:
            raise TrainplanError(
                f"{root} is not a trainplan run directory (no run.json); refusing to delete it — choose another --out",
                field="--overwrite",
            )
        foreign = foreign_entries(root)
        if foreign:
            raise TrainplanError(
                f"{root} holds files trainplan did not write ({', '.join(foreign[:3])}); refusing to delete it — "
                "move them or choose another --out",
                field="--overwrite",
            )
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    return paths



LOCK_NAME = ".lock"


class RunLock:
    """An exclusive ``fcntl.flock`` on ``DIR/.lock``, held by the ``trainplan run`` that uses ``DIR``.

    A second run on the same directory (a ``--resume`` or ``--overwrite`` while the first trains, or two starts
    at once) is refused in one line instead of training beside it.  The kernel drops the lock when the holder
    exits, however it exits.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    @staticmethod
    def _holder(path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8").strip() or "?"
        except OSError:
            return "?"

    @classmethod
    def check_free(cls, root: Path) -> None:
        """Refuse when another process holds ``root``'s lock (before anything in ``root`` is touched)."""
        path = Path(root) / LOCK_NAME
        if not path.is_file():
            return
        cls.acquire(root).release()

    @classmethod
    def acquire(cls, root: Path) -> "RunLock":
        import fcntl

        path = Path(root) / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise TrainplanError(f"another trainplan run (pid {cls._holder(path)}) is using {root}; wait for it or "
                                 "choose another --out", field="--out") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(fd, path)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = -1
