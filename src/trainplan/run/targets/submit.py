"""Submit a rendered launch: check what the target needs is there, then run its command.

Checks come first and raise one-line errors — a Ray or Dask address that does
not answer, a launcher that is not installed, a multi-node torchrun without
``--node-rank`` — so a submit that cannot work writes nothing.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from dataclasses import dataclass
from importlib.util import find_spec
from urllib.parse import urlsplit

from trainplan.errors import SpecError, TrainplanError
from trainplan.run.launch import LaunchSpec, submit as run_spec
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, Target

#: Ports an address without one defaults to: Ray's GCS (a ``ray://`` client 10001, a dashboard 8265), Dask's scheduler.
DEFAULT_PORTS = {"ray": 6379, "ray-client": 10001, "http": 8265, "https": 8265, "dask": 8786}
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Submitted:
    """What a submit did: the exit code of the command, and a line for the user."""

    exit_code: int
    message: str


def host_port(address: str, target: Target) -> tuple[str, int]:
    """Host and port of a Ray or Dask address (``host:port``, ``tcp://``, ``ray://``, ``http://``)."""
    text = address if "://" in address else f"tcp://{address}"
    parts = urlsplit(text)
    if not parts.hostname:
        raise SpecError(f"not an address: {address!r}", field="--address")
    try:
        port = parts.port
    except ValueError:
        raise SpecError(f"bad port in {address!r}", field="--address") from None
    if port is None:
        key = {"ray": "ray-client", "http": "http", "https": "https"}.get(parts.scheme, target.value)
        port = DEFAULT_PORTS[key]
    return parts.hostname, port


def check_reachable(address: str, target: Target) -> None:
    """Raise a one-line error unless something accepts a TCP connection at ``address`` (within a few seconds)."""
    host, port = host_port(address, target)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise SpecError(f"cannot reach the {target.value} cluster at {address} ({host}:{port}: {why})", field="--address") from None


def _need_program(name: str, hint: str) -> None:
    if shutil.which(name) is None:
        raise SpecError(f"{name} is not installed here ({hint})", field="--submit")


def _need_module(name: str, hint: str) -> None:
    if find_spec(name) is None:
        raise SpecError(f"{name} is not installed here: {hint}", field="--submit")


def node_command(plan: LaunchPlan, rendered: Rendered) -> Command:
    """The command this machine runs: for torchrun, the one of ``--node-rank`` (node 0 on one node)."""
    if plan.target not in (Target.TORCHRUN, Target.TORCHTITAN):
        return rendered.commands[0]
    rank = plan.options.node_rank
    nodes = plan.placement.nodes
    if rank is None:
        if nodes > 1:
            raise SpecError(f"the plan has {nodes} nodes: say which one this machine is (0..{nodes - 1})", field="--node-rank")
        rank = 0
    if not 0 <= rank < nodes:
        raise SpecError(f"must be in 0..{nodes - 1}, got {rank}", field="--node-rank")
    return rendered.commands[rank]


def preflight(plan: LaunchPlan, rendered: Rendered) -> Command:
    """Everything a submit needs, checked before a file is written; returns the command to run here."""
    command = node_command(plan, rendered)
    target = plan.target
    if target in (Target.RAY, Target.DASK):
        _need_module(target.value if target is Target.RAY else "distributed", "pip install 'trainplan[cluster]'")
        if plan.options.address:
            check_reachable(plan.options.address, target)
            if target is Target.RAY:
                _need_program("ray", "pip install 'ray[default]'")
    elif target is Target.DEEPSPEED:
        _need_module("deepspeed", "pip install 'trainplan[deepspeed]'")
    elif target is Target.SLURM:
        _need_program("sbatch", "submit from a SLURM login node")
    elif target is Target.SKYPILOT:
        _need_program("sky", "pip install skypilot, then `sky check`")
    elif target is Target.TORCHTITAN:
        _need_module("torchtitan", "pip install torchtitan (with a PyTorch it supports)")
    elif target is Target.HOROVOD:
        _need_program("horovodrun", "pip install horovod; see docs/scale-out.md")
    return command


def submit(plan: LaunchPlan, command: Command) -> Submitted:
    """Run ``command`` (files already written); output goes to ``OUT/launch.log`` (sbatch: its job id is returned)."""
    if plan.target is Target.SLURM:
        proc = subprocess.run(list(command.argv), cwd=command.cwd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise TrainplanError(f"sbatch refused the job: {' '.join(proc.stderr.split())}", field="--submit")
        job_id = proc.stdout.strip().split(";")[0]
        return Submitted(0, f"submitted SLURM job {job_id} (output: {plan.path('slurm-' + job_id + '.out')})")
    log = plan.path("launch.log")
    rc = run_spec(LaunchSpec(argv=list(command.argv), env=dict(command.env), cwd=command.cwd), log_path=log)
    state = "finished" if rc == 0 else f"failed with exit code {rc}"
    return Submitted(rc, f"{plan.target.value} {state} (log: {log})")
