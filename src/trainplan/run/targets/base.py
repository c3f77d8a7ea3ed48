"""What every launch target shares: the target names, where the plan places the job, what a target renders.

A target's ``render(plan) -> Rendered`` is pure: files (name → text) and
commands (argument lists), never a shell string to run.  Some files are
shell scripts by the engine's design (an sbatch script, SkyPilot's ``run``
section); every value trainplan puts in them is quoted with :func:`shlex.quote`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainplan.catalog import get_catalog
from trainplan.errors import SpecError
from trainplan.estimate.stack import effective_knobs
from trainplan.measure.probe import Accelerator
from trainplan.run.config import RunConfig
from trainplan.strategies import Layout, Strategy

#: torchrun's rendezvous port (also the DeepSpeed launcher's master port) unless --master-port says otherwise.
DEFAULT_PORT = 29500


class Target(StrEnum):
    """Where ``trainplan launch`` hands the plan."""

    LOCAL = "local"  # this machine: the same as `trainplan run`
    TORCHRUN = "torchrun"
    DEEPSPEED = "deepspeed"
    SLURM = "slurm"
    RAY = "ray"
    DASK = "dask"
    SKYPILOT = "skypilot"
    HOROVOD = "horovod"
    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"

    @classmethod
    def parse(cls, value: str) -> "Target":
        try:
            return cls(value.lower())
        except ValueError:
            raise SpecError(f"must be one of {', '.join(t.value for t in cls)}, got {value!r}", field="--to") from None


@dataclass(frozen=True)
class Placement:
    """Where the chosen option puts the job: ``nodes`` × ``procs_per_node`` processes on ``device``.

    ``device`` is CUDA for a GPU plan, CPU for a CPU plan or for a rehearsal of
    a GPU plan on CPUs (``--device cpu``: the same layout, gloo, one core per
    process).  ``cloud`` and ``instance`` are set when the option names a
    catalog instance; ``hours`` is the plan's estimate (start-up included).
    A TPU option (``tpu`` = the chip, e.g. ``TPUv5e``) is one slice: ``procs_per_node`` is its chips (the
    data-parallel replicas), ``hosts`` its TPU VM hosts (each runs one process driving its chips), and
    ``device`` is the hosts' CPU as far as the run configuration is concerned.
    """

    nodes: int
    procs_per_node: int
    device: Accelerator
    cpus_per_node: int
    hours: float
    label: str
    gpu: str | None = None
    instance: str | None = None
    cloud: str | None = None
    spot: bool = False
    tpu: str | None = None
    hosts: int = 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


@dataclass(frozen=True)
class LaunchOptions:
    """What a target needs beyond the plan (command-line options of ``trainplan launch``)."""

    master_addr: str | None = None  # torchrun / DeepSpeed: the rendezvous host (node 0)
    master_port: int = DEFAULT_PORT
    node_rank: int | None = None  # torchrun --submit: which node this machine is
    hostfile: Path | None = None  # DeepSpeed / Horovod: "host slots=N" lines
    partition: str | None = None  # SLURM
    time_margin: float = 0.25  # SLURM: --time = estimate × (1 + margin), at least MIN_SLURM_MINUTES
    address: str | None = None  # Ray / Dask: an existing cluster; None starts a local one
    workers: int | None = None  # Ray / Dask tabular jobs: workers (default: nodes × processes)
    cloud: str | None = None  # SkyPilot: one of the clouds the plan considered
    bucket: str | None = None  # SkyPilot: checkpoint bucket
    install: str | None = None  # SkyPilot setup: what `pip install` gets
    python: str | None = None  # the interpreter on the nodes (default: this one, for nodes sharing its file system)
    horovod_mode: str = "gloo"  # gloo | mpi
    iface: str | None = None  # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME
    max_restarts: int = 2
    script: Path | None = None
    script_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class LaunchPlan:
    """A plan option made concrete for one target: the job, its placement and the workers' configuration.

    ``out`` receives the rendered files; ``config.out_dir`` is the run
    directory the workers write to (``out`` itself, unless the target keeps it
    elsewhere — SkyPilot's checkpoint bucket).
    """

    target: Target
    job_path: Path
    job: Any
    strategy: Strategy
    placement: Placement
    config: RunConfig
    out: Path
    options: LaunchOptions = field(default_factory=LaunchOptions)
    layout: Layout = field(default_factory=Layout)  # the option's degrees (data parallel only, except for torchtitan)
    micro_steps: int = 1  # micro-batches per data-parallel rank and optimizer step (accumulation, or the pipeline's m)

    @property
    def name(self) -> str:
        return str(self.job.name)

    @property
    def is_tabular(self) -> bool:
        return self.job.kind.value == "tabular"

    @cached_property
    def knobs(self) -> Any:
        """The knobs the plan was estimated with (estimate/stack.effective_knobs: the stack's defaults and the job's
        own), derived once for the renders that read them."""
        return effective_knobs(self.job, get_catalog())

    def path(self, name: str) -> Path:
        """Where a rendered file lands (absolute)."""
        return self.out / name


@dataclass(frozen=True)
class Command:
    """One command of a launch: argument list, environment additions, and where it runs."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    where: str = "this machine"
    cwd: Path | None = None


@dataclass(frozen=True)
class Rendered:
    """A rendered launch: files (name relative to ``out`` → text, or bytes: the wheel) and the commands, in order."""

    target: Target
    files: dict[str, str | bytes]
    commands: tuple[Command, ...]
    notes: tuple[str, ...] = ()
    executable: frozenset[str] = frozenset()  # file names written with the executable bit


def unsupported(plan: LaunchPlan, why: str) -> SpecError:
    """The one-line error for a target that cannot run this plan."""
    return SpecError(f"{plan.target.value} cannot run this plan: {why}", field="--to")
