"""Load and validate the catalog data files.

The numbers live in CSV/YAML files under ``catalog/data`` with units in the
column names and a source and date on every row.  Public catalog data has
errors (placeholder prices, duplicated rows, memory in MiB, spot prices above
on-demand); each check below turns such a row into a :class:`CatalogIssue`.
A row with an issue is reported and left out — never silently used.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

DATA_DIR = Path(__file__).with_name("data")

# Prices that appear in public catalogs as "unknown" placeholders (SkyPilot's
# GCP TPU rows use 700.0 for unpriced regions; see docs/catalog.md).
PLACEHOLDER_PRICES_USD_PER_H = (700.0,)
MAX_PLAUSIBLE_ACCEL_MEMORY_GIB = 512.0  # larger means the value was given in MiB


@dataclass(frozen=True)
class CatalogIssue:
    file: str
    line: int
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.key}: {self.message}"


@dataclass(frozen=True)
class Accelerator:
    id: str
    vendor: str
    kind: str  # gpu | tpu
    memory_gib: float
    peak_bf16_tflops: float | None
    peak_fp16_tflops: float | None
    peak_fp32_tflops: float | None
    peak_tf32_tflops: float | None
    mem_bandwidth_gb_s: float
    source: str
    as_of: str
    tdp_w: float | None = None
    peak_fp8_tflops: float | None = None  # dense FP8 tensor-core peak; None: no FP8 units (or none published)
    sm_count: int | None = None  # NVIDIA streaming multiprocessors enabled on the product (tabular GPU rates scale by it)

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak for a compute dtype: 'fp8', 'bf16', 'fp16', 'fp32' (tf32 tensor cores used for fp32 matmuls
        when present)."""
        if dtype == "fp8":
            return self.peak_fp8_tflops
        if dtype == "bf16":
            return self.peak_bf16_tflops
        if dtype == "fp16":
            return self.peak_fp16_tflops
        return self.peak_tf32_tflops or self.peak_fp32_tflops


@dataclass(frozen=True)
class Instance:
    cloud: str
    name: str
    region: str
    vcpus: int
    ram_gib: float
    accelerator: str | None
    accelerator_count: int
    interconnect: str
    intra_node_bw_gb_s: float | None
    network_gbps: float | None
    price_usd_per_h: float
    spot_price_usd_per_h: float | None
    cpu_model: str
    source: str
    as_of: str
    # GPUs that share the NVLink / Infinity Fabric / ICI domain at full bandwidth, when it spans several instances
    # (GB200 NVL72: 18 nodes of 4 GPUs, 72); None: the instance itself (optional column ``scale_up_gpus``)
    scale_up_gpus: int | None = None

    @property
    def is_cpu_only(self) -> bool:
        return self.accelerator is None


@dataclass(frozen=True)
class CloudTerms:
    cloud: str
    billing_increment_s: float
    billing_minimum_s: float
    startup_s: float
    source: str
    as_of: str


@dataclass(frozen=True)
class TabularRate:
    """Work rate of a tabular library on one device class (see estimate/tabular.py for the unit of work)."""

    library: str
    device: str  # cpu | gpu
    ns_per_cell: float  # nanoseconds per unit of work, per core (cpu) or per GPU at the reference bandwidth
    serial_fraction: float  # Amdahl serial fraction over cores (cpu)
    ref_mem_bandwidth_gb_s: float | None  # gpu: bandwidth of the GPU the rate was measured on
    source: str
    as_of: str
    # histogram GBDT on a CPU, the terms of estimate/tabular.py gbdt_terms (ns_per_cell is then the dense histogram
    # cell's rate); None where a library is priced by ns_per_cell alone
    ns_per_sparse_cell: float | None = None
    ns_per_split_bin: float | None = None
    ns_per_row_level: float | None = None
    prep_ns_per_cell: float | None = None  # once per fit, per stored cell: binning (DMatrix / Dataset construction)
    thread_overhead_us_per_node: float | None = None  # per tree node and thread beyond the first (synchronisation)
    gpu_fixed_us_per_step: float | None = None  # gpu: per level (depth-wise, symmetric) or split (leaf-wise) per round
    # CatBoost: the work of categorical columns (ordered target statistics, their combinations) beyond numeric ones,
    # in this row's cells per training row per tree: once for any categorical column, and per categorical column
    categorical_cells_per_row_tree: float | None = None
    categorical_cells_per_column_row_tree: float | None = None
    ref_sm_count: int | None = None  # gpu: streaming multiprocessors of the GPU the rate was measured on

    @property
    def has_terms(self) -> bool:
        return None not in (self.ns_per_sparse_cell, self.ns_per_split_bin, self.ns_per_row_level, self.prep_ns_per_cell)


