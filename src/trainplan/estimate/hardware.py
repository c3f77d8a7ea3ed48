"""The hardware an option runs on, built from catalog rows: an instance (× nodes), GPUs, or vCPUs."""

from __future__ import annotations

from dataclasses import dataclass, replace

from trainplan.catalog import Accelerator, Catalog, CloudTerms, Instance
from trainplan.catalog.loader import Cpu
from trainplan.errors import CatalogError, SpecError
from trainplan.strategies import Layout


@dataclass(frozen=True)
class CpuRates:
    """An option's CPU cores as the CPU time model (``estimate/cpu.py``) sees them, all cores together.

    Either the spec of a ``cpus.csv`` row × the default efficiencies (:func:`cpu_rates_from_spec`) or what
    ``trainplan probe`` measured on this machine (``planner/local.py``).  ``matmul`` holds the achieved
    FLOP/s per dtype the cores have units for (``fp32`` always); ``peak`` the spec peak (the MFU denominator).
    """

    matmul: tuple[tuple[str, float], ...]  # (dtype, achieved FLOP/s over all cores)
    peak: tuple[tuple[str, float], ...]  # (dtype, peak FLOP/s over all cores); the measured rate when no spec is known
    mem_bw_bytes_s: float  # achieved streaming bandwidth (STREAM copy counts read + write bytes)
    activation_bytes_s: float  # saved activations per second through the element-wise layers, forward + backward
    cores: float  # physical cores (or, measured, the threads the probe used)
    source: str
    measured: bool = False
    runtime_overhead_bytes: float | None = None  # measured on this machine; None: the catalog default
    operator_overhead_s: float = 0.0  # seconds an eager step spends per operator dispatched, whatever its size
    operator_bytes_s: float = 0.0  # bytes per second the memory-bound operators read + write (0: not known)
    conv_efficiency: float = 1.0  # a convolution's FLOP rate over the matmul rate
    rnn_efficiency: float = 1.0  # a fused recurrent layer's FLOP rate over the matmul rate

    def rate(self, dtype: str) -> float | None:
        """Achieved matmul FLOP/s for ``dtype``; None when the cores have no units for it."""
        return dict(self.matmul).get(dtype)

    def peak_rate(self, dtype: str) -> float | None:
        return dict(self.peak).get(dtype) or self.rate(dtype)


def physical_cpu_cores(vcpus: float, cpu: Cpu) -> float:
    """Physical cores behind ``vcpus``: a cloud vCPU is one hardware thread (AWS "CPU options": 2 threads per
    core on x86 instances; GCP and Azure alike), so cores = vCPUs / threads per core."""
    return max(1.0, vcpus / cpu.threads_per_core)


def cpu_rates_from_spec(cpu: Cpu, vcpus: float, catalog: Catalog) -> CpuRates:
    """The spec of ``cpu`` for ``vcpus`` vCPUs × the default efficiencies (``cpu_matmul_efficiency``,
    ``cpu_mem_bw_efficiency`` in assumptions.yaml, each with its source).

    Matmul peak = cores × FLOPs/cycle/core (vector or matrix units, cpus.csv) × all-core clock.  Memory
    bandwidth = the socket's DRAM bandwidth × the option's share of the socket's cores (a VM gets the
    channels of the cores it holds; several sockets when it holds more cores than one socket has).
    Element-wise rate = ``cpu_activation_gb_s_per_core`` (measured on a reference core) × cores × the clock and
    vector-width ratios to that core, at most the bandwidth; the memory-bound operators' byte rate is that rate ×
    ``cpu_operator_bytes_per_saved_byte`` (:func:`operator_rates`).  Per-operator overhead =
    ``cpu_operator_overhead_us`` (measured on a reference core) × the reference clock / this CPU's clock.
    Convolutions and fused recurrent layers run at ``cpu_conv_efficiency`` and ``cpu_rnn_efficiency`` × the matmul
    rate (measured on a reference core).
    """
    cores = physical_cpu_cores(vcpus, cpu)
    eff = catalog.assumption("cpu_matmul_efficiency")
    peak = tuple((dt, cores * f) for dt in ("fp32", "bf16", "fp16") if (f := cpu.peak_flops_per_core(dt)))
    bw = cpu.mem_bw_gb_s_per_socket * 1e9 * cores / cpu.cores_per_socket * catalog.assumption("cpu_mem_bw_efficiency")
    act = catalog.assumptions["cpu_activation_gb_s_per_core"]
    per_core = (float(act["value"]) * 1e9 * cpu.all_core_ghz / float(act["ref_all_core_ghz"])
                * cpu.fp32_flops_per_cycle_per_core / float(act["ref_fp32_flops_per_cycle"]))  # fmt: skip
    activation = min(bw, per_core * cores)
    op = catalog.assumptions["cpu_operator_overhead_us"]
    return CpuRates(
        matmul=tuple((dt, f * eff) for dt, f in peak),
        peak=peak,
        mem_bw_bytes_s=bw,
        activation_bytes_s=activation,
        cores=cores,
        source=f"{cpu.model}: cpus.csv spec ({cpu.as_of}) x default efficiency {eff:g}",
        conv_efficiency=catalog.assumption("cpu_conv_efficiency"),
        rnn_efficiency=catalog.assumption("cpu_rnn_efficiency"),
        **operator_rates(activation, float(op["value"]) * float(op["ref_all_core_ghz"]) / cpu.all_core_ghz, catalog),
    )


