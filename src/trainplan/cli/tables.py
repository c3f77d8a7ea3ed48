"""Render plans and estimates as rich tables (terminal) — no computation here."""

from __future__ import annotations

import textwrap
from typing import Sequence

from rich.console import Console, Group
from rich.markup import escape
from rich import box
from rich.table import Table
from rich.text import Text

from trainplan.catalog import Catalog
from trainplan.estimate.memory import GIB
from trainplan.estimate.result import Estimate
from trainplan.planner.core import Plan


def _hours(h: float) -> str:
    if h == float("inf"):
        return "∞"
    return f"{h * 60:.0f} min" if h < 1 else f"{h:,.1f} h"


def _money(x: float) -> str:
    return "∞" if x == float("inf") else f"${x:,.2f}" if x < 100 else f"${x:,.0f}"


def _kwh(e: Estimate) -> str:
    k = e.energy.kwh if e.energy else None
    return "?" if k is None else f"{k:,.1f}" if k < 1000 else f"{k:,.0f}"


def _co2(e: Estimate) -> str:
    c = e.energy.co2_kg if e.energy else None
    return "?" if c is None else f"{c:,.2f}" if c < 10 else f"{c:,.0f}"


def _step(s: float) -> str:
    return "∞" if s == float("inf") else f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def _devices(e: Estimate) -> str:
    hw = e.hardware
    if hw.accelerator is None:
        return f"{hw.vcpus_per_node} vCPU"
    n = hw.layout.world_size
    return f"{n}×{hw.accelerator.id}"


def _same_result(a: Estimate, b: Estimate) -> bool:
    """The same hardware at the same displayed time and cost (only the strategy differs)."""
    return (a.hardware.label == b.hardware.label and _hours(a.hours) == _hours(b.hours)
            and _money(a.cost_usd) == _money(b.cost_usd))  # fmt: skip


def shown_options(plan: Plan, top: int, *, all_strategies: bool) -> list[tuple[int, Estimate, int]]:
    """(rank, estimate, other strategies folded into it) of the rows to show: unless ``all_strategies``, an option
    with the same hardware, time and cost as a better-ranked row is folded into that row."""
    rows: list[tuple[int, Estimate, int]] = []
    for i, e in enumerate(plan.options):
        if not all_strategies and rows and any(_same_result(r[1], e) for r in rows):
            j = next(k for k, r in enumerate(rows) if _same_result(r[1], e))
            rows[j] = (rows[j][0], rows[j][1], rows[j][2] + 1)
            continue
        if len(rows) >= top:
            break
        rows.append((i, e, 0))
    return rows


def _marks(plan: Plan, i: int, e: Estimate, folded: int) -> str:
    marks = []
    if e is plan.cheapest:
        marks.append("cheapest")
    if e is plan.fastest:
        marks.append("fastest")
    if i in plan.pareto:
        marks.append("pareto")
    if e.calibrated:
        marks.append("measured")
    if e.borderline:
        marks.append("borderline")
    if e.hardware.accelerator is not None and e.hardware.accelerator.vendor == "amd":
        marks.append("ROCm")  # runs on a ROCm build of PyTorch, untested by trainplan (launch says what it needs)
    if folded:
        marks.append(f"+{folded} strateg{'y' if folded == 1 else 'ies'}")
    return " ".join(marks)


