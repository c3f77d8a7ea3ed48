"""The `trainplan` command: one module per sub-command, errors as one line + exit code 2."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.exceptions import TyperException

from trainplan.cli.catalog import catalog_command
from trainplan.cli.estimate import estimate_command
from trainplan.cli.plan import plan_command
from trainplan.cli.probe import probe_command
from trainplan.cli.report import report_command
from trainplan.cli.serve import serve_command
from trainplan.catalog import CATALOG_ENV
from trainplan.errors import CatalogError, TrainplanError

app = typer.Typer(
    name="trainplan",
    help="Plan a training job: hardware, parallel strategy, memory, time and cost — then run it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _options(
    catalog: Annotated[Optional[Path], typer.Option("--catalog", metavar="DIR",
                       help="A directory of your own catalog rows (accelerators.csv, instances.csv, clouds.csv) that add to or "
                            "override the built-in ones; default $TRAINPLAN_HOME/catalog when it exists.")] = None,  # fmt: skip
) -> None:
    """Plan a training job: hardware, parallel strategy, memory, time and cost — then run it."""
    if catalog is not None:
        if not catalog.is_dir():
            raise CatalogError(f"catalog directory {catalog} does not exist (or is not a directory)", field="--catalog")
        os.environ[CATALOG_ENV] = str(catalog.resolve())


app.command("plan")(plan_command)
app.command("estimate")(estimate_command)
app.command("catalog")(catalog_command)
app.command("probe")(probe_command)
app.command("report")(report_command)
app.command("serve")(serve_command)

try:  # `trainplan run` lives in trainplan.run (heavier imports happen inside it)
    from trainplan.cli.run import run_command

    app.command("run")(run_command)
    from trainplan.cli.launch import launch_command

    app.command("launch")(launch_command)
except ImportError:  # pragma: no cover - only while the run package is absent
    pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: user errors print one line to stderr and exit 2, never a traceback."""
    before = os.environ.get(CATALOG_ENV)
    try:
        result = app(args=argv, standalone_mode=False)
    except TrainplanError as exc:
        typer.echo(f"error: {exc}", err=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo("aborted", err=True)
        return 130
    except OSError as exc:  # a full disk, a permission, a path that is not what it should be
        if os.environ.get("TRAINPLAN_DEBUG"):
            raise
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        typer.echo(f"error: {where}{exc.strerror or exc}", err=True)
        return 74  # EX_IOERR (sysexits.h)
    except (RecursionError, OverflowError, MemoryError) as exc:  # input too deep or too large for Python itself
        if os.environ.get("TRAINPLAN_DEBUG"):
            raise
        typer.echo(f"error: the input is too large or too deeply nested ({type(exc).__name__})", err=True)
        return 2
    except TyperException as exc:  # typer's (vendored click) usage errors: bad option, unknown command …
        if type(exc).__name__ == "NoArgsIsHelpError":
            ctx = getattr(exc, "ctx", None)
            typer.echo(ctx.get_help() if ctx is not None else "Usage: trainplan COMMAND [ARGS]...")
            return 0
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        typer.echo(f"error: {' '.join(str(message).split())}", err=True)
        return int(getattr(exc, "exit_code", 2) or 2)
    finally:  # --catalog holds for this invocation only (main() may be called again in one process)
        if before is None:
            os.environ.pop(CATALOG_ENV, None)
        else:
            os.environ[CATALOG_ENV] = before
    # a command may return its exit code (e.g. `run` passes on a crashed script's code)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
