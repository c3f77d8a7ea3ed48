"""Horovod: a ``horovodrun`` command for a Horovod training script, over gloo or MPI.

``horovodrun -np W -H host1:P,host2:P --gloo|--mpi python train.py ...`` with the
plan's processes.  Horovod averages gradients with its own allreduce (data
parallel, like DDP), so only ``ddp`` (or ``single``) plans render; trainplan's
built-in workers have no Horovod engine, so a script is required (``--script``).
Horovod's last release (0.28.1, 2023) does not build against current PyTorch
without source changes (docs/scale-out.md); the rendering is tested, not a run.
"""

from __future__ import annotations

from trainplan.errors import SpecError
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import RUN_JSON, base_files, hosts_for, python, worker_env
from trainplan.strategies import Strategy

MODES = ("gloo", "mpi")


def check(plan: LaunchPlan) -> dict[str, int]:
    if plan.is_tabular:
        raise unsupported(plan, "tabular jobs have no Horovod engine; use --to ray or dask")
    if plan.strategy not in (Strategy.DDP, Strategy.SINGLE):
        raise unsupported(plan, f"Horovod is data parallel (like ddp); the option's strategy is {plan.strategy.value}")
    if plan.options.script is None:
        raise SpecError("Horovod runs your Horovod script (trainplan's workers have no Horovod engine)", field="--script")
    if plan.options.horovod_mode not in MODES:
        raise SpecError(f"must be gloo or mpi, got {plan.options.horovod_mode!r}", field="--horovod")
    return hosts_for(plan)


def render(plan: LaunchPlan) -> Rendered:
    hosts = check(plan)
    config_path = str(plan.path(RUN_JSON))
    argv = [
        "horovodrun",
        "-np", str(plan.placement.world_size),
        "-H", ",".join(f"{h}:{s}" for h, s in hosts.items()),
        f"--{plan.options.horovod_mode}",
    ]  # fmt: skip
    if plan.options.iface:
        argv += ["--network-interface", plan.options.iface]
    argv += [python(plan), str(plan.options.script), *plan.options.script_args]
    command = Command(argv=tuple(argv), env=worker_env(plan, config_path), where="node 0", cwd=plan.out)
    return Rendered(plan.target, base_files(plan), (command,))