@dataclass(frozen=True)
class TabularRelease:
    """How much longer an older release of a histogram GBDT library takes than the release ``tabular_rates.csv`` was
    measured with, per cost term (benchmarks/tabular_versions.py: both releases timed on one machine, one thread)."""

    library: str
    release: str  # "1.0.2"
    dense_cell_factor: float
    sparse_cell_factor: float
    split_bin_factor: float
    row_level_factor: float
    prep_factor: float
    source: str
    as_of: str

    @property
    def key(self) -> tuple[int, ...]:
        return release_key(self.release)


def release_key(release: str) -> tuple[int, ...]:
    """``"1.0.2"`` → (1, 0, 2), padded to three parts, for ordering releases."""
    parts = tuple(int(p) for p in release.split("."))
    return parts + (0,) * (3 - len(parts))


@dataclass(frozen=True)
class GridIntensity:
    """Carbon intensity of the electricity a cloud region draws (location-based), per kWh."""

    cloud: str
    region: str
    location: str
    kg_co2e_per_kwh: float
    source: str
    as_of: str


@dataclass(frozen=True)
class DataCenter:
    """A cloud's data-centre power figures: PUE and host (CPU, memory) watts (estimate/energy.py)."""

    cloud: str
    pue: float
    host_min_w_per_vcpu: float
    host_max_w_per_vcpu: float
    ram_w_per_gb: float
    source: str
    as_of: str


@dataclass(frozen=True)
class Cpu:
    """A CPU model (``cpus.csv``): what the CPU time model (``estimate/cpu.py``) needs, per core and per socket."""

    model: str  # the ``cpu_model`` text of the instances that carry it (instances.csv), matched exactly
    vendor: str
    microarchitecture: str
    isa: str  # widest vector / matrix extension: avx2 | avx512 | avx512+amx
    cores_per_socket: int
    threads_per_core: int  # hardware threads per core (a cloud vCPU is one of them)
    all_core_ghz: float  # sustained all-core clock
    fp32_flops_per_cycle_per_core: float
    bf16_flops_per_cycle_per_core: float | None  # None: no bf16 units (bf16 runs through the fp32 units)
    fp16_flops_per_cycle_per_core: float | None  # None: no fp16 arithmetic units
    mem_bw_gb_s_per_socket: float  # peak DRAM bandwidth: channels x transfer rate x 8 bytes
    source: str
    as_of: str

    def peak_flops_per_core(self, dtype: str) -> float | None:
        """Peak FLOP/s of one core for a matmul dtype ('fp32', 'bf16', 'fp16'); None when it has no units for it."""
        per_cycle = {"fp32": self.fp32_flops_per_cycle_per_core, "bf16": self.bf16_flops_per_cycle_per_core,
                     "fp16": self.fp16_flops_per_cycle_per_core}.get(dtype)  # fmt: skip
        return per_cycle * self.all_core_ghz * 1e9 if per_cycle else None


