"""`trainplan catalog [accelerators|instances]`: what the planner chooses from."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from trainplan.catalog import get_catalog
from trainplan.cli.common import dump_json
from trainplan.errors import SpecError


class What(str, Enum):
    ALL = "all"
    ACCELERATORS = "accelerators"
    INSTANCES = "instances"
    IMPORT_SKYPILOT = "import-skypilot"


def catalog_command(
    what: Annotated[What, typer.Argument(help="accelerators, instances, all — or import-skypilot [DIR]: add SkyPilot's "
                                              "priced instances (every cloud it prices) to your catalog.")] = What.ALL,
    source: Annotated[Optional[Path], typer.Argument(help="import-skypilot: SkyPilot's catalog directory "
                                                          "(default: the newest ~/.sky/catalogs/vN) or one vms.csv.",
                                                     show_default=False)] = None,  # fmt: skip
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.", metavar="")] = False,
) -> None:
    """List the catalog, built-in and your own rows, with each row's source, date and origin."""
    from dataclasses import asdict

    from trainplan.cli.tables import catalog_tables

    if what is What.IMPORT_SKYPILOT:
        _import_skypilot(source, json_out)
        return
    if source is not None:
        raise SpecError(f"{what.value} takes no directory (only import-skypilot does)", field="catalog")
    cat = get_catalog()
    if json_out:
        out: dict[str, object] = {}
        if what in (What.ALL, What.ACCELERATORS):
            out["accelerators"] = [dict(asdict(a), origin=cat.origin("accelerator", a.id)) for a in cat.accelerators.values()]
        if what in (What.ALL, What.INSTANCES):
            out["instances"] = [dict(asdict(i), origin=cat.origin("instance", f"{i.cloud}:{i.name}")) for i in cat.instances]
        out["issues"] = [str(i) for i in cat.issues]
        typer.echo(dump_json(out))
        return
    console = Console(width=None if Console().is_terminal else 160)
    for t in catalog_tables(cat, what.value):
        console.print(t)
    for issue in cat.issues:
        console.print(f"[yellow]catalog row left out:[/] {escape(str(issue))}")


def _import_skypilot(source: Path | None, json_out: bool) -> None:
    from trainplan.catalog import user_catalog_dir
    from trainplan.catalog.skypilot import default_source, import_skypilot
    from trainplan.files import trainplan_home

    src = source if source is not None else default_source()
    target = user_catalog_dir() or trainplan_home() / "catalog"
    result = import_skypilot(src, target, get_catalog())
    merged = get_catalog()  # the written files, read back with every check a user's catalog gets
    summary = {"source": str(src), "files": [str(f) for f in result.files], "target": str(target),
               "instances_added": result.instances, "instances_kept": result.kept, "clouds_added": result.clouds,
               "skipped": result.skipped, "instances_in_catalog": len(merged.instances)}  # fmt: skip
    if json_out:
        typer.echo(dump_json(summary))
        return
    typer.echo(f"read {len(result.files)} SkyPilot file(s) under {src}")
    typer.echo(f"added {result.instances} instances to {target / 'instances.csv'}"
               + (f"; kept your own row for {result.kept}" if result.kept else ""))  # fmt: skip
    if result.clouds:
        typer.echo(f"added clouds {', '.join(result.clouds)} to {target / 'clouds.csv'} with ASSUMED billing terms "
                   "(per-second, no minimum): edit them for your provider")  # fmt: skip
    for reason, n in sorted(result.skipped.items(), key=lambda kv: -kv[1]):
        typer.echo(f"skipped {n} rows: {reason}")
    typer.echo(f"the catalog now has {len(merged.instances)} instances")
