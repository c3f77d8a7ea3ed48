"""``trainplan report``: one self-contained HTML file — the job, the ranked options, memory and time/cost plots,
and for a run directory its curves with the prediction overlaid.

Self-contained means it opens offline: plotly.js is inlined once in ``<head>`` and no element loads anything
from the network (no ``<script src=http…>``, no stylesheet links).  The numbers come from the public API only:
:func:`trainplan.plan_job` and :meth:`Estimate.to_dict`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from trainplan import __version__
from trainplan.catalog import get_catalog
from trainplan.errors import TrainplanError
from trainplan.estimate.result import Estimate, RejectKind
from trainplan.files import write_text_atomic
from trainplan.planner.calibrated import efficiency_lookup
from trainplan.planner.core import Plan, plan_job
from trainplan.planner.this_machine import is_this_machine, measured_rate_lookup
from trainplan.report import figures as F
from trainplan.report.rundata import RunData, is_run_dir, read_run
from trainplan.spec import Job, load_job, parse_job

MEMORY_OPTIONS = 12  # ranked options drawn in the memory chart
MEMORY_REJECTED = 6  # … and the memory-rejected options closest to fitting
TABLE_ROWS = 25
CONSTRAINT_KINDS = (RejectKind.DEADLINE, RejectKind.BUDGET)


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def fmt_hours(hours: float) -> str:
    if not math.isfinite(hours):
        return "–"
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h" if hours < 100 else f"{hours:,.0f} h"


def fmt_usd(usd: float) -> str:
    return "–" if not math.isfinite(usd) else f"${usd:,.2f}" if usd < 1000 else f"${usd:,.0f}"


def devices_text(e: Estimate) -> str:
    d = e.to_dict()
    if d["accelerator"]:
        return f"{d['count'] * d['nodes']}×{d['accelerator']}"
    return f"{d['vcpus']} vCPU"


def plan_for(job: Job) -> Plan:
    """The plan the report shows: the CLI's, with this machine's measured rates where a profile exists."""
    return plan_job(job, get_catalog(), efficiency_for=measured_rate_lookup(job, fallback=efficiency_lookup(job)))


def flags(plan: Plan, i: int, e: Estimate) -> list[str]:
    out = []
    if plan.cheapest is e:
        out.append("cheapest")
    if plan.fastest is e:
        out.append("fastest")
    if i in plan.pareto:
        out.append("pareto")
    if is_this_machine(e.hardware):
        out.append("this machine (measured)")
    return out


@dataclass(frozen=True)
class ReportInput:
    """What one report is made of."""

    title: str
    job: Job | None
    job_text: str
    plan: Plan | None
    plan_error: str | None = None
    run: RunData | None = None
    source: str = ""


def figure_options(plan: Plan) -> tuple[list[F.Option], list[F.Option], F.Option | None]:
    """(memory chart rows, scatter points, the chosen option) from a plan."""
    ranked = [F.Option(e.hardware.label + f" · {e.setup}", e.to_dict(), "option", i + 1, i in plan.pareto)
              for i, e in enumerate(plan.options)]  # fmt: skip
    memory_rejected = [e for e in plan.rejected if e.rejection and e.rejection.kind is RejectKind.DEVICE_MEMORY]
    mem = ranked[:MEMORY_OPTIONS] + [F.Option(e.hardware.label + f" · {e.setup}", e.to_dict(), "rejected")
                                     for e in memory_rejected[:MEMORY_REJECTED]]  # fmt: skip
    over = [F.Option(e.hardware.label, e.to_dict(), "over-constraint") for e in plan.rejected
            if e.rejection and e.rejection.kind in CONSTRAINT_KINDS]  # fmt: skip
    return mem, ranked + over, (ranked[0] if ranked else None)


def _options_table(plan: Plan) -> str:
    rows = []
    for i, e in enumerate(plan.options[:TABLE_ROWS]):
        d = e.to_dict()
        m = d["memory"]
        rows.append(
            "<tr>" + "".join(f"<td>{c}</td>" for c in (
                i + 1, esc(e.hardware.label), esc(devices_text(e)), esc(e.setup),
                f"{m['peak_gib']:.1f} / {m['capacity_gib']:.0f}", esc(fmt_hours(e.hours)), esc(fmt_usd(e.cost_usd)),
                esc(", ".join(flags(plan, i, e))),
            )) + "</tr>"
        )  # fmt: skip
    more = f"<p class=note>{len(plan.options) - TABLE_ROWS} more options not listed.</p>" if len(plan.options) > TABLE_ROWS else ""
    head = "".join(f"<th>{h}</th>" for h in ("#", "option", "devices", "strategy", "GiB/dev (peak / capacity)", "time", "cost", ""))
    return f"<table id=options><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{more}"


def _rejected_table(plan: Plan, limit: int = 10) -> str:
    if not plan.rejected:
        return ""
    rows = "".join(
        f"<tr><td>{esc(e.hardware.label)}</td><td>{esc(e.setup)}</td><td>{esc(e.reason or '')}"
        + (f" → {esc(e.hint)}" if e.hint else "") + "</td></tr>"
        for e in plan.rejected[:limit]
    )  # fmt: skip
    return (f"<h3>Rejected: {len(plan.rejected)} options (the {min(limit, len(plan.rejected))} nearest shown)</h3>"
            f"<table id=rejected><thead><tr><th>option</th><th>strategy</th><th>why</th></tr></thead><tbody>{rows}</tbody></table>")  # fmt: skip


def _run_section(run: RunData) -> list[str]:
    parts = [f"<h2>Run: {esc(run.root.name)}</h2>"]
    measured, predicted = run.measured, run.predicted
    if run.summary:
        keys = [k for k in measured if k in predicted or measured.get(k) is not None]
        error = run.summary.get("error") or {}
        rows = "".join(
            f"<tr><td>{esc(k)}</td><td>{_num(measured.get(k))}</td><td>{_num(predicted.get(k))}</td>"
            f"<td>{_pct(error.get(k))}</td></tr>" for k in keys
        )  # fmt: skip
        status = esc(run.summary.get("status", "?"))
        note = run.summary.get("prediction_note")
        parts.append(f"<p>status <b>{status}</b>, {esc(run.summary.get('strategy', ''))} × {esc(run.summary.get('devices', ''))} "
                     f"on {esc(run.summary.get('hardware_id', ''))}" + (f"; prediction: {esc(note)}" if note else "") + "</p>")  # fmt: skip
        parts.append(f"<table id=measured><thead><tr><th>figure</th><th>measured</th><th>predicted</th><th>error</th></tr></thead>"
                     f"<tbody>{rows}</tbody></table>")  # fmt: skip
    else:
        parts.append("<p class=note>no summary.json yet: the run has not finished; curves show what it logged so far.</p>")
    steps = list(run.steps)
    if not steps:
        parts.append("<p class=note>metrics.jsonl has no step lines.</p>")
    figs: list[tuple[str, Any]] = []
    if any(r.get("loss") is not None for r in steps):
        figs.append(("run-loss", F.curve_figure(steps, "loss", "Loss per step", "loss")))
    tkey = run.throughput_key
    if tkey:
        figs.append(("run-throughput", F.curve_figure(steps, tkey, f"Throughput ({tkey})", tkey.replace("_per_s", "/s"),
                                                     predicted=run.predicted_throughput())))  # fmt: skip
    if any(r.get("step_time_s") is not None for r in steps):
        figs.append(("run-steptime", F.curve_figure(steps, "step_time_s", "Step time", "s", predicted=predicted.get("step_time_s"))))
    mem_keys = run.memory_keys()
    if mem_keys:
        figs.append(("run-memory", F.curve_figure(steps, mem_keys[0], "Memory per step", "GiB", predicted=predicted.get("peak_gib"),
                                                 extra_keys=mem_keys[1:])))  # fmt: skip
    elif measured.get("peak_gib") is not None or predicted.get("peak_gib") is not None:
        figs.append(("run-memory", F.peak_figure(measured.get("peak_gib"), predicted.get("peak_gib"))))
    parts += [f"<div class=plot>{F.figure_html(fig, div_id)}</div>" for div_id, fig in figs]
    return parts


def _num(v: Any) -> str:
    return "–" if v is None else esc(f"{v:,.4g}") if isinstance(v, (int, float)) else esc(v)


def _pct(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) else esc(f"{v:+.0%}")


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem auto;max-width:1200px;color:#222;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd}h3{font-size:1rem}
table{border-collapse:collapse;font-size:.85rem;width:100%}th,td{border-bottom:1px solid #eee;padding:.25rem .5rem;text-align:left}
th{background:#f6f6f6}pre{background:#f6f6f6;padding:.75rem;overflow:auto;font-size:.8rem}.note{color:#666;font-size:.85rem}
.warn{background:#fff4d6;padding:.5rem}.plot{margin:1rem 0}
"""


