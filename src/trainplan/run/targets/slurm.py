"""SLURM: an sbatch script that runs the plan's torchrun on every node with srun.

Directives come from the plan: ``--nodes``, one task per node, ``--gpus-per-node``
(GPU plans), ``--cpus-per-task``, and ``--time`` = the plan's estimate (start-up
included) × (1 + margin), rounded up to the minute and at least
:data:`MIN_MINUTES`.  ``--requeue`` puts a preempted job back in the queue; SLURM's
SIGTERM reaches torchrun, the workers write a checkpoint, and the requeued job
resumes from the run directory.  Node 0 (the first host of the allocation) is
the c10d rendezvous host; node ranks come from the rendezvous.

An sbatch script is a shell script by SLURM's design: every value trainplan
writes into it is quoted (:func:`shlex.quote`); only ``$MASTER_ADDR``, read
from the allocation, is expanded.
"""

from __future__ import annotations

import math
import shlex

from trainplan.errors import SpecError
from trainplan.measure.probe import Accelerator
from trainplan.run.launch import uses_torchrun
from trainplan.run.targets.base import Command, LaunchPlan, Rendered
from trainplan.run.targets.common import (RUN_JSON, base_files, install_hint, pip_install_args, python, worker_env,
                                          worker_target)  # fmt: skip
from trainplan.run.targets.wheel import installed_wheel
from trainplan.run.targets.torchrun import node_argv

SCRIPT = "job.sbatch"
#: The shortest --time trainplan asks for (a tiny job's estimate is seconds; queues round up anyway).
MIN_MINUTES = 10
_MASTER = "TRAINPLAN_MASTER_ADDR_PLACEHOLDER"


def time_limit(hours: float, margin: float) -> str:
    """SLURM's ``D-HH:MM:SS`` for ``hours`` × (1 + ``margin``), rounded up to the minute, at least MIN_MINUTES."""
    if margin < 0:
        raise SpecError(f"must be >= 0, got {margin}", field="--time-margin")
    minutes = max(MIN_MINUTES, math.ceil(hours * 60 * (1 + margin)))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def _job_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:64] or "trainplan"


def _launch_line(plan: LaunchPlan, config_path: str) -> str:
    p = plan.placement
    if not uses_torchrun(plan.config):  # tabular jobs, one plain process
        argv = [python(plan), *worker_target(plan, config_path, module_flag="-m")]
    else:
        master = _MASTER if p.nodes > 1 else None
        argv = [a for a in node_argv(plan, 0, master_addr=master, config_path=config_path) if not a.startswith("--node-rank=")]
    srun = ["srun", f"--nodes={p.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    return shlex.join(srun + argv).replace(_MASTER, "${MASTER_ADDR}")


def check(plan: LaunchPlan) -> str:
    if not plan.options.partition:
        raise SpecError("SLURM needs a partition to submit to (sinfo lists them)", field="--partition")
    return time_limit(plan.placement.hours, plan.options.time_margin)


def render(plan: LaunchPlan) -> Rendered:
    limit = check(plan)
    p = plan.placement
    config_path = str(plan.path(RUN_JSON))
    env = worker_env(plan, config_path)
    margin = plan.options.time_margin
    lines = [
        "#!/bin/bash",
        f"# Rendered by trainplan launch --to slurm: {plan.name} on {p.label}, {plan.strategy.value}, "
        f"{p.nodes} node(s) x {p.procs_per_node} process(es).",
        f"# --time: the plan's estimate ({p.hours:.2f} h, start-up included) x {1 + margin:g} "
        f"({margin:.0%} margin), rounded up, at least {MIN_MINUTES} min.",
        "# Preemption: --requeue requeues the job; the workers checkpoint on SIGTERM and the new job resumes.",
        f"#SBATCH --job-name={_job_name(plan.name)}",
        f"#SBATCH --partition={shlex.quote(plan.options.partition or '')}",
        f"#SBATCH --nodes={p.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={p.cpus_per_node}",
    ]
    if p.device is Accelerator.CUDA:
        lines.append(f"#SBATCH --gpus-per-node={p.procs_per_node}")
    lines += [
        f"#SBATCH --time={limit}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={shlex.quote(str(plan.path('slurm-%j.out')))}",
        "set -euo pipefail",
        *(f"export {k}={shlex.quote(v)}" for k, v in env.items()),
    ]
    if p.nodes > 1:
        lines.append('MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    wheel, _ = installed_wheel()
    py = shlex.quote(python(plan))
    missing = (f"error: {python(plan)} cannot import trainplan on a node of this job; install it from the rendered wheel: "
               f"{python(plan)} -m pip install {pip_install_args(plan, str(plan.path(wheel)))} (or render with --python)")
    lines += [
        "# every node must import trainplan with the interpreter below (checked on each node before the run)",
        f"srun --nodes={p.nodes} --ntasks-per-node=1 {py} -c 'import trainplan' || "
        f"{{ echo {shlex.quote(missing)} >&2; exit 2; }}",
        _launch_line(plan, config_path),
    ]
    files = base_files(plan, wheel=True)
    files[SCRIPT] = "\n".join(lines) + "\n"
    command = Command(argv=("sbatch", "--parsable", str(plan.path(SCRIPT))), where="a SLURM login node", cwd=plan.out)
    notes = ("the run directory must be on storage every node sees", install_hint(plan))
    return Rendered(plan.target, files, (command,), notes, frozenset({SCRIPT}))
