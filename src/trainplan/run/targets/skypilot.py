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
from trainplan.run.targets.common import RUN_JSON, base_files, extras, release_pin, worker_env, worker_target
from trainplan.run.targets.wheel import installed_wheel
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
    from trainplan.catalog import get_catalog

    catalog = get_catalog()
    p = plan.placement
    allowed = [c for c in catalog.clouds if c != "local" and plan.job.constraints.allows(c)]
    if p.gpu is not None and p.instance is None:  # a GPU count, no instance: the clouds whose rows carry that GPU
        carrying = {i.cloud for i in catalog.instances if i.accelerator == p.gpu}
        allowed = [c for c in allowed if c in carrying]
    if p.cloud == "local":
        raise unsupported(plan, f"the option is a local machine ({p.label}); SkyPilot launches on clouds — pick a cloud option")
    asked = plan.options.cloud
    if asked is not None:
        asked = asked.lower()
        if asked not in allowed:
            which = f"the clouds the job allows that have {p.gpu}" if p.gpu is not None and p.instance is None else "the job allows"
            raise SpecError(f"{asked} was not considered by the plan ({which}: {', '.join(allowed) or 'none'})", field="--cloud")
        if p.cloud is not None and asked != p.cloud:
            raise SpecError(f"the option is {p.label} on {p.cloud}; the plan did not price it on {asked}", field="--cloud")
        return [asked]
    if p.cloud is not None:
        return [p.cloud]
    if not allowed:
        raise SpecError(f"no cloud the job allows (constraints.clouds) has {p.gpu or 'this option'} in the catalog", field="--cloud")
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
    """What setup installs: ``--install``, else the rendered wheel of this trainplan (uploaded with the workdir)."""
    if plan.options.install:
        return plan.options.install
    name, _ = installed_wheel()
    return f"./{name}[{extras(plan)}]"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (``setup``, ``run``) as literal blocks, the way people write SkyPilot tasks."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def _tpu_task(plan: LaunchPlan, env: dict[str, str]) -> tuple[dict[str, object], tuple[str, ...]]:
    """A Cloud TPU VM slice: ``accelerators: tpu-v5litepod-8`` with its software image in ``accelerator_args``
    (run/tpu.py), ``num_nodes: 1`` — SkyPilot treats a TPU slice as one node and runs ``run`` on every host of a
    multi-host slice (sky/backends/cloud_vm_ray_backend.py, ``num_ips_per_node`` of a TPU VM pod; skypilot 0.14.1).
    Keras jobs run trainplan's worker under TPUStrategy; transformer / torch jobs run the user's script under
    torch_xla (``PJRT_DEVICE=TPU``)."""
    from trainplan.run.tpu import runtime_version, tpu_launch

    p = plan.placement
    assert p.tpu is not None and p.instance is not None
    keras = plan.job.kind.value == "keras"
    framework = "tf" if keras else "torch_xla"
    script = plan.options.script
    if script is not None:  # uploaded with the task's workdir (the rendered folder), run from there
        target = [script.name, *plan.options.script_args]
    elif keras:
        target = ["-m", "trainplan.run.workloads.keras", RUN_JSON]
    else:
        target = worker_target(plan, RUN_JSON, module_flag="-m")
    argv, framework_env = tpu_launch(framework, target[0], tuple(target[1:]))
    env.update(framework_env)
    env.update({"KERAS_BACKEND": "tensorflow"} if keras else {})
    resources: dict[str, object] = {
        "infra": "gcp",
        "accelerators": p.instance,
        "accelerator_args": {"runtime_version": runtime_version(p.tpu, framework, hosts=p.hosts), "tpu_vm": True},
    }
    if p.spot:
        resources["use_spot"] = True
    run = f"mkdir -p {shlex.quote(plan.config.out_dir)}\n{shlex.join(argv)}\n"
    notes = [f"{p.instance} is {p.procs_per_node} {p.tpu} chips on {p.hosts} TPU VM host(s); SkyPilot runs `run` on each host"]
    if keras:
        notes.append("the TensorFlow TPU image brings TensorFlow and Keras 3; setup installs trainplan without them")
    else:
        notes.append("your script runs under torch_xla (PJRT_DEVICE=TPU) on every host; trainplan's torch worker does not "
                     "run on XLA")  # fmt: skip
    return {"resources": resources, "run": run}, tuple(notes)


def render(plan: LaunchPlan) -> Rendered:
    if plan.placement.tpu is not None:
        return _render_tpu(plan)
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
        "setup": "pip install " + " ".join(shlex.quote(r) for r in (_install(plan), release_pin(plan)) if r) + "\n",
        "run": _run(plan),
    }
    files = base_files(plan, wheel=not plan.options.install)
    files[TASK] = _task_text(plan, task, bucket)
    return Rendered(plan.target, files, (_launch_command(plan, name),))


def _task_text(plan: LaunchPlan, task: dict[str, object], bucket: str) -> str:
    """task.yaml: a header saying what was rendered and where the checkpoints live, then the task."""
    return (
        f"# Rendered by trainplan launch --to skypilot: {plan.name} on {plan.placement.label}, {plan.strategy.value}.\n"
        f"# The run directory {plan.config.out_dir} is in the bucket {bucket}: a recovered job resumes from its checkpoint.\n"
        + yaml.dump(task, Dumper=_Dumper, sort_keys=False)
    )


def _launch_command(plan: LaunchPlan, name: str) -> Command:
    """``sky launch`` of the task, or ``sky jobs launch`` on spot (a managed job: SkyPilot relaunches it after a
    preemption)."""
    task_path = str(plan.path(TASK))
    if plan.placement.spot:
        argv: tuple[str, ...] = ("sky", "jobs", "launch", "--name", name, "--yes", task_path)
    else:
        argv = ("sky", "launch", "--cluster", f"trainplan-{name}", "--yes", task_path)
    return Command(argv=argv, where="this machine (SkyPilot's client)")


def _render_tpu(plan: LaunchPlan) -> Rendered:
    asked = (plan.options.cloud or "gcp").lower()
    if asked != "gcp":
        raise SpecError(f"the option is a TPU slice ({plan.placement.label}); TPU VMs run on gcp, not {asked}", field="--cloud")
    name = slug(plan.name)
    bucket = plan.options.bucket or f"trainplan-{name}-ckpt"
    env = worker_env(plan, RUN_JSON)
    tpu, notes = _tpu_task(plan, env)
    wheel, _ = installed_wheel()
    install = plan.options.install or (f"./{wheel}" if plan.job.kind.value == "keras" else f"./{wheel}[torch]")
    task = {
        "name": name,
        "workdir": str(plan.out),
        "num_nodes": 1,
        "resources": tpu["resources"],
        "envs": env,
        "file_mounts": {MOUNT: {"name": bucket, "mode": "MOUNT"}},
        "setup": f"pip install {shlex.quote(install)}\n",
        "run": tpu["run"],
    }
    files = base_files(plan, wheel=not plan.options.install)
    script = plan.options.script
    if script is not None:
        if script.name in files or script.name == TASK:
            raise SpecError(f"the script's name {script.name} clashes with a rendered file; rename it", field="--script")
        try:
            files[script.name] = script.read_text(encoding="utf-8")
        except OSError as exc:
            raise SpecError(f"cannot read {script}: {exc.strerror or exc}", field="--script") from None
        notes = (*notes, f"{script.name} is copied into the task's workdir; modules it imports from beside it are not")
    files[TASK] = _task_text(plan, task, bucket)
    return Rendered(plan.target, files, (_launch_command(plan, name),), notes)

