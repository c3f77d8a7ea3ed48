"""``trainplan launch JOB --to TARGET``: render the plan for an engine (and with ``--submit``, run it).

Thin: parses options, calls :mod:`trainplan.run.targets`, prints the files
and the commands.  ``--to local`` is ``trainplan run``.  Bad input raises
:class:`~trainplan.errors.TrainplanError` (one line, exit 2) before a file is
written.
"""

from __future__ import annotations

import json
import shlex
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from trainplan.errors import SpecError
from trainplan.run.targets import LAUNCH_RECORD, LaunchOptions, LaunchRequest, Target, prepare_launch, write_rendered
from trainplan.run.targets.files import launch_record

_TARGETS = ", ".join(t.value for t in Target)


def _default_out(job: Path, target: Target) -> Path:
    return Path("runs") / f"{job.stem}-{target.value}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _local(job: Path, out: Optional[Path], strategy: Optional[str], devices: Optional[int], steps: Optional[int],
           checkpoint_every: Optional[int], checkpoint_minutes: float, overwrite: bool, script: Optional[Path],
           script_arg: Optional[list[str]], max_restarts: int, json_out: bool) -> None:  # fmt: skip
    from trainplan.cli.run import run_command

    run_command(job=job, out=out, strategy=strategy, devices=devices, steps=steps, checkpoint_every=checkpoint_every,
                checkpoint_minutes=checkpoint_minutes, resume=False, overwrite=overwrite, script=script,
                script_arg=script_arg, max_restarts=max_restarts, json_out=json_out)  # fmt: skip