def operator_rates(activation_bytes_s: float, operator_overhead_us: float, catalog: Catalog) -> dict[str, float]:
    """The CPU time model's per-operator figures (``estimate/cpu.py``): the overhead in seconds, and the byte rate of
    the memory-bound operators, which is the element-wise rate (saved bytes per second of the reference norm +
    nonlinearity pairs, ``measure/cpu_rate.py``) × the bytes those pairs' operators read and write per byte they save
    (``cpu_operator_bytes_per_saved_byte``, counted by the trace's operator tally): the same timing, in bytes moved."""
    ratio = catalog.assumption("cpu_operator_bytes_per_saved_byte")
    return {"operator_overhead_s": operator_overhead_us * 1e-6, "operator_bytes_s": activation_bytes_s * ratio}


def _spec_rates(cpu_model: str, vcpus: float, catalog: Catalog) -> CpuRates | None:
    row = catalog.cpus.get(cpu_model)
    return cpu_rates_from_spec(row, vcpus, catalog) if row is not None else None


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
    cpu: CpuRates | None = None  # the cores as the CPU time model sees them (None: no cpus.csv row, not measured)

    @property
    def label(self) -> str:
        if self.instance is not None:
            base = f"{self.instance.cloud}:{self.instance.name}"
            if self.instance.accelerator and self.accelerator is None:
                base += " CPUs"  # the CPUs of a machine that also has GPUs
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
        layout=Layout(gpus_per_node=max(1, inst.accelerator_count), nodes=nodes, scale_up=inst.scale_up_gpus or 0),
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
        cpu=_spec_rates(inst.cpu_model, inst.vcpus, catalog),
    )


def hardware_for_instance_cpus(inst: Instance, catalog: Catalog) -> Hardware:
    """The CPUs of ``inst`` alone (a workstation whose GPUs are left idle): one process on every core,
    priced as the instance."""
    hw = hardware_for_instance(inst, catalog)
    return replace(hw, layout=Layout(1, 1), accelerator=None, intra_node_bw_gb_s=None,
                   price_note=hw.price_note + "; CPUs only")  # fmt: skip


def hardware_for_gpu(acc: Accelerator, catalog: Catalog, *, gpus: int, nodes: int = 1) -> Hardware:
    """``gpus`` × ``acc`` per node without a named instance.

    Interconnect, host and price are borrowed from the catalog instance with
    this accelerator whose GPU count is the smallest ≥ ``gpus`` (cheapest on a
    tie; for several nodes, among the instances with a network), and the price is scaled to ``gpus`` per node.
    """
    rows = [i for i in catalog.instances if i.accelerator == acc.id]
    if not rows:
        raise CatalogError(f"no instance in the catalog carries {acc.id}; add one that does to your own catalog "
                           "(trainplan --catalog DIR, or trainplan catalog import-skypilot: docs/catalog.md)", field="--gpu")
    if nodes > 1:  # several nodes talk over a network: borrow from an instance that has one (single-node rentals do not)
        rows = [i for i in rows if i.network_gbps] or rows
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


def hardware_for_cpus(vcpus: int, catalog: Catalog, *, cpu: CpuRates | None = None,
                      cpu_model: str | None = None) -> Hardware:  # fmt: skip
    """``vcpus`` without a named instance, priced at the cheapest catalog CPU rate per vCPU.

    The cores are the reference instance's CPU (its cpus.csv spec) unless ``cpu`` gives measured rates
    (this machine, ``planner/local.py``) for ``cpu_model``.
    """
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
        cpu_model=cpu_model or ref.cpu_model,
        cpu=cpu if cpu is not None else _spec_rates(ref.cpu_model, vcpus, catalog),
    )


def with_layout(hw: Hardware, degrees: dict[str, int | bool]) -> Hardware:
    """``hw`` with model-parallel degrees given on a command line (``tp``, ``pp``, ``vpp``, ``cp``, ``ep``,
    ``sequence_parallel``; validated by :class:`Layout`)."""
    if all(v in (1, False) for v in degrees.values()):
        return hw
    if hw.accelerator is None:
        raise SpecError("tensor / pipeline / context / expert parallelism is planned on GPUs; give --gpu or --instance",
                        field="--tp/--pp/--cp/--ep")  # fmt: skip
    return replace(hw, layout=hw.layout.split(**degrees))
