"""Run a planned job on this machine: ``trainplan run``.

Public pieces:

* :func:`execute` / :class:`RunRequest` / :class:`RunSummary` — the whole run as a library call;
* :class:`RunConfig` — what every worker of a run is told (``run.json``);
* :class:`WorkerResult` / :class:`RunStatus` — what the workers measured (``result.json``);
* :func:`render` / :func:`submit` / :class:`LaunchSpec` — launch as render + submit;
* :func:`deepspeed_config` — the DeepSpeed JSON of a ZeRO strategy;
* :func:`prepare_launch` / :class:`LaunchRequest` / :class:`LaunchPlan` / :class:`Target` /
  :func:`write_rendered` — ``trainplan launch``: a plan option rendered for torchrun, the DeepSpeed
  launcher, SLURM, Ray, Dask, SkyPilot or Horovod (:mod:`trainplan.run.targets`);
* :data:`PREEMPTED_EXIT_CODE` — the exit code of a run stopped by SIGTERM.

Importing this package imports nothing heavy; names load on first use.  The
training-script API is :mod:`trainplan.run.runtime` (``import trainplan.runtime``
for scripts); docs/run.md ("Where things live") maps the modules.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "PREEMPTED_EXIT_CODE": "trainplan.run.api",
    "RunRequest": "trainplan.run.api",
    "RunSummary": "trainplan.run.api",
    "execute": "trainplan.run.api",
    "LaunchPlan": "trainplan.run.targets",
    "LaunchRequest": "trainplan.run.targets",
    "Target": "trainplan.run.targets",
    "prepare_launch": "trainplan.run.targets",
    "write_rendered": "trainplan.run.targets",
    "RunConfig": "trainplan.run.config",
    "RunStatus": "trainplan.run.results",
    "WorkerResult": "trainplan.run.results",
    "LaunchSpec": "trainplan.run.launch",
    "deepspeed_config": "trainplan.run.launch",
    "render": "trainplan.run.launch",
    "submit": "trainplan.run.launch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the public names on first use (keeps ``import trainplan.run.config`` cheap and cycle-free)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trainplan.run' has no attribute {name!r}")
    return getattr(import_module(module), name)
