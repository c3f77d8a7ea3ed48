"""`trainplan report JOB.yaml|RUN_DIR [-o report.html]`: one self-contained HTML file with plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from trainplan.report.html import write_report


def report_command(
    source: Annotated[Path, typer.Argument(metavar="JOB.yaml|RUN_DIR", help="A job file, or a run directory of `trainplan run`.")],
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="HTML file to write (default: report.html).")] = None,
) -> None:
    """Write an HTML report (job, ranked options, memory and time/cost plots, run curves) that opens offline."""
    target = out or Path("report.html")
    if target.exists() and target.is_dir():
        from trainplan.errors import TrainplanError

        raise TrainplanError(f"{target} is a directory; give a file name", field="--out")
    path = write_report(source, target)
    typer.echo(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, opens offline)")