@dataclass(frozen=True)
class Catalog:
    accelerators: dict[str, Accelerator]
    instances: tuple[Instance, ...]
    clouds: dict[str, CloudTerms]
    models: dict[str, dict[str, Any]]
    assumptions: dict[str, dict[str, Any]]
    tabular_rates: dict[tuple[str, str], "TabularRate"] = field(default_factory=dict)
    # (library, release) -> tabular_releases.csv row: an older release's time per cost term over the rates' release
    tabular_releases: dict[tuple[str, str], "TabularRelease"] = field(default_factory=dict)
    issues: tuple[CatalogIssue, ...] = field(default=())
    stacks: dict[str, dict[str, Any]] = field(default_factory=dict)  # stacks.yaml: defaults that change memory
    grid: dict[tuple[str, str], GridIntensity] = field(default_factory=dict)  # (cloud, region) -> grid_intensity.csv row
    datacenters: dict[str, DataCenter] = field(default_factory=dict)  # cloud -> datacenters.csv row
    cpus: dict[str, Cpu] = field(default_factory=dict)  # cpu_model -> cpus.csv row (estimate/cpu.py)
    # where a row of the user's catalog came from: ("accelerator", id) / ("instance", "cloud:name") / ("cloud", name)
    # -> the file; rows not in it are built-in
    origins: dict[tuple[str, str], str] = field(default_factory=dict)

    def origin(self, kind: str, key: str) -> str:
        """"built-in", or the user's file that added or overrode the row."""
        return self.origins.get((kind, key), "built-in")

    def assumption(self, key: str) -> float:
        """A documented default (efficiency, overhead) by key; see assumptions.yaml."""
        return float(self.assumptions[key]["value"])


# ----------------------------------------------------------------------------- parsing helpers


class _RowError(ValueError):
    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def _opt_count(row: dict[str, str], key: str) -> int | None:
    """An optional whole count > 0 (an empty cell: None)."""
    value = _opt_float(row, key)
    if value is None:
        return None
    if value < 1 or value != int(value):
        raise _RowError(key, f"must be a whole number >= 1, got {row[key].strip()!r}")
    return int(value)