def plan_table(plan: Plan, *, top: int, title: str, wide: bool = True, all_strategies: bool = True,
               width: int = 80) -> Table:  # fmt: skip
    """Ranked options with memory split, time and cost, and the cheapest/fastest/Pareto/ROCm marks.

    Narrow (``wide=False``, what ``plan`` prints unless ``--wide``): rank, option, strategy, GiB per device, time,
    cost and marks — the option name, the cost and every mark whole, so it reads in ``width`` columns (80 for a
    pipe): the marks take a column when at least 15 columns are left beside the others, else a line of their own
    under the option.
    """
    t = Table(title=title, title_justify="left", header_style="bold", box=None if not wide else box.HEAVY_HEAD,
              pad_edge=wide, collapse_padding=not wide)  # fmt: skip
    rows = []
    for i, e, folded in shown_options(plan, top, all_strategies=all_strategies):
        m = e.memory
        split = "/".join(f"{x / GIB:.1f}" for x in (m.weights, m.gradients, m.optimizer, m.activations, m.overhead))
        rows.append({
            "#": str(i + 1), "option": e.hardware.label, "devices": _devices(e), "strategy": e.setup,
            "GiB/dev": f"{m.peak / GIB:.1f}/{e.capacity_gib:.0f}", "w/g/o/a/ovh GiB": split,
            "step": _step(e.step_time_s), "time": _hours(e.hours), "cost": _money(e.cost_usd), "kWh": _kwh(e),
            "kg CO2e": _co2(e), "": _marks(plan, i, e, folded),
        })  # fmt: skip
    columns = [("#", "right"), ("option", "left"), ("devices", "left"), ("strategy", "left"), ("GiB/dev", "right"),
               ("w/g/o/a/ovh GiB", "right"), ("step", "right"), ("time", "right"), ("cost", "right"),
               ("kWh", "right"), ("kg CO2e", "right"), ("", "left")]  # fmt: skip
    narrow = ("#", "option", "strategy", "GiB/dev", "time", "cost")
    marks_beside = wide
    if not wide:  # the widest cell of each column plus one space between columns
        used = sum(max(len(c), *(len(r[c]) for r in rows)) + 1 for c in narrow) if rows else 0
        room = width - used - 1
        marks_beside = room >= min(15, max((len(r[""]) for r in rows), default=0))
        if not marks_beside:  # the marks go under the option name, indented, wrapped to the name's width so that
            # they do not widen the column (the option column does not wrap: its name stays whole)
            name_width = max(len(r["option"]) for r in rows)
            for r in rows:
                if r[""]:
                    lines = textwrap.wrap(r[""], width=max(name_width - 2, 12), break_long_words=False)
                    r["option"] += "".join(f"\n  {line}" for line in lines)
    for col, just in columns:
        if not wide and col not in narrow and not (col == "" and marks_beside):
            continue
        whole = col in ("option", "cost", "time", "#", "strategy", "GiB/dev")
        t.add_column(col, justify=just, no_wrap=whole, overflow="fold",  # type: ignore[arg-type]
                     min_width=max((len(r["option"].split("\n")[0]) for r in rows), default=6) if col == "option" else None)
    for r in rows:
        t.add_row(*(r[str(c.header)] for c in t.columns))
    unknown = sorted({e.energy.note for e in plan.options[:top] if e.energy and e.energy.kwh is None and e.energy.note})
    if unknown and wide:  # say why a kWh reads "?" (a TPU without a published board power, say)
        t.caption = "kWh ?: " + "; ".join(unknown)
        t.caption_justify = "left"
    return t


def rejected_table(rejected: Sequence[Estimate], *, total: int) -> Table:
    t = Table(
        title=f"Rejected: {total} options (those on the best hardware first, then the closest to fitting)",
        title_justify="left",
        header_style="bold",
    )
    t.add_column("option")
    t.add_column("strategy")
    t.add_column("why", overflow="fold")
    for e in rejected:
        why = e.reason or ""
        if e.hint:
            why += f" → {e.hint}"
        t.add_row(escape(e.hardware.label), e.setup, escape(why))
    return t


def tradeoff_text(plan: Plan) -> Text:
    """One line per Pareto-front option: the time/cost trade-off."""
    seen: set[tuple[float, float]] = set()
    front = []
    for e in sorted((plan.options[i] for i in plan.pareto), key=lambda e: (e.hours, e.cost_usd)):
        key = (round(e.hours, 3), round(e.cost_usd, 2))
        if key not in seen:  # equal time and cost: show the first (best-ranked) only
            seen.add(key)
            front.append(e)
    lines = Text("Time/cost front: ", style="bold")
    lines.append("  →  ".join(f"{_hours(e.hours)} for {_money(e.cost_usd)} ({e.hardware.label} {e.setup})" for e in front))
    for w in plan.warnings:
        lines.append(f"\nWarning: {w}", style="yellow")
    return lines