def render_report(inp: ReportInput, *, now: Callable[[], datetime] | None = None) -> str:
    """The report page for ``inp`` as one HTML string."""
    F.plotly()  # fail early, in one line, without plotly
    stamp = (now or (lambda: datetime.now(timezone.utc)))().strftime("%Y-%m-%d %H:%M UTC")
    body = [f"<h1>{esc(inp.title)}</h1>",
            f"<p class=note>trainplan {esc(__version__)} · {esc(stamp)} · from {esc(inp.source)}</p>",
            "<h2>Job</h2>", f"<pre id=job>{esc(inp.job_text)}</pre>"]  # fmt: skip
    plan = inp.plan
    if inp.plan_error:
        body.append(f"<p class=warn>no plan: {esc(inp.plan_error)}</p>")
    if plan is not None:
        for w in plan.warnings:
            body.append(f"<p class=warn>{esc(w)}</p>")
        body.append(f"<h2>Options: {len(plan.options)} fit, ranked by {esc(plan.objective.value)}</h2>")
        body.append(_options_table(plan) if plan.options else "<p class=warn>no option fits this job's constraints.</p>")
        body.append(_rejected_table(plan))
        mem, points, chosen = figure_options(plan)
        if mem:
            body.append("<h2>Memory per device</h2>")
            body.append(f"<div class=plot>{F.figure_html(F.memory_figure(mem), 'memory')}</div>")
        if points:
            c = inp.job.constraints if inp.job is not None else None
            fig = F.tradeoff_figure(points, deadline_hours=c.deadline_hours if c else None,
                                    budget_usd=c.budget_usd if c else None, chosen=chosen)  # fmt: skip
            body.append("<h2>Time and cost</h2>")
            body.append(f"<div class=plot>{F.figure_html(fig, 'tradeoff')}</div>")
    if inp.run is not None:
        body += _run_section(inp.run)
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"{GENERATOR_META}<title>{esc(inp.title)}</title><style>{CSS}</style>"
        f"<script>{F.plotly_js()}</script></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def report_input(path: Path) -> ReportInput:
    """Read a job file or a run directory into what the report shows."""
    p = Path(path)
    run = None
    if p.is_dir():
        if not is_run_dir(p):
            raise TrainplanError(f"{p} is neither a job file nor a trainplan run directory (no run.json)", field="JOB|RUN_DIR")
        run = read_run(p)
        job_file = p / "job.yaml"
        job_text = job_file.read_text(encoding="utf-8") if job_file.exists() else yaml.safe_dump(run.job, sort_keys=False)
        job = parse_job(run.job, source=str(p / "run.json"))
        title = f"trainplan report: run {p.name} ({job.name})"
    else:
        job = load_job(p)
        job_text = p.read_text(encoding="utf-8")
        title = f"trainplan report: {job.name}"
    plan, error = None, None
    try:
        plan = plan_for(job)
    except TrainplanError as exc:  # e.g. a torch job whose model cannot be traced here: the run part still shows
        if run is None:
            raise
        error = str(exc)
    return ReportInput(title=title, job=job, job_text=job_text, plan=plan, plan_error=error, run=run, source=str(p))


GENERATOR_META = "<meta name=generator content=trainplan-report>"


def written_by_trainplan(path: Path) -> bool:
    """Whether ``path`` is a report this module wrote (its generator tag in the first 4 KiB)."""
    try:
        with open(path, "rb") as fh:
            return GENERATOR_META.encode() in fh.read(4096)
    except OSError:
        return False


def write_report(path: Path, out: Path) -> Path:
    """Write the report for ``path`` (job file or run directory) to ``out``; returns ``out``."""
    text = render_report(report_input(path))
    write_text_atomic(Path(out), text)
    return Path(out)


__all__: Sequence[str] = ("ReportInput", "render_report", "report_input", "write_report")