def launch_command(
    job: Annotated[Path, typer.Argument(help="Job file (YAML).", show_default=False)],
    to: Annotated[str, typer.Option("--to", help=f"Target: {_TARGETS}.", show_default=False)],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Folder for the rendered files (default: runs/<job>-<target>-<time>).")] = None,
    option: Annotated[Optional[int], typer.Option(help="The N-th option of `trainplan plan`'s ranking (default 1).")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="Accelerator ID, e.g. A100-80GB (instead of --option).")] = None,
    gpus: Annotated[int, typer.Option(help="GPUs per node (with --gpu).")] = 1,
    nodes: Annotated[int, typer.Option(help="Nodes.")] = 1,
    instance: Annotated[Optional[str], typer.Option(help="Instance type (instead of --option).")] = None,
    cpus: Annotated[Optional[int], typer.Option(help="vCPUs of a CPU machine (tabular jobs).")] = None,
    strategy: Annotated[Optional[str], typer.Option(help="Strategy (default: the fastest that fits).")] = None,
    tp: Annotated[int, typer.Option("--tp", help="--to torchtitan / megatron: tensor parallel degree (with --gpu / --instance).")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="--to torchtitan / megatron: pipeline parallel stages.")] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="--to torchtitan / megatron: virtual pipeline stages per rank (interleaved 1F1B).")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="--to torchtitan / megatron: context parallel degree.")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="--to torchtitan / megatron: expert parallel degree (MoE models).")] = 1,
    sp: Annotated[bool, typer.Option("--sp", help="--to torchtitan / megatron: sequence parallelism over the tensor-parallel ranks.", metavar="")] = False,
    device: Annotated[Optional[str], typer.Option(help="cpu: rehearse the plan's layout on CPUs with gloo.")] = None,
    devices: Annotated[Optional[int], typer.Option(help="--to local only: devices, as `trainplan run --devices`.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Train this many steps (boosting rounds for tabular jobs).")] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option(help="Checkpoint every N steps.")] = None,
    checkpoint_minutes: Annotated[float, typer.Option(help="Checkpoint every N minutes (0: never by time).")] = 10.0,
    submit: Annotated[bool, typer.Option("--submit", help="Run the rendered command (or sbatch it, or sky launch it).", metavar="")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a folder trainplan rendered before.", metavar="")] = False,
    master_addr: Annotated[Optional[str], typer.Option(help="torchrun / DeepSpeed: the rendezvous host (node 0).")] = None,
    master_port: Annotated[int, typer.Option(help="torchrun / DeepSpeed: the rendezvous port.")] = 29500,
    node_rank: Annotated[Optional[int], typer.Option(help="torchrun --submit: which node this machine is.")] = None,
    hostfile: Annotated[Optional[Path], typer.Option(help="DeepSpeed / Horovod: 'HOST slots=N' lines.")] = None,
    partition: Annotated[Optional[str], typer.Option(help="SLURM partition.")] = None,
    time_margin: Annotated[float, typer.Option(help="SLURM: --time = estimate × (1 + margin).")] = 0.25,
    address: Annotated[Optional[str], typer.Option(help="Ray / Dask: an existing cluster (default: a local one).")] = None,
    workers: Annotated[Optional[int], typer.Option(help="Ray / Dask, tabular jobs: workers.")] = None,
    cloud: Annotated[Optional[str], typer.Option(help="SkyPilot: one of the clouds the plan considered.")] = None,
    bucket: Annotated[Optional[str], typer.Option(help="SkyPilot: the checkpoint bucket.")] = None,
    install: Annotated[Optional[str], typer.Option(help="SkyPilot setup: what `pip install` gets (default: the rendered wheel of this trainplan).")] = None,
    python: Annotated[Optional[str], typer.Option("--python", help="The interpreter on the nodes (SLURM, torchrun, DeepSpeed, Ray, Dask; default: this one).")] = None,
    horovod: Annotated[str, typer.Option(help="Horovod controller: gloo or mpi.")] = "gloo",
    iface: Annotated[Optional[str], typer.Option(help="Network interface for NCCL / gloo.")] = None,
    max_restarts: Annotated[int, typer.Option(help="torchrun: restarts of the worker group after a worker dies.")] = 2,
    script: Annotated[Optional[Path], typer.Option(help="Your training script instead of trainplan's worker.")] = None,
    script_arg: Annotated[Optional[list[str]], typer.Option("--script-arg", help="An argument for the script (repeatable).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the launch record (files, commands) as JSON.", metavar="")] = False,
) -> Optional[int]:
    """Render the plan for a cluster engine — files in --out, the command printed — and with --submit run it."""
    target = Target.parse(to)
    if target is Target.LOCAL:
        named = [n for n, v in (("--option", option), ("--gpu", gpu), ("--instance", instance), ("--cpus", cpus)) if v is not None]
        if named:
            raise SpecError(f"--to local runs on this machine, like `trainplan run`; {named[0]} names other hardware", field=named[0])
        if (tp, pp, vpp, cp, ep, sp) != (1, 1, 1, 1, 1, False):
            raise SpecError("--to local is `trainplan run`, which takes --tp / --sp itself", field="--tp/--pp/--cp/--ep")
        _local(job, out, strategy, devices, steps, checkpoint_every, checkpoint_minutes, overwrite, script, script_arg, max_restarts, json_out)
        return None
    if devices is not None:
        raise SpecError("applies to --to local; for a cluster give --gpu/--gpus/--nodes or --option", field="--devices")
    request = LaunchRequest(
        job_path=job, target=target, out=out or _default_out(job, target), option=option, gpu=gpu, gpus=gpus,
        nodes=nodes, instance=instance, cpus=cpus, strategy=strategy, device=device, steps=steps,
        degrees=dict(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sequence_parallel=sp),
        checkpoint_every=checkpoint_every, checkpoint_minutes=checkpoint_minutes or None, overwrite=overwrite,
        options=LaunchOptions(
            master_addr=master_addr, master_port=master_port, node_rank=node_rank, hostfile=hostfile,
            partition=partition, time_margin=time_margin, address=address, workers=workers, cloud=cloud,
            bucket=bucket, install=install, python=python, horovod_mode=horovod, iface=iface, max_restarts=max_restarts,
            script=script.resolve() if script else None, script_args=tuple(script_arg or ()),
        ),
    )  # fmt: skip
    plan, rendered = prepare_launch(request)
    command = None
    if submit:
        from trainplan.run.targets.submit import preflight

        command = preflight(plan, rendered)
    write_rendered(rendered, plan.out)
    err = Console(stderr=True, highlight=False, soft_wrap=True, markup=False)  # paths and notes are data, not markup
    if json_out:
        typer.echo(json.dumps({"out": str(plan.out), **launch_record(rendered)}))
    else:
        p = plan.placement
        what = plan.job.library.value if plan.is_tabular else plan.strategy.value
        where = (f"one slice of {p.procs_per_node} {p.tpu} chips on {p.hosts} TPU VM host(s)" if p.tpu is not None
                 else f"{p.nodes} node(s) × {p.procs_per_node} process(es) on {p.device.value}")
        err.print(f"trainplan launch --to {target.value}: {plan.name} on {p.label}, {what}, {where}; files in {plan.out}")  # fmt: skip
        for name in sorted({*rendered.files, LAUNCH_RECORD}):
            typer.echo(f"  {plan.out / name}")
        commands = rendered.commands
        for i, c in enumerate(commands):
            if len(commands) > 4 and 2 <= i < len(commands) - 1:  # a command per node: 2,048 of them for some plans
                if i == 2:
                    typer.echo(f"# … nodes 2 to {len(commands) - 2}: the same command with their --node-rank "
                               f"(every one in {plan.out / LAUNCH_RECORD})")  # fmt: skip
                continue
            typer.echo(f"# on {c.where}" + (f" (in {c.cwd})" if c.cwd else ""))
            typer.echo(shlex.join(c.argv))
        for note in (*plan.config.notes, *rendered.notes):
            err.print(f"note: {note}")
    if command is None:
        return None
    from trainplan.run.targets.submit import submit as run_submit

    result = run_submit(plan, command)
    err.print(result.message, highlight=False, soft_wrap=True)
    if result.exit_code:
        raise typer.Exit(result.exit_code)
    return None
