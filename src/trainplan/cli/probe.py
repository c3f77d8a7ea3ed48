"""`trainplan probe`: describe and measure this machine, save its hardware profile for `plan`."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from trainplan.cli.common import dump_json
from trainplan.measure.profile import HardwareProfile, run_probe, save_profile


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    return f"{value:,.3g} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def machine_table(profile: HardwareProfile) -> Table:
    m = profile.machine
    t = Table(title=f"this machine ({profile.host})", show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("hardware id", profile.hardware_id)
    t.add_row("CPU", f"{m['cpu_model']}, {m['cpu_cores']} usable cores ({m['logical_cpus']} logical)")
    t.add_row("memory", f"{m['memory_gib']:.1f} GiB")
    nvml: dict[str, Any] = m.get("nvml") or {}
    for g in (nvml.get("gpus") or []):
        pcie = f", PCIe gen{g['pcie_gen']} x{g['pcie_width']}" if g.get("pcie_gen") else ""
        links = f", {g['nvlinks']} NVLinks" if g.get("nvlinks") else ""
        t.add_row(f"GPU {g['index']}", f"{g['name']}, {g['memory_gib']:.1f} GiB{pcie}{links}")
    if nvml.get("driver_version"):
        t.add_row("driver", f"{nvml['driver_version']} (CUDA {nvml.get('cuda_driver_version') or '?'})")
    for link in nvml.get("links") or []:
        n = f" ×{link['nvlinks']}" if link.get("nvlinks") else ""
        t.add_row(f"GPU {link['a']}↔{link['b']}", f"{link['kind']}{n}")
    tv = m.get("torch") or {}
    if tv.get("installed"):
        seen = f"CUDA {tv.get('cuda_version')}, {tv['cuda_devices']} device(s)" if tv.get("cuda_available") else "MPS" if tv.get("mps_available") else "CPU only"
        t.add_row("torch", f"{tv.get('version')}: {seen}")
    else:
        t.add_row("torch", "not installed")
    if m.get("gpu_note"):
        t.add_row("GPUs", m["gpu_note"])
    return t


def measurement_table(profile: HardwareProfile) -> Table:
    t = Table(title=f"measured in {profile.seconds:.0f} s")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("device")
    t.add_column("how / why not")
    for ms in profile.measurements:
        t.add_row(ms.name, _fmt(ms.value, ms.unit), ms.device, ms.note or ms.method)
    return t


def probe_command(
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.", metavar="")] = False,
    save: Annotated[bool, typer.Option("--save/--no-save", help="Save the profile for `trainplan plan`.", metavar="")] = True,
    tabular: Annotated[bool, typer.Option("--tabular/--no-tabular", help="Measure the tabular libraries' per-core rates.", metavar="")] = True,
    quick: Annotated[bool, typer.Option("--quick", help="Shorter measurements (noisier figures).", metavar="")] = False,
) -> None:
    """Describe this machine (CPU, memory, GPUs, NVLink/PCIe, torch) and measure it in about a minute."""
    err = Console(stderr=True)
    with Progress(TextColumn("[bold]probe"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=err, transient=True) as bar:  # fmt: skip
        task = bar.add_task("describing the machine", total=None)

        def progress(label: str, done: int, total: int) -> None:
            bar.update(task, description=label, completed=done, total=total)

        profile = run_probe(progress=progress, tabular=tabular, quick=quick)
    path = save_profile(profile) if save else None
    if json_out:
        typer.echo(dump_json(dict(profile.to_json(), saved_to=str(path) if path else None)))
        return
    out = Console(width=None if Console().is_terminal else 160)
    out.print(machine_table(profile))
    out.print(measurement_table(profile))
    if path:
        out.print(f"saved hardware profile to {escape(str(path))}; `trainplan plan` now offers this machine as local:this-machine")
