"""`trainplan report JOB.yaml|RUN_DIR [-o report.html]`: one self-contained HTML file with plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def report_command(
    source: Annotated[Path, typer.Argument(metavar="JOB.yaml|RUN_DIR", help="A job file, or a run directory of `trainplan run`.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="HTML file to write (default: report.html).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace --out even if trainplan did not write it.", metavar="")] = False,
) -> None:
    """Write an HTML report (job, ranked options, memory and time/cost plots, run curves) that opens offline."""
    from trainplan.report.html import write_report, written_by_trainplan  # here: other commands start faster

    target = out or Path("report.html")
    if target.exists() and target.is_dir():
        from trainplan.errors import TrainplanError

        raise TrainplanError(f"{target} is a directory; give a file name", field="--out")
    if target.exists() and not overwrite and not written_by_trainplan(target):
        from trainplan.errors import TrainplanError

        raise TrainplanError(f"{target} exists and is not a report trainplan wrote; give another file or --overwrite",
                             field="--out")  # fmt: skip
    path = write_report(source, target)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, opens offline)")
