"""Energy (kWh) and emissions (kg CO2e) of one option: devices, host, data centre, grid.

One pure function per quantity, each with its source:

* accelerator power — idle + (board power − idle) × utilisation, the linear
  power model of the Cloud Carbon Footprint methodology ("Average Watts = Min
  Watts + Avg Utilization × (Max Watts − Min Watts)", applied there to GPUs
  with Teads' idle/100 % watts, Appendix III); board power is the catalog's
  ``tdp_w`` and the idle share ``device_idle_power_fraction`` (assumptions.yaml);
* utilisation of a training step — the share of the step the device computes
  (``compute_s / step_time_s`` of the estimate); communication and optimizer
  phases are counted at idle power, which errs low;
* host power — vCPUs × (min + utilisation × (max − min)) W plus RAM × W/GB
  (CCF Appendix I, per cloud in ``datacenters.csv``);
* facility energy — IT energy × PUE (The Green Grid, "PUE: a comprehensive
  examination of the metric", White Paper #49, 2012: PUE = facility energy /
  IT equipment energy); per cloud in ``datacenters.csv``;
* emissions — energy × the grid's location-based intensity
  (``grid_intensity.csv``; GHG Protocol Scope 2 Guidance, 2015, location-based
  method).

Start-up time is counted at idle power (the machine is billed and on).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from trainplan.catalog import Catalog
from trainplan.catalog.loader import DataCenter, GridIntensity
from trainplan.errors import CatalogError
from trainplan.estimate.hardware import Hardware

GB_PER_GIB = 2**30 / 1e9


@dataclass(frozen=True)
class Energy:
    """Energy and emissions of one option for the whole job (train + start-up)."""

    kwh: float | None  # facility energy (IT × PUE); None when a board power is unknown
    co2_kg: float | None  # None when the kWh or the region's grid intensity is unknown
    device_w: float | None  # average draw of one accelerator while training (0 for CPU-only options; None: no board power)
    host_w: float | None  # average draw of one node's host (CPUs, RAM) while training (None: no data-centre figures)
    utilisation: float  # modelled accelerator utilisation (compute share of the step)
    pue: float | None  # None: no data-centre figures for the cloud
    grid_kg_co2e_per_kwh: float | None
    region: str  # "cloud:region" whose grid was used
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kwh": self.kwh,
            "co2_kg": self.co2_kg,
            "device_w": self.device_w,
            "host_w": self.host_w,
            "utilisation": self.utilisation,
            "pue": self.pue,
            "grid_kg_co2e_per_kwh": self.grid_kg_co2e_per_kwh,
            "region": self.region,
            "note": self.note,
        }


def device_power_w(board_w: float, utilisation: float, idle_fraction: float) -> float:
    """Average draw of one accelerator at ``utilisation`` (0–1): idle + (board − idle) × u (CCF linear model)."""
    u = min(1.0, max(0.0, utilisation))
    idle = board_w * idle_fraction
    return idle + (board_w - idle) * u


def host_power_w(vcpus: int, ram_gib: float, dc: DataCenter, cpu_utilisation: float) -> float:
    """Average draw of one host: vCPUs × (min + u × (max − min)) + RAM GB × W/GB (CCF Appendix I)."""
    u = min(1.0, max(0.0, cpu_utilisation))
    per_vcpu = dc.host_min_w_per_vcpu + u * (dc.host_max_w_per_vcpu - dc.host_min_w_per_vcpu)
    return vcpus * per_vcpu + ram_gib * GB_PER_GIB * dc.ram_w_per_gb


def facility_kwh(it_watts: float, seconds: float, pue: float) -> float:
    """Facility energy of IT equipment drawing ``it_watts`` for ``seconds``: W × h / 1000 × PUE."""
    return it_watts * seconds / 3600.0 / 1000.0 * pue


def emissions_kg(kwh: float, grid_kg_per_kwh: float) -> float:
    """Location-based emissions: energy × grid intensity (GHG Protocol Scope 2, location-based)."""
    return kwh * grid_kg_per_kwh


def known_regions(catalog: Catalog, cloud: str | None = None) -> list[str]:
    return sorted(f"{c}:{r}" for c, r in catalog.grid if cloud in (None, c))


def parse_region(text: str, catalog: Catalog, *, field: str = "--region") -> tuple[str, str]:
    """``cloud:region`` (or a bare region name that only one cloud has) → (cloud, region); one clear error otherwise."""
    raw = text.strip()
    if ":" in raw:
        cloud, _, region = raw.partition(":")
        key = (cloud.strip().lower(), region.strip().lower())
        if key in catalog.grid:
            return key
        if key[0] not in {c for c, _ in catalog.grid}:
            clouds = ", ".join(sorted({c for c, _ in catalog.grid}))
            raise CatalogError(f"unknown cloud {cloud!r} in {raw!r}; clouds with grid figures: {clouds}", field=field)
        raise CatalogError(f"no grid carbon intensity for {raw!r}; known for {key[0]}: "
                           f"{', '.join(known_regions(catalog, key[0]))}", field=field)  # fmt: skip
    hits = [key for key in catalog.grid if key[1] == raw.lower()]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise CatalogError(f"{raw!r} is a region of several clouds; write CLOUD:REGION ({', '.join(f'{c}:{r}' for c, r in hits)})", field=field)
    raise CatalogError(f"unknown region {raw!r}; write CLOUD:REGION, one of {', '.join(known_regions(catalog))}", field=field)


def region_of(hw: Hardware, catalog: Catalog) -> str:
    """The region an option runs in: its instance's, else that of the catalog row its price came from."""
    if hw.instance is not None:
        return hw.instance.region
    acc = hw.accelerator.id if hw.accelerator else None
    rows = [i for i in catalog.instances if i.cloud == hw.cloud and i.accelerator == acc]
    rows = rows or [i for i in catalog.instances if i.cloud == hw.cloud]
    return rows[0].region if rows else ""