def _opt_float(row: dict[str, str], key: str) -> float | None:
    raw = (row.get(key) or "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise _RowError(key, f"not a number: {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise _RowError(key, f"must be a finite number >= 0, got {raw!r}")
    return value


def _req_float(row: dict[str, str], key: str, *, positive: bool = True) -> float:
    value = _opt_float(row, key)
    if value is None:
        raise _RowError(key, "missing")
    if positive and value <= 0:
        raise _RowError(key, f"must be > 0, got {value:g}")
    return value


def _req_str(row: dict[str, str], key: str) -> str:
    raw = (row.get(key) or "").strip()
    if not raw:
        raise _RowError(key, "missing")
    return raw


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def _name(row: dict[str, str], key: str) -> str:
    """A name that becomes a label, a SkyPilot or SLURM field, a file or YAML value: letters, digits and ._+- only
    (never a quote, a space, a control character or a shell metacharacter)."""
    value = _req_str(row, key)
    if not _NAME.fullmatch(value):
        raise _RowError(key, f"{value!r} is not a name (letters, digits and . _ + - only)")
    return value


def _read_rows(
    path: Path,
    required: Iterable[str],
    build: Callable[[dict[str, str]], Any],
    key_of: Callable[[Any], Any],
) -> tuple[list[Any], list[CatalogIssue]]:
    """Parse a CSV; each good row through ``build``; duplicates and bad rows become issues."""
    items: list[Any] = []
    issues: list[CatalogIssue] = []
    seen: dict[Any, int] = {}
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing_cols = [c for c in required if c not in (reader.fieldnames or [])]
        if missing_cols:
            return [], [CatalogIssue(path.name, 1, missing_cols[0], "column missing from header")]
        for i, row in enumerate(reader, start=2):
            if None in row:  # more cells than header columns
                issues.append(CatalogIssue(path.name, i, "row", "more cells than columns"))
                continue
            try:
                for col in ("source", "as_of"):
                    _req_str(row, col)
                item = build(row)
            except _RowError as exc:
                issues.append(CatalogIssue(path.name, i, exc.key, str(exc)))
                continue
            key = key_of(item)
            if key in seen:
                issues.append(CatalogIssue(path.name, i, "row", f"duplicate of line {seen[key]} ({key})"))
                continue
            seen[key] = i
            items.append(item)
    return items, issues


# ----------------------------------------------------------------------------- builders


def _build_accelerator(row: dict[str, str]) -> Accelerator:
    mem = _req_float(row, "memory_gib")
    if mem > MAX_PLAUSIBLE_ACCEL_MEMORY_GIB:
        raise _RowError("memory_gib", f"{mem:g} is implausible for GiB (given in MiB?)")
    kind = _req_str(row, "kind")
    if kind not in ("gpu", "tpu"):
        raise _RowError("kind", f"must be gpu or tpu, got {kind!r}")
    acc = Accelerator(
        id=_name(row, "accelerator"),
        vendor=_req_str(row, "vendor"),
        kind=kind,
        memory_gib=mem,
        peak_bf16_tflops=_opt_float(row, "peak_bf16_tflops"),
        peak_fp16_tflops=_opt_float(row, "peak_fp16_tflops"),
        peak_fp32_tflops=_opt_float(row, "peak_fp32_tflops"),
        peak_tf32_tflops=_opt_float(row, "peak_tf32_tflops"),
        mem_bandwidth_gb_s=_req_float(row, "mem_bandwidth_gb_s"),
        tdp_w=_opt_float(row, "tdp_w"),
        peak_fp8_tflops=_opt_float(row, "peak_fp8_tflops"),
        sm_count=_opt_count(row, "sm_count"),
        source=row["source"].strip(),
        as_of=row["as_of"].strip(),
    )
    if not (acc.peak_bf16_tflops or acc.peak_fp16_tflops or acc.peak_fp32_tflops):
        raise _RowError("peak_bf16_tflops", "no peak throughput given for any dtype")
    return acc


def _instance_builder(accelerators: dict[str, Accelerator]) -> Callable[[dict[str, str]], Instance]:
    def build(row: dict[str, str]) -> Instance:
        cloud = _name(row, "cloud")
        accel = (row.get("accelerator") or "").strip() or None
        count = int(_opt_float(row, "accelerator_count") or 0)
        if accel is not None and accel not in accelerators:
            raise _RowError("accelerator", f"unknown accelerator {accel!r} (not in accelerators.csv)")
        if accel is None and count:
            raise _RowError("accelerator", f"accelerator_count is {count} but no accelerator is named")
        if accel is not None and count < 1:
            raise _RowError("accelerator_count", f"must be >= 1 for {accel}")
        price = _opt_float(row, "price_usd_per_h")
        if price is None:
            raise _RowError("price_usd_per_h", "missing on-demand price")
        if price in PLACEHOLDER_PRICES_USD_PER_H:
            raise _RowError("price_usd_per_h", f"{price:g} is a known placeholder, not a price")
        if price < 0 or (price == 0 and cloud != "local"):
            raise _RowError("price_usd_per_h", f"{price:g} is not a price (> 0 for a cloud instance, >= 0 owned)")
        spot = _opt_float(row, "spot_price_usd_per_h")
        if spot is not None and spot in PLACEHOLDER_PRICES_USD_PER_H:
            raise _RowError("spot_price_usd_per_h", f"{spot:g} is a known placeholder, not a price")
        if spot is not None and spot > price:
            raise _RowError("spot_price_usd_per_h", f"spot {spot:g} above on-demand {price:g}")
        domain = _opt_float(row, "scale_up_gpus")
        if domain is not None and (accel is None or domain != int(domain) or domain < count or int(domain) % count):
            raise _RowError("scale_up_gpus", f"must be a whole multiple of the instance's {count} accelerators "
                                             f"(the GPUs sharing its NVLink domain), got {domain:g}")  # fmt: skip
        return Instance(
            cloud=cloud,
            name=_name(row, "instance"),
            region=_name(row, "region"),
            vcpus=int(_req_float(row, "vcpus")),
            ram_gib=_req_float(row, "ram_gib"),
            accelerator=accel,
            accelerator_count=count,
            interconnect=(row.get("interconnect") or "none").strip() or "none",
            intra_node_bw_gb_s=_opt_float(row, "intra_node_bw_gb_s"),
            network_gbps=_opt_float(row, "network_gbps"),
            price_usd_per_h=price,
            spot_price_usd_per_h=spot,
            cpu_model=(row.get("cpu_model") or "").strip(),
            source=row["source"].strip(),
            as_of=row["as_of"].strip(),
            scale_up_gpus=int(domain) if domain is not None and domain > count else None,
        )

    return build


def _build_cloud(row: dict[str, str]) -> CloudTerms:
    return CloudTerms(
        cloud=_name(row, "cloud"),
        billing_increment_s=_opt_float(row, "billing_increment_s") or 0.0,
        billing_minimum_s=_opt_float(row, "billing_minimum_s") or 0.0,
        startup_s=_opt_float(row, "startup_s") or 0.0,
        source=row["source"].strip(),
        as_of=row["as_of"].strip(),
    )


ACCELERATOR_COLUMNS = (
    "accelerator", "vendor", "kind", "memory_gib", "peak_bf16_tflops", "peak_fp16_tflops",
    "peak_fp32_tflops", "peak_tf32_tflops", "mem_bandwidth_gb_s", "source", "as_of",
)  # fmt: skip
INSTANCE_COLUMNS = (
    "cloud", "instance", "region", "vcpus", "ram_gib", "accelerator", "accelerator_count", "interconnect",
    "intra_node_bw_gb_s", "network_gbps", "price_usd_per_h", "spot_price_usd_per_h", "source", "as_of",
)  # fmt: skip
TABULAR_RATE_COLUMNS = ("library", "device", "ns_per_cell", "serial_fraction", "source", "as_of")


def _build_rate(row: dict[str, str]) -> TabularRate:
    device = _req_str(row, "device")
    if device not in ("cpu", "gpu"):
        raise _RowError("device", f"must be cpu or gpu, got {device!r}")
    serial = _opt_float(row, "serial_fraction") or 0.0
    if serial >= 1:
        raise _RowError("serial_fraction", f"must be < 1, got {serial:g}")
    ref_bw = _opt_float(row, "ref_mem_bandwidth_gb_s")
    if device == "gpu" and not ref_bw:
        raise _RowError("ref_mem_bandwidth_gb_s", "needed for a gpu rate")
    terms = [_opt_float(row, key) for key in _TERM_COLUMNS]
    if any(t is not None for t in terms) and (None in terms or device != "cpu"):
        raise _RowError(_TERM_COLUMNS[terms.index(None)] if None in terms else "device",
                        "the per-term rates go together: all four, on a cpu row")  # fmt: skip
    return TabularRate(
        library=_req_str(row, "library"),
        device=device,
        ns_per_cell=_req_float(row, "ns_per_cell"),
        serial_fraction=serial,
        ref_mem_bandwidth_gb_s=ref_bw,
        source=row["source"].strip(),
        as_of=row["as_of"].strip(),
        **{key: _opt_float(row, key) for key in _TERM_COLUMNS},
        thread_overhead_us_per_node=_opt_float(row, "thread_overhead_us_per_node"),
        gpu_fixed_us_per_step=_opt_float(row, "gpu_fixed_us_per_step"),
        categorical_cells_per_row_tree=_opt_float(row, "categorical_cells_per_row_tree"),
        categorical_cells_per_column_row_tree=_opt_float(row, "categorical_cells_per_column_row_tree"),
        ref_sm_count=_opt_count(row, "ref_sm_count"),
    )


#: Optional columns: the per-term rates of a histogram GBDT on a CPU (all four, or none).
_TERM_COLUMNS = ("ns_per_sparse_cell", "ns_per_split_bin", "ns_per_row_level", "prep_ns_per_cell")
RELEASE_COLUMNS = ("library", "release", "dense_cell_factor", "sparse_cell_factor", "split_bin_factor",
                   "row_level_factor", "prep_factor", "source", "as_of")  # fmt: skip
RELEASE_PATTERN = re.compile(r"\d+\.\d+(\.\d+)?")  # a library release: 1.7 or 1.7.6


def _build_release(row: dict[str, str]) -> TabularRelease:
    release = _req_str(row, "release")
    if not RELEASE_PATTERN.fullmatch(release):
        raise _RowError("release", f"must be a release number like 1.0.2, got {release!r}")
    factors = {key: _req_float(row, key) for key in RELEASE_COLUMNS[2:7]}
    return TabularRelease(library=_req_str(row, "library"), release=release, source=row["source"].strip(),
                          as_of=row["as_of"].strip(), **factors)  # fmt: skip


GRID_COLUMNS = ("cloud", "region", "location", "grid_kg_co2e_per_kwh", "source", "as_of")
DATACENTER_COLUMNS = ("cloud", "pue", "host_min_w_per_vcpu", "host_max_w_per_vcpu", "ram_w_per_gb", "source", "as_of")


def _build_grid(row: dict[str, str]) -> GridIntensity:
    value = _req_float(row, "grid_kg_co2e_per_kwh")
    if value > 2.0:
        raise _RowError("grid_kg_co2e_per_kwh", f"{value:g} is implausible for kg per kWh (given in g?)")
    return GridIntensity(_req_str(row, "cloud"), _req_str(row, "region"), (row.get("location") or "").strip(), value,
                         row["source"].strip(), row["as_of"].strip())  # fmt: skip


def _build_datacenter(row: dict[str, str]) -> DataCenter:
    pue = _req_float(row, "pue")
    if pue < 1.0:
        raise _RowError("pue", f"must be >= 1 (facility energy / IT energy), got {pue:g}")
    lo, hi = _req_float(row, "host_min_w_per_vcpu"), _req_float(row, "host_max_w_per_vcpu")
    if hi < lo:
        raise _RowError("host_max_w_per_vcpu", f"{hi:g} below host_min_w_per_vcpu {lo:g}")
    return DataCenter(_req_str(row, "cloud"), pue, lo, hi, _req_float(row, "ram_w_per_gb", positive=False),
                      row["source"].strip(), row["as_of"].strip())  # fmt: skip


CPU_COLUMNS = (
    "cpu_model", "vendor", "microarchitecture", "isa", "cores_per_socket", "threads_per_core", "all_core_ghz",
    "fp32_flops_per_cycle_per_core", "bf16_flops_per_cycle_per_core", "fp16_flops_per_cycle_per_core",
    "mem_bw_gb_s_per_socket", "source", "as_of",
)  # fmt: skip
MAX_PLAUSIBLE_CPU_GHZ = 7.0  # no server or desktop part sustains more on all cores; more means MHz or a typo
MAX_PLAUSIBLE_FLOPS_PER_CYCLE = 4096.0  # AMX bf16 is 1024 per core; more means per socket or per chip


def _build_cpu(row: dict[str, str]) -> Cpu:
    ghz = _req_float(row, "all_core_ghz")
    if ghz > MAX_PLAUSIBLE_CPU_GHZ:
        raise _RowError("all_core_ghz", f"{ghz:g} is implausible for GHz (given in MHz?)")
    per_cycle = {}
    for key in ("fp32_flops_per_cycle_per_core", "bf16_flops_per_cycle_per_core", "fp16_flops_per_cycle_per_core"):
        value = _req_float(row, key) if key.startswith("fp32") else _opt_float(row, key)
        if value is not None and not 0 < value <= MAX_PLAUSIBLE_FLOPS_PER_CYCLE:
            raise _RowError(key, f"{value:g} is implausible per core per cycle (0 < x <= {MAX_PLAUSIBLE_FLOPS_PER_CYCLE:g})")
        per_cycle[key] = value
    threads = int(_req_float(row, "threads_per_core"))
    if threads not in (1, 2, 4, 8):
        raise _RowError("threads_per_core", f"must be 1, 2, 4 or 8, got {threads}")
    return Cpu(
        model=_req_str(row, "cpu_model"),
        vendor=_req_str(row, "vendor"),
        microarchitecture=(row.get("microarchitecture") or "").strip(),
        isa=_req_str(row, "isa"),
        cores_per_socket=int(_req_float(row, "cores_per_socket")),
        threads_per_core=threads,
        all_core_ghz=ghz,
        fp32_flops_per_cycle_per_core=per_cycle["fp32_flops_per_cycle_per_core"],
        bf16_flops_per_cycle_per_core=per_cycle["bf16_flops_per_cycle_per_core"],
        fp16_flops_per_cycle_per_core=per_cycle["fp16_flops_per_cycle_per_core"],
        mem_bw_gb_s_per_socket=_req_float(row, "mem_bw_gb_s_per_socket"),
        source=row["source"].strip(),
        as_of=row["as_of"].strip(),
    )


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

CLOUD_COLUMNS = ("cloud", "billing_increment_s", "billing_minimum_s", "startup_s", "source", "as_of")


def _load_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    with path.open(encoding="utf-8") as fh:
        # libyaml's safe loader where PyYAML was built with it (its wheels are): the same safe YAML, ~10x faster to
        # parse models.yaml and stacks.yaml — most of a catalog load, which every command does once
        return yaml.load(fh, Loader=SAFE_LOADER) or {}  # noqa: S506 - a safe loader


def load_catalog(data_dir: Path | str = DATA_DIR) -> Catalog:
    """Read every catalog file in ``data_dir``, validating each row."""
    d = Path(data_dir)
    accs, issues = _read_rows(d / "accelerators.csv", ACCELERATOR_COLUMNS, _build_accelerator, lambda a: a.id)
    accelerators = {a.id: a for a in accs}
    insts, inst_issues = _read_rows(
        d / "instances.csv", INSTANCE_COLUMNS, _instance_builder(accelerators), lambda i: (i.cloud, i.name)
    )
    clouds, cloud_issues = _read_rows(d / "clouds.csv", CLOUD_COLUMNS, _build_cloud, lambda c: c.cloud)
    issues += inst_issues + cloud_issues
    cloud_map = {c.cloud: c for c in clouds}
    for inst in insts:
        if inst.cloud not in cloud_map:
            issues.append(CatalogIssue("instances.csv", 0, "cloud", f"{inst.name}: cloud {inst.cloud!r} not in clouds.csv"))
    rates: list[TabularRate] = []
    if (d / "tabular_rates.csv").exists():
        rates, rate_issues = _read_rows(
            d / "tabular_rates.csv", TABULAR_RATE_COLUMNS, _build_rate, lambda r: (r.library, r.device)
        )
        issues += rate_issues
    releases: list[TabularRelease] = []
    if (d / "tabular_releases.csv").exists():
        releases, release_issues = _read_rows(d / "tabular_releases.csv", RELEASE_COLUMNS, _build_release,
                                              lambda r: (r.library, r.release))  # fmt: skip
        issues += release_issues
    grid: list[GridIntensity] = []
    if (d / "grid_intensity.csv").exists():
        grid, grid_issues = _read_rows(d / "grid_intensity.csv", GRID_COLUMNS, _build_grid, lambda g: (g.cloud, g.region))
        issues += grid_issues
    centers: list[DataCenter] = []
    if (d / "datacenters.csv").exists():
        centers, dc_issues = _read_rows(d / "datacenters.csv", DATACENTER_COLUMNS, _build_datacenter, lambda c: c.cloud)
        issues += dc_issues
    cpus: list[Cpu] = []
    if (d / "cpus.csv").exists():
        cpus, cpu_issues = _read_rows(d / "cpus.csv", CPU_COLUMNS, _build_cpu, lambda c: c.model)
        issues += cpu_issues
    models = _load_yaml(d / "models.yaml")
    assumptions = _load_yaml(d / "assumptions.yaml")
    for key, entry in assumptions.items():
        if not isinstance(entry, dict) or "value" not in entry or "source" not in entry:
            issues.append(CatalogIssue("assumptions.yaml", 0, key, "needs value and source"))
    stacks = _load_yaml(d / "stacks.yaml") if (d / "stacks.yaml").exists() else {}
    for key, entry in stacks.items():
        if not isinstance(entry, dict) or "knobs" not in entry or "sources" not in entry:
            issues.append(CatalogIssue("stacks.yaml", 0, key, "needs knobs and sources"))
    return Catalog(
        stacks=stacks,
        accelerators=accelerators,
        instances=tuple(i for i in insts if i.cloud in cloud_map),
        clouds=cloud_map,
        models=models,
        assumptions=assumptions,
        tabular_rates={(r.library, r.device): r for r in rates},
        tabular_releases={(r.library, r.release): r for r in releases},
        issues=tuple(issues),
        grid={(g.cloud, g.region): g for g in grid},
        datacenters={c.cloud: c for c in centers},
        cpus={c.model: c for c in cpus},
    )


# ----------------------------------------------------------------------------- the user's catalog

OVERLAY_FILES = ("accelerators.csv", "instances.csv", "clouds.csv")


def apply_overlay(base: Catalog, directory: Path | str) -> Catalog:
    """``base`` with the rows of a user's catalog directory added or overriding (same columns as the built-in files).

    Keys: an accelerator's id, an instance's (cloud, name), a cloud's name; a user row with the same key replaces
    the built-in one.  Unlike the built-in files (whose bad rows are reported as issues), any bad row here is an
    error naming the file, the line and the column; nothing is half-applied.
    """
    from trainplan.errors import CatalogError

    d = Path(directory)
    if not d.is_dir():
        raise CatalogError(f"catalog directory {d} does not exist (or is not a directory)", field="--catalog")
    unknown = sorted(p.name for p in d.iterdir() if p.suffix == ".csv" and p.name not in OVERLAY_FILES)
    if unknown:
        raise CatalogError(f"{d / unknown[0]}: not a catalog file; a user's catalog holds {', '.join(OVERLAY_FILES)}",
                           field="--catalog")  # fmt: skip

    def rows(name: str, columns: Iterable[str], build: Callable[[dict[str, str]], Any], key: Callable[[Any], Any]) -> list[Any]:
        path = d / name
        if not path.exists():
            return []
        try:
            items, issues = _read_rows(path, columns, build, key)
        except (UnicodeDecodeError, csv.Error) as exc:
            raise CatalogError(f"{path}: not a CSV file ({exc})", field="--catalog") from None
        if issues:
            first = issues[0]
            raise CatalogError(f"{path}:{first.line}: {first.key}: {first.message}", field="--catalog")
        return items

    origins = dict(base.origins)
    accelerators = dict(base.accelerators)
    for a in rows("accelerators.csv", ACCELERATOR_COLUMNS, _build_accelerator, lambda a: a.id):
        accelerators[a.id] = a
        origins[("accelerator", a.id)] = str(d / "accelerators.csv")
    clouds = dict(base.clouds)
    for c in rows("clouds.csv", CLOUD_COLUMNS, _build_cloud, lambda c: c.cloud):
        clouds[c.cloud] = c
        origins[("cloud", c.cloud)] = str(d / "clouds.csv")
    instances = {(i.cloud, i.name): i for i in base.instances}
    path = d / "instances.csv"
    for line, inst in enumerate(rows("instances.csv", INSTANCE_COLUMNS, _instance_builder(accelerators),
                                     lambda i: (i.cloud, i.name)), start=2):  # fmt: skip
        if inst.cloud not in clouds:
            raise CatalogError(f"{path}:{line}: cloud: {inst.cloud!r} has no billing terms; add a row for it to "
                               f"{d / 'clouds.csv'} (known: {', '.join(sorted(clouds))})", field="--catalog")  # fmt: skip
        instances[(inst.cloud, inst.name)] = inst
        origins[("instance", f"{inst.cloud}:{inst.name}")] = str(path)
    return replace(base, accelerators=accelerators, clouds=clouds, instances=tuple(instances.values()), origins=origins)