def unowned_text(plan: Plan, *, top: int = 3) -> Text:
    """Owned hardware the job does not say the user has: it would fit, at the amortised cost of owning it."""
    lines = Text(f"Not ranked: {len(plan.unowned)} options on owned hardware the job does not list in constraints.owned "
                 "(hardware to buy; add it there if you have it):", style="bold")  # fmt: skip
    for e in plan.unowned[:top]:
        lines.append(f"\n  {e.hardware.label} {e.setup}  {_hours(e.hours)}  {_money(e.cost_usd)} amortised")
    return lines


def estimate_panel(e: Estimate) -> Group:
    """One option in detail."""
    m = e.memory
    t = Table(show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    verdict = "[green]fits[/]" if e.fits else f"[red]does not fit[/]: {escape(e.reason or '')}"
    t.add_row("verdict", verdict)
    if e.memory_band is not None:
        t.add_row("memory margin", ("[yellow]" if e.borderline else "") + e.memory_verdict() + ("[/]" if e.borderline else ""))
    if e.hint:
        t.add_row("to fit", e.hint)
    t.add_row("hardware", f"{e.hardware.label} ({_devices(e)}), {e.hardware.price_note}")
    t.add_row("strategy", e.setup)
    if e.params is not None:
        t.add_row("parameters", f"{e.params:,} ({e.trainable_params:,} trainable)")
    unit = "GPU" if e.hardware.accelerator else "machine"
    t.add_row(f"memory per {unit}", f"{m.peak / GIB:.2f} GiB of {e.capacity_gib:.1f} GiB (peak at {m.phase})")
    if e.hardware.accelerator is None and e.kind != "tabular" and m.context:  # CPUs (estimate/cpu.py)
        heap = f" + {m.fragmentation / GIB:.3f} GiB kept by glibc's heap" if m.fragmentation else ""
        t.add_row("  tensors + runtime", f"{m.allocated / GIB:.2f} GiB of tensors{heap} + {m.context / GIB:.2f} GiB CPU "
                  "runtime (kernel libraries, imported modules)")  # fmt: skip
    elif m.context or m.fragmentation:
        t.add_row("  allocated / reserved", f"{m.allocated / GIB:.2f} / {m.reserved / GIB:.2f} GiB "
                  f"({m.reserved_expandable / GIB:.2f} with expandable_segments) + context {m.context / GIB:.2f} GiB")
    for name, val in (
        ("  weights", m.weights), ("  gradients", m.gradients), ("  optimizer", m.optimizer),
        ("  activations", m.activations), ("  overhead", m.overhead),
    ):  # fmt: skip
        t.add_row(name, f"{val / GIB:.2f} GiB")
    if m.host:
        t.add_row("host RAM (offload)", f"{m.host / GIB:.1f} GiB per node")
    if e.trace:
        tr = e.trace
        t.add_row("traced step", f"{tr['flops_forward']:.3e} forward + {tr['flops_backward']:.3e} backward + "
                  f"{tr['flops_recompute']:.3e} recompute FLOPs per micro-batch")  # fmt: skip
        cats = ", ".join(f"{k} {v:.2f}" for k, v in tr["at_peak_gib"].items())
        t.add_row("traced peak", f"{tr['single_device_peak_gib']:.2f} GiB on one device, during {tr['peak_phase']} ({cats} GiB)")
    if e.flops_per_step:
        t.add_row("FLOPs per step", f"{e.flops_per_step:.3e} per device")
    t.add_row("step time", _step(e.step_time_s) + "  " + ", ".join(f"{k} {v:.3g}" for k, v in e.time_breakdown.items()))
    t.add_row("steps", f"{e.steps:,}")
    unit_tp = {"tokens_per_s": "tokens/s", "samples_per_s": "samples/s"}.get(e.throughput_unit, e.throughput_unit)
    if e.kind == "tabular":
        unit_tp = "rows/s"
    t.add_row("throughput", f"{e.throughput:,.0f} {unit_tp}")
    if e.mfu is not None:
        t.add_row("MFU", f"{e.mfu:.1%}")
    if e.fits:
        t.add_row("training time", _hours(e.train_s / 3600) + f" (+ {e.startup_s:.0f} s start-up)")
        t.add_row("cost", _money(e.cost_usd))
    else:  # an option that cannot run has no training time: say what it would be, marked as such
        t.add_row("training time", f"– (does not fit; {_hours(e.train_s / 3600)} if it did)")
        t.add_row("cost", f"– (does not fit; {_money(e.cost_usd)} if it did)")
    if e.energy is not None:
        en = e.energy
        if en.host_w is None or en.pue is None:  # no data-centre figures: unknown, and why
            how = en.note or "host power and PUE unknown"
        elif e.hardware.accelerator is not None and en.device_w is None:  # not a silent 0 W
            how = f"{e.hardware.accelerator.id} board power unknown + host {en.host_w:.0f} W per node, PUE {en.pue:g}"
        elif e.hardware.accelerator is not None:
            how = (f"{en.device_w:.0f} W per device at {en.utilisation:.0%} utilisation + host {en.host_w:.0f} W per "
                   f"node, PUE {en.pue:g}")  # fmt: skip
        else:
            how = f"host {en.host_w:.0f} W per node, PUE {en.pue:g}"
        t.add_row("energy", f"{_kwh(e)} kWh ({how})")
        grid = f"{en.grid_kg_co2e_per_kwh:g} kg/kWh" if en.grid_kg_co2e_per_kwh is not None else "grid unknown"
        said = en.note if en.note and how != en.note else None
        t.add_row("emissions", f"{_co2(e)} kg CO2e ({en.region}, {grid})" + (f" - {said}" if said else ""))
    for note in e.notes:
        t.add_row("note", escape(note))
    return Group(t)


def catalog_tables(catalog: Catalog, what: str) -> list[Table]:
    out = []
    if what in ("all", "accelerators"):
        t = Table(title="Accelerators", title_justify="left", header_style="bold")
        for c in ("id", "memory GiB", "bf16 TFLOPs", "fp16 TFLOPs", "fp32 TFLOPs", "HBM GB/s", "as of", "from"):
            t.add_column(c)
        for a in catalog.accelerators.values():
            f = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
            t.add_row(a.id, f"{a.memory_gib:g}", f(a.peak_bf16_tflops), f(a.peak_fp16_tflops), f(a.peak_fp32_tflops),
                      f"{a.mem_bandwidth_gb_s:g}", a.as_of, catalog.origin("accelerator", a.id))  # fmt: skip
        out.append(t)
    if what in ("all", "instances"):
        t = Table(title="Instances", title_justify="left", header_style="bold")
        for c in ("cloud", "instance", "region", "vCPU", "RAM GiB", "accelerators", "link", "$/h", "spot $/h", "from"):
            t.add_column(c)
        for i in catalog.instances:
            acc = f"{i.accelerator_count}×{i.accelerator}" if i.accelerator else "-"
            link = f"{i.interconnect} {i.intra_node_bw_gb_s:g} GB/s" if i.intra_node_bw_gb_s else i.interconnect
            spot = "-" if i.spot_price_usd_per_h is None else f"{i.spot_price_usd_per_h:.3f}"
            t.add_row(i.cloud, i.name, i.region, str(i.vcpus), f"{i.ram_gib:g}", acc, link, f"{i.price_usd_per_h:.3f}", spot,
                      catalog.origin("instance", f"{i.cloud}:{i.name}"))  # fmt: skip
        out.append(t)
    return out


def print_all(console: Console, *renderables: object) -> None:
    for r in renderables:
        console.print(r)
