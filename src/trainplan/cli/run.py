"""``trainplan run``: train a job on this machine and compare with the plan.

Thin: parses options, calls :func:`trainplan.run.execute`, prints a table (or
one JSON line with ``--json``) and exits with the run's code — 0 completed,
75 preempted (SIGTERM; a checkpoint was written, ``--resume`` continues),
the script's exit code (or 1) when training failed.  Bad input raises
:class:`~trainplan.errors.TrainplanError`, which the CLI's main turns into one
line and exit code 2.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from trainplan.cli.progress import ProgressView, TokenizeView

if TYPE_CHECKING:
    from trainplan.run.api import RunSummary
    from trainplan.run.choose import Option
    from trainplan.run.config import RunConfig
    from trainplan.run.launch import LaunchSpec


def _fmt(value: float | None, key: str) -> str:
    if value is None:
        return "–"
    if key.endswith("_per_s"):
        return f"{value:,.0f}"
    if key == "peak_gib":
        return f"{value:.3f}"
    return f"{value:.4g}"


def _table(summary: RunSummary) -> Table:
    table = Table(title=f"{summary.status}: {summary.strategy} × {summary.devices} on {summary.hardware_id}")
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column("predicted", justify="right")
    table.add_column("error", justify="right")
    for key, measured in summary.measured.items():
        err = summary.error.get(key)
        table.add_row(
            key,
            _fmt(measured, key),
            _fmt(summary.predicted.get(key), key),
            "–" if err is None else f"{err:+.0%}",
        )
    return table


def _default_out(job: Path) -> Path:
    return Path("runs") / f"{job.stem}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run_command(
    job: Annotated[
        Optional[Path], typer.Argument(help="Job file (YAML); optional with --script (then give --steps).", show_default=False)
    ] = None,
    out: Annotated[
        Optional[Path], typer.Option("--out", "-o", help="Run directory (default: runs/<job>-<time>).")
    ] = None,
    strategy: Annotated[
        Optional[str],
        typer.Option(help="single, ddp, fsdp, fsdp-grad-op, fsdp-offload, zero1, zero2, zero3, zero1-offload, zero2-offload, zero3-offload."),
    ] = None,
    devices: Annotated[
        Optional[int], typer.Option(help="GPUs, or worker processes on CPU (parallel fits for tabular jobs).")
    ] = None,
    steps: Annotated[
        Optional[int], typer.Option(help="Train this many steps (boosting rounds for tabular jobs).")
    ] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option(help="Checkpoint every N steps.")] = None,
    checkpoint_minutes: Annotated[float, typer.Option(min=0, help="Checkpoint every N minutes (0: never by time).")] = 10.0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the run in --out from its last checkpoint.", metavar="")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace the run in --out.", metavar="")] = False,
    script: Annotated[
        Optional[Path], typer.Option(help="Your training script, launched as the plan says (uses trainplan.runtime).")
    ] = None,
    script_arg: Annotated[
        Optional[list[str]], typer.Option("--script-arg", help="An argument for the script (repeatable).")
    ] = None,
    max_restarts: Annotated[int, typer.Option(help="Restarts of the worker group after a worker dies (torchrun).")] = 2,
    tp: Annotated[int, typer.Option("--tp", help="Tensor parallel degree inside FSDP (kind: transformer, Llama family).")] = 1,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism over the tensor-parallel ranks.", metavar="")] = False,
    ep: Annotated[int, typer.Option("--ep", help="Expert parallel degree inside FSDP (kind: transformer, a mixture-of-experts model).")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages, FSDP over each stage's ranks (kind: transformer, Llama family).")] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="Pipeline chunks per rank: interleaved 1F1B (with --pp).")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as one JSON line (the last line of stdout).", metavar="")] = False,
) -> None:
    """Train JOB on this machine — the best option it can run, or the one named — and compare with the plan."""
    named = job or script
    if named is None:
        from trainplan.errors import SpecError

        raise SpecError("give a job file, or --script PATH to run your own script", field="JOB")
    from trainplan.run.api import RunRequest, execute  # imported by the command that uses it: `plan` starts faster

    request = RunRequest(
        job_path=job,
        out=out or _default_out(named),
        strategy=strategy,
        devices=devices,
        steps=steps,
        checkpoint_every=checkpoint_every,
        checkpoint_minutes=checkpoint_minutes or None,
        resume=resume,
        overwrite=overwrite,
        script=script,
        script_args=tuple(script_arg or ()),
        max_restarts=max_restarts,
        tp=tp,
        sequence_parallel=sp,
        ep=ep,
        pp=pp,
        vpp=vpp,
    )
    err = Console(stderr=True, markup=False)  # paths and notes are data, not markup

    def announce(option: Option, config: RunConfig, spec: LaunchSpec) -> None:
        what = option.strategy.value if config.job.get("kind") != "tabular" else f"{config.job.get('library')}"
        err.print(
            f"trainplan run: {what} × {option.devices} on {option.accelerator.value} ({option.reason}); "
            f"run directory {config.out_dir}",
            highlight=False,
            soft_wrap=True,
        )

    show = not json_out or sys.stderr.isatty()
    tokenizing = TokenizeView() if show else None
    try:
        summary = execute(request, progress=ProgressView if show else None, on_planned=announce,
                          tokenize_progress=tokenizing)
    finally:
        if tokenizing is not None:
            tokenizing.close()
    if json_out:
        print(json.dumps(summary.to_json(), sort_keys=True), flush=True)
    else:
        Console().print(_table(summary))
        for note in (*summary.notes, *([summary.prediction_note] if summary.prediction_note else [])):
            err.print(f"note: {note}", highlight=False)
        if summary.predicted_from_calibration:
            err.print("note: predicted from an earlier run measured on this machine (calibration store)", highlight=False)
    if summary.message:
        err.print(summary.message, highlight=False, soft_wrap=True)
    if summary.exit_code:
        raise typer.Exit(summary.exit_code)