def option_energy(
    hw: Hardware,
    catalog: Catalog,
    *,
    train_s: float,
    startup_s: float,
    utilisation: float,
    regions: Mapping[str, str] | None = None,
) -> Energy:
    """kWh and kg CO2e of running ``hw`` for ``train_s`` at ``utilisation`` plus ``startup_s`` idle.

    ``regions`` maps a cloud to the region whose grid to use instead of the option's own (``--region``).
    """
    dc = catalog.datacenters.get(hw.cloud)
    region = (regions or {}).get(hw.cloud) or region_of(hw, catalog)
    label = f"{hw.cloud}:{region}"
    grid: GridIntensity | None = catalog.grid.get((hw.cloud, region))
    intensity = grid.kg_co2e_per_kwh if grid else None
    acc = hw.accelerator
    accelerated = acc is not None
    idle_frac = catalog.assumption("device_idle_power_fraction")
    board = acc.tdp_w if accelerated else 0.0  # None: no published board power
    device_w = None if board is None else (device_power_w(board, utilisation, idle_frac) if accelerated else 0.0)
    if dc is None:  # the board's draw is known; the host's and the PUE are not: unknown, never a placeholder 0 or 1
        return Energy(None, None, device_w, None, utilisation, None, intensity, label,
                      f"no data-centre figures for cloud {hw.cloud}")  # fmt: skip
    layout = hw.layout
    cpu_u = catalog.assumption("host_cpu_utilisation_accelerated") if accelerated else 1.0
    host_w = host_power_w(hw.vcpus_per_node, hw.ram_gib_per_node, dc, cpu_u)
    host_idle_w = host_power_w(hw.vcpus_per_node, hw.ram_gib_per_node, dc, 0.0)
    if board is None or device_w is None:  # (the same condition; both named for the type checker)
        return Energy(None, None, None, host_w, utilisation, dc.pue, intensity, label,
                      f"no board power (tdp_w) for {acc.id} in the catalog - not published by its maker - so kWh and "
                      f"CO2 are unknown")  # fmt: skip
    device_idle_w = board * idle_frac
    devices = layout.world_size if accelerated else 0
    train_w = devices * device_w + layout.nodes * host_w
    idle_w = devices * device_idle_w + layout.nodes * host_idle_w
    if train_s == float("inf"):
        return Energy(None, None, device_w, host_w, utilisation, dc.pue, intensity, label, "training time unknown")
    kwh = facility_kwh(train_w, train_s, dc.pue) + facility_kwh(idle_w, startup_s, dc.pue)
    note = None if grid else f"no grid carbon intensity for {label} (grid_intensity.csv); use --region"
    co2 = emissions_kg(kwh, intensity) if intensity is not None else None
    return Energy(kwh, co2, device_w, host_w, utilisation, dc.pue, intensity, label, note)


def step_utilisation(time_breakdown: Mapping[str, float], step_time_s: float) -> float:
    """The modelled accelerator utilisation of a step: its compute share (1.0 when the estimate has no split)."""
    compute = time_breakdown.get("compute_s")
    if compute is None or not step_time_s or step_time_s == float("inf"):
        return 1.0
    return min(1.0, compute / step_time_s)
