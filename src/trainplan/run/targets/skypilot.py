"""SkyPilot: a task YAML for the plan's hardware that ``sky launch`` / ``sky jobs launch`` accept unchanged.

``resources`` carries the accelerators and their count per node (or the
instance type, or the vCPUs of a CPU plan), the cloud (``infra``; one
``any_of`` entry per cloud the job allows when the option names no instance)
and ``use_spot`` where the job allows spot and the plan priced it.  The
rendered files go up as the task's ``workdir``; ``setup`` installs trainplan;
``run`` is the rendered torchrun (node rank and rendezvous host from
SkyPilot's ``SKYPILOT_NODE_RANK`` / ``SKYPILOT_NODE_IPS``) or the tabular worker.
The run directory is a bucket mounted at :data:`MOUNT`, so a job recovered
after preemption (``sky jobs launch`` does that for spot) resumes from its
last checkpoint.  ``run`` and ``setup`` are shell by SkyPilot's design; every
value trainplan writes into them is quoted.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from trainplan.errors import SpecError
from trainplan.measure.probe import Accelerator
from trainplan.run.launch import uses_torchrun
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import RUN_JSON, base_files, worker_env, worker_target
from trainplan.run.targets.torchrun import node_argv

TASK = "task.yaml"
#: Where the checkpoint bucket is mounted on every node; the run directory is MOUNT/<job name>.
MOUNT = "/checkpoints"
#: trainplan's accelerator ids → SkyPilot's names (its catalog calls the 40 GB A100 "A100").
SKY_ACCELERATORS = {
    "A100-80GB": "A100-80GB",
    "A100-40GB": "A100",
    "V100-16GB": "V100",
    "V100-32GB": "V100-32GB",
    "H100-80GB": "H100",
    "H200": "H200",
    "L4": "L4",
    "A10G": "A10G",
    "T4": "T4",
}
_MASTER, _RANK = "TRAINPLAN_MASTER_PLACEHOLDER", "TRAINPLAN_RANK_PLACEHOLDER"


def slug(name: str) -> str:
    """A name clouds accept for clusters and buckets: lowercase letters, digits and dashes."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", name.lower())).strip("-")[:48] or "job"


def remote_run_dir(job_name: str) -> Path:
    """The run directory on the nodes: inside the mounted checkpoint bucket."""
    return Path(MOUNT) / slug(job_name)


def _clouds(plan: LaunchPlan) -> list[str]:
    allowed = [c.value for c in plan.job.constraints.clouds if c.value != "local"]
    p = plan.placement
    if p.cloud == "local":
        raise unsupported(plan, f"the option is a local machine ({p.label}); SkyPilot launches on clouds — pick a cloud option")
    asked = plan.options.cloud
    if asked is not None:
        asked = asked.lower()
        if asked not in allowed:
            raise SpecError(f"{asked} was not considered by the plan (the job allows {', '.join(allowed) or 'no cloud'})", field="--cloud")
        if p.cloud is not None and asked != p.cloud:
            raise SpecError(f"the option is {p.label} on {p.cloud}; the plan did not price it on {asked}", field="--cloud")
        return [asked]
    if p.cloud is not None:
        return [p.cloud]
    if not allowed:
        raise SpecError("the job allows no cloud (constraints.clouds)", field="--cloud")
    return allowed


def _resources(plan: LaunchPlan, clouds: list[str]) -> dict[str, object]:
    p = plan.placement
    res: dict[str, object] = {}
    if p.instance is not None:
        res["instance_type"] = p.instance
    if p.gpu is not None:
        if p.gpu not in SKY_ACCELERATORS:
            raise unsupported(plan, f"{p.gpu} is not a cloud accelerator SkyPilot provisions")
        res["accelerators"] = f"{SKY_ACCELERATORS[p.gpu]}:{p.procs_per_node if not plan.is_tabular else 1}"
    elif p.instance is None:
        res["cpus"] = f"{p.cpus_per_node}+"
    if len(clouds) == 1:
        res["infra"] = clouds[0]
    else:
        res["any_of"] = [{"infra": c} for c in clouds]
    if p.spot:
        res["use_spot"] = True
    return res


def _run(plan: LaunchPlan) -> str:
    lines = [f"mkdir -p {shlex.quote(plan.config.out_dir)}"]
    if not uses_torchrun(plan.config):
        lines.append(shlex.join(["python", *worker_target(plan, RUN_JSON, module_flag="-m")]))
        return "\n".join(lines) + "\n"
    p = plan.placement
    argv = node_argv(plan, 0, master_addr=_MASTER if p.nodes > 1 else None, config_path=RUN_JSON, interpreter="python")
    argv = [f"--node-rank={_RANK}" if a.startswith("--node-rank=") else a for a in argv]
    if p.nodes > 1:
        lines.append('MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)')
    lines.append(shlex.join(argv).replace(_MASTER, "${MASTER_ADDR}").replace(_RANK, "${SKYPILOT_NODE_RANK}"))
    return "\n".join(lines) + "\n"


def _install(plan: LaunchPlan) -> str:
    if plan.options.install:
        return plan.options.install
    if plan.is_tabular:
        return "trainplan[tabular]"
    return "trainplan[torch,deepspeed]" if plan.config.deepspeed is not None else "trainplan[torch]"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (``setup``, ``run``) as literal blocks, the way people write SkyPilot tasks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def render(plan: LaunchPlan) -> Rendered:
    clouds = _clouds(plan)
    resources = _resources(plan, clouds)
    name = slug(plan.name)
    bucket = plan.options.bucket or f"trainplan-{name}-ckpt"
    env = worker_env(plan, RUN_JSON)
    if plan.placement.device is Accelerator.CPU and not plan.is_tabular:
        raise unsupported(plan, "a CPU rehearsal (--device cpu) is for this machine; SkyPilot provisions the plan's GPUs")
    task = {
        "name": name,
        "workdir": str(plan.out),
        "num_nodes": plan.placement.nodes,
        "resources": resources,
        "envs": env,
        "file_mounts": {MOUNT: {"name": bucket, "mode": "MOUNT"}},
        "setup": f"pip install {shlex.quote(_install(plan))}\n",
        "run": _run(plan),
    }
    files = base_files(plan)
    files[TASK] = (
        f"# Rendered by trainplan launch --to skypilot: {plan.name} on {plan.placement.label}, {plan.strategy.value}.\n"
        f"# The run directory {plan.config.out_dir} is in the bucket {bucket}: a recovered job resumes from its checkpoint.\n"
        + yaml.dump(task, Dumper=_Dumper, sort_keys=False)
    )
    task_path = str(plan.path(TASK))
    if plan.placement.spot:  # a managed job: SkyPilot relaunches it after a preemption
        argv = ("sky", "jobs", "launch", "--name", name, "--yes", task_path)
    else:
        argv = ("sky", "launch", "--cluster", f"trainplan-{name}", "--yes", task_path)
    return Rendered(plan.target, files, (Command(argv=argv, where="this machine (SkyPilot's client)"),))
