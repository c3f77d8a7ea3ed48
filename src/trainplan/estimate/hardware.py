"""The hardware an option runs on, built from catalog rows: an instance (× nodes), GPUs, or vCPUs."""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.catalog import Accelerator, Catalog, CloudTerms, Instance
from trainplan.errors import CatalogError
from trainplan.strategies import Layout


@dataclass(frozen=True)
class Hardware:
    """What an option runs on: an instance type (× nodes), or a bare accelerator/CPU count."""

    layout: Layout
    accelerator: Accelerator | None  # None: CPU only
    instance: Instance | None  # None when named by --gpu/--cpus without an instance
    price_usd_per_h_per_node: float
    price_note: str
    vcpus_per_node: int
    ram_gib_per_node: float
    intra_node_bw_gb_s: float | None
    network_gbps: float | None
    cloud: str
    terms: CloudTerms | None
    cpu_model: str = ""

    @property
    def label(self) -> str:
        if self.instance is not None:
            base = f"{self.instance.cloud}:{self.instance.name}"
        elif self.accelerator is not None:
            base = f"{self.layout.gpus_per_node}x{self.accelerator.id}"
        else:
            base = f"{self.vcpus_per_node} vCPU"
        return base if self.layout.nodes == 1 else f"{self.layout.nodes}x {base}"



def hardware_for_instance(inst: Instance, catalog: Catalog, *, nodes: int = 1, spot: bool = False) -> Hardware:
    """An instance type, ``nodes`` of them, priced on demand (or spot)."""
    price = inst.price_usd_per_h
    note = f"{inst.cloud} {inst.region} on-demand, {inst.as_of}"
    if spot:
        if inst.spot_price_usd_per_h is None:
            raise CatalogError(f"{inst.name} has no spot price in the catalog", field="constraints.spot")
        price, note = inst.spot_price_usd_per_h, f"{inst.cloud} {inst.region} spot, {inst.as_of}"
    return Hardware(
        layout=Layout(gpus_per_node=max(1, inst.accelerator_count), nodes=nodes),
        accelerator=catalog.accelerators.get(inst.accelerator) if inst.accelerator else None,
        instance=inst,
        price_usd_per_h_per_node=price,
        price_note=note,
        vcpus_per_node=inst.vcpus,
        ram_gib_per_node=inst.ram_gib,
        intra_node_bw_gb_s=inst.intra_node_bw_gb_s,
        network_gbps=inst.network_gbps,
        cloud=inst.cloud,
        terms=catalog.clouds.get(inst.cloud),
        cpu_model=inst.cpu_model,
    )


def hardware_for_gpu(acc: Accelerator, catalog: Catalog, *, gpus: int, nodes: int = 1) -> Hardware:
    """``gpus`` × ``acc`` per node without a named instance.

    Interconnect, host and price are borrowed from the catalog instance with
    this accelerator whose GPU count is the smallest ≥ ``gpus`` (cheapest on a
    tie), and the price is scaled to ``gpus`` per node.
    """
    rows = [i for i in catalog.instances if i.accelerator == acc.id]
    if not rows:
        raise CatalogError(f"no instance in the catalog carries {acc.id}", field="--gpu")
    big_enough = [i for i in rows if i.accelerator_count >= gpus] or rows
    ref = min(big_enough, key=lambda i: (i.accelerator_count, i.price_usd_per_h / i.accelerator_count))
    per_gpu = ref.price_usd_per_h / ref.accelerator_count
    scale = gpus / ref.accelerator_count
    return Hardware(
        layout=Layout(gpus_per_node=gpus, nodes=nodes),
        accelerator=acc,
        instance=None,
        price_usd_per_h_per_node=per_gpu * gpus,
        price_note=f"per-GPU rate of {ref.cloud}:{ref.name} ({ref.as_of})",
        vcpus_per_node=max(1, round(ref.vcpus * scale)),
        ram_gib_per_node=ref.ram_gib * scale if ref.accelerator_count > gpus else ref.ram_gib,
        intra_node_bw_gb_s=ref.intra_node_bw_gb_s if gpus > 1 else None,
        network_gbps=ref.network_gbps,
        cloud=ref.cloud,
        terms=catalog.clouds.get(ref.cloud),
        cpu_model=ref.cpu_model,
    )


def hardware_for_cpus(vcpus: int, catalog: Catalog) -> Hardware:
    """``vcpus`` without a named instance, priced at the cheapest catalog CPU rate per vCPU."""
    rows = [i for i in catalog.instances if i.is_cpu_only and i.cloud != "local"]
    if not rows:
        raise CatalogError("no CPU-only instance in the catalog", field="--cpus")
    ref = min(rows, key=lambda i: i.price_usd_per_h / i.vcpus)
    ram_per_vcpu = ref.ram_gib / ref.vcpus
    return Hardware(
        layout=Layout(1, 1),
        accelerator=None,
        instance=None,
        price_usd_per_h_per_node=ref.price_usd_per_h / ref.vcpus * vcpus,
        price_note=f"per-vCPU rate of {ref.cloud}:{ref.name} ({ref.as_of})",
        vcpus_per_node=vcpus,
        ram_gib_per_node=ram_per_vcpu * vcpus,
        intra_node_bw_gb_s=None,
        network_gbps=ref.network_gbps,
        cloud=ref.cloud,
        terms=catalog.clouds.get(ref.cloud),
        cpu_model=ref.cpu_model,
    )
