"""`trainplan catalog [accelerators|instances]`: what the planner chooses from."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from trainplan.catalog import get_catalog
from trainplan.cli.common import dump_json


class What(str, Enum):
    ALL = "all"
    ACCELERATORS = "accelerators"
    INSTANCES = "instances"


def catalog_command(
    what: Annotated[What, typer.Argument(help="accelerators, instances, or all.")] = What.ALL,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.", metavar="")] = False,
) -> None:
    """List the catalog, built-in and your own rows, with each row's source, date and origin."""
    from dataclasses import asdict

    from trainplan.cli.tables import catalog_tables

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
