"""Pieces several targets share: the run's own files, the worker command and its environment, host lists."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from trainplan.errors import SpecError
from trainplan.measure.probe import Accelerator
from trainplan.run.config import CONFIG_ENV
from trainplan.run.targets.base import LaunchPlan
from trainplan.run.targets.wheel import installed_wheel

RUN_JSON = "run.json"
DS_CONFIG = "ds_config.json"
JOB_COPY = "job.yaml"


def base_files(plan: LaunchPlan, *, wheel: bool = False) -> dict[str, str | bytes]:
    """``run.json`` (what every worker reads), the job file's copy, for ZeRO strategies ``ds_config.json``, and
    with ``wheel`` a wheel of the installed trainplan for nodes that do not have it (:mod:`.wheel`)."""
    files: dict[str, str | bytes] = {RUN_JSON: plan.config.dumps(), JOB_COPY: plan.job_path.read_text(encoding="utf-8")}
    if plan.config.deepspeed is not None:
        files[DS_CONFIG] = json.dumps(plan.config.deepspeed, indent=2, sort_keys=True) + "\n"
    if wheel:
        name, data = installed_wheel()
        files[name] = data
    return files


def python(plan: LaunchPlan | None = None) -> str:
    """The interpreter the commands run: ``--python``, else this one (nodes sharing this file system)."""
    if plan is not None and plan.options.python:
        return plan.options.python
    return sys.executable or "python3"


def extras(plan: LaunchPlan) -> str:
    """The extras a node needs for this plan."""
    if plan.is_tabular:
        return "tabular"
    names = ["torch"] + (["deepspeed"] if plan.config.deepspeed is not None else [])
    if plan.config.job.get("method") == "qlora":
        names.append("qlora")  # bitsandbytes
    return ",".join(names)


def release_pin(plan: LaunchPlan) -> str | None:
    """The requirement that installs the tabular library release the job names (``library_version``), for the nodes'
    install line; the worker refuses another release where it runs (run/worker.py)."""
    from trainplan.run.api import library_pin

    return library_pin(plan.job) if plan.is_tabular else None


def pip_install_args(plan: LaunchPlan, wheel: str) -> str:
    """``pip install``'s arguments on a node: the wheel with the plan's extras, and the named library release."""
    pin = release_pin(plan)
    return f"'{wheel}[{extras(plan)}]'" + (f" '{pin}'" if pin else "")


def cluster_release_notes(plan: LaunchPlan) -> tuple[str, ...]:
    """A note for a driver that submits to a running cluster (Dask / Ray ``--address``): its workers must have the
    library release the job names, which the render cannot install there."""
    pin = release_pin(plan)
    if pin is None or not plan.options.address:
        return ()
    return (f"the job names {plan.job.library.value} {plan.job.library_version}: the cluster's workers must run that "
            f"release (pip install '{pin}'); the prediction is for it",)


def install_hint(plan: LaunchPlan) -> str:
    """How to install trainplan on a node from the rendered wheel (a note of the targets that carry one)."""
    name, _ = installed_wheel()
    return (f"the nodes run {python(plan)} (--python to change it); where it lacks trainplan: "
            f"{python(plan)} -m pip install {pip_install_args(plan, str(plan.path(name)))}")


def worker_target(plan: LaunchPlan, config_path: str, *, module_flag: str = "--module") -> list[str]:
    """What the launcher starts in each process: the user's script, or trainplan's worker on ``config_path``."""
    if plan.options.script is not None:
        return [str(plan.options.script), *plan.options.script_args]
    return [module_flag, "trainplan.run.worker", config_path]


def worker_env(plan: LaunchPlan, config_path: str) -> dict[str, str]:
    """The environment every worker needs: its configuration, threads, and the communication library's settings."""
    config = plan.config
    env = {CONFIG_ENV: config_path, "TRAINPLAN_RUN_DIR": config.out_dir, "PYTHONUNBUFFERED": "1"}
    threads = config.threads_per_fit if plan.is_tabular else config.threads_per_process
    env["OMP_NUM_THREADS"] = str(threads)
    if plan.placement.nodes > 1:
        # Each rendezvous round gets a fresh store for the workers.  With the agents' shared store the workers
        # key their group by restart count, which differs between nodes when only one node's worker failed:
        # the restarted group then waits on stale addresses (seen with gloo, torch 2.13, two nodes).
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    if plan.placement.device is Accelerator.CUDA:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # a failed collective raises instead of hanging
        if plan.options.iface:
            env["NCCL_SOCKET_IFNAME"] = plan.options.iface
    elif plan.options.iface:
        env["GLOO_SOCKET_IFNAME"] = plan.options.iface
    return env


def read_hostfile(path: Path, *, field: str = "--hostfile") -> dict[str, int]:
    """``host slots=N`` lines (DeepSpeed's and Horovod's format; ``#`` starts a comment) → {host: slots}."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}", field=field) from None
    hosts: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        slots = [p for p in parts[1:] if p.startswith("slots=")]
        if len(parts) != 2 or len(slots) != 1 or not slots[0][6:].isdigit() or int(slots[0][6:]) < 1:
            raise SpecError(f"{path}:{number}: expected 'HOST slots=N', got {raw.strip()!r}", field=field)
        if parts[0] in hosts:
            raise SpecError(f"{path}:{number}: host {parts[0]} is listed twice", field=field)
        hosts[parts[0]] = int(slots[0][6:])
    if not hosts:
        raise SpecError(f"{path} names no host", field=field)
    return hosts


def hosts_for(plan: LaunchPlan, *, field: str = "--hostfile") -> dict[str, int]:
    """The hosts the launch uses: the hostfile's first ``nodes`` hosts, checked against the plan; one node defaults to localhost."""
    p = plan.placement
    if plan.options.hostfile is None:
        if p.nodes > 1:
            raise SpecError(f"the plan has {p.nodes} nodes: give a hostfile naming them ('HOST slots={p.procs_per_node}' lines)", field=field)
        return {"localhost": p.procs_per_node}
    hosts = read_hostfile(plan.options.hostfile, field=field)
    if len(hosts) < p.nodes:
        raise SpecError(f"{plan.options.hostfile} names {len(hosts)} host(s); the plan needs {p.nodes}", field=field)
    chosen = dict(list(hosts.items())[: p.nodes])
    short = {h: s for h, s in chosen.items() if s < p.procs_per_node}
    if short:
        host, slots = next(iter(short.items()))
        raise SpecError(
            f"{host} has {slots} slot(s); the plan needs {p.procs_per_node} per node "
            f"({p.nodes} × {p.procs_per_node} = {p.world_size} processes)",
            field=field,
        )
    return chosen
