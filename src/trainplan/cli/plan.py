"""`trainplan plan JOB`: every catalog option, ranked and explained."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from trainplan.catalog import get_catalog
from trainplan.cli.common import dump_json, grid_regions, read_job
from trainplan.planner.calibrated import efficiency_lookup
from trainplan.catalog import Catalog
from trainplan.estimate.result import Estimate
from trainplan.planner.core import Objective, Plan, plan_job, require_options
from trainplan.planner.fit import Profiles, micro_batch_fit
from trainplan.planner.this_machine import measured_rate_lookup
from trainplan.spec import Job, TabularJob
from trainplan.cli.tables import plan_table, rejected_table, tradeoff_text, unowned_text


def _fit(job: Job, e: Estimate, catalog: Catalog, plan: Plan, profiles: Profiles) -> dict[str, object]:
    """The largest micro-batch column of ``plan --json`` (neural jobs)."""
    if isinstance(job, TabularJob):
        return {}
    return {"micro_batch_fit": micro_batch_fit(job, e, catalog, profile=plan.profile, profiles=profiles).to_dict()}


def plan_command(
    job_file: Annotated[Optional[Path], typer.Argument(help="Job file (YAML). Default: the built-in LLaMA-7B fine-tune.")] = None,
    objective: Annotated[Objective, typer.Option(help="Rank by cost, time or co2 (emissions).")] = Objective.COST,
    top: Annotated[int, typer.Option(min=1, help="Rows of options and of rejections to show.")] = 10,
    trace: Annotated[bool, typer.Option("--trace", help="Transformer jobs: trace the real model on the fake device instead of the formulas.", metavar="")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.", metavar="")] = False,
    region: Annotated[Optional[list[str]], typer.Option(help="Grid region for the CO2 of a cloud's options, CLOUD:REGION (e.g. gcp:europe-west4); repeatable.")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Every column (devices, memory split, step, kWh, CO2); the default fits 80 columns.", metavar="")] = False,
    all_strategies: Annotated[bool, typer.Option("--all-strategies", help="Show each strategy of the same hardware at the same time and cost on its own row.", metavar="")] = False,
) -> None:
    """Estimate every (hardware, strategy) option in the catalog, rank them, explain the rejected."""
    job = read_job(job_file)
    catalog = get_catalog()
    regions = grid_regions(region or [], catalog)
    plan = require_options(plan_job(job, catalog, objective=objective, efficiency_for=measured_rate_lookup(job, fallback=efficiency_lookup(job)), trace=trace,
                                    regions=regions), job)  # fmt: skip
    if json_out:
        profiles: Profiles = {}
        typer.echo(dump_json({
            "job": job.name,
            "objective": plan.objective.value,
            "warnings": list(plan.warnings),
            "options": [dict(e.to_dict(), rank=i + 1, pareto=i in plan.pareto, borderline=e.borderline,
                             **_fit(job, e, catalog, plan, profiles)) for i, e in enumerate(plan.options)],
            "rejected": [e.to_dict() for e in plan.rejected],
            # owned hardware the job does not list in constraints.owned: fits, not ranked
            "unowned": [dict(e.to_dict(), borderline=e.borderline) for e in plan.unowned],
        }))  # fmt: skip
        return
    console = Console(width=None if Console().is_terminal else (160 if wide else 80))
    console.print(plan_table(plan, top=top, title=f"{job.name}: {len(plan.options)} options fit, ranked by {plan.objective.value}",
                             wide=wide, all_strategies=all_strategies, width=console.width))  # fmt: skip
    console.print(tradeoff_text(plan))
    if plan.unowned:
        console.print(unowned_text(plan, top=3))
    console.print(rejected_table(plan.rejected[:top], total=len(plan.rejected)))
