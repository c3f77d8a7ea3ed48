"""Import SkyPilot's catalog (``~/.sky/catalogs/vN/<cloud>/vms.csv``) into the user's catalog directory.

SkyPilot prices 20+ clouds in one format — one row per instance type and region (and zone on some clouds):
``InstanceType, AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB, Price, SpotPrice, Region[, AvailabilityZone],
GpuInfo`` (its ``catalogs/v7/<cloud>/vms.csv`` files, github.com/skypilot-org/skypilot-catalog).  trainplan keys an
instance by (cloud, name), so each instance type is imported once, at its cheapest region, with the number of regions
it is offered in said in its ``source``.  What SkyPilot's files do not carry is said too: the GPU interconnect is
borrowed from a built-in instance with the same GPUs (8×H100 → NVSwitch) or left unknown, and a new cloud's billing
terms are an assumption the user should edit.

Rows are skipped, and counted by reason, when trainplan cannot plan them: no price, a GPU trainplan has no datasheet
row for (add it to the user's ``accelerators.csv`` under SkyPilot's name or trainplan's id), or — GCP's GPU machine
types — the GPU is not on the instance's row; instance types already built in keep their richer built-in row.
Nothing the user wrote is replaced: an instance or cloud already in the user's files keeps the user's row.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from trainplan.catalog.loader import CLOUD_COLUMNS, INSTANCE_COLUMNS, Catalog
from trainplan.errors import CatalogError

SKYPILOT_COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB", "Price", "Region")

# SkyPilot's accelerator names (its catalogs/v7/common/accelerators.csv) → trainplan's accelerator ids, where they
# differ; a SkyPilot name equal to an id of the catalog (T4, L4, A10G, H200, RTX4090 …) needs no entry.
SKYPILOT_NAMES = {
    "A100": "A100-40GB",
    "A100-80GB": "A100-80GB",
    "H100": "H100-80GB",
    "H100-SXM": "H100-80GB",
    "V100": "V100-16GB",
    "V100-32GB": "V100-32GB",
}


def default_source() -> Path:
    """Where SkyPilot keeps its catalog: the newest ``~/.sky/catalogs/vN`` (or ``$SKYPILOT_CATALOG``)."""
    env = os.environ.get("SKYPILOT_CATALOG")
    if env:
        return Path(env).expanduser()
    root = Path.home() / ".sky" / "catalogs"
    versions = sorted((p for p in root.glob("v*") if p.is_dir() and p.name[1:].isdigit()), key=lambda p: int(p.name[1:]))
    return versions[-1] if versions else root


@dataclass
class ImportResult:
    """What an import read, wrote and skipped."""

    files: list[Path] = field(default_factory=list)
    instances: int = 0  # written
    clouds: list[str] = field(default_factory=list)  # new clouds written to clouds.csv
    kept: int = 0  # already in the user's instances.csv: the user's row stays
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows


@dataclass
class _Offer:
    row: dict[str, str]
    price: float
    spot: float | None
    regions: set[str]
    file: Path


def _num(value: str | None) -> float | None:
    try:
        x = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return x if x is not None and x == x else None  # NaN -> None


def _vms_files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    return sorted(source.glob("*/vms.csv"))


def _read(path: Path) -> list[dict[str, str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CatalogError(f"{path}: not a SkyPilot vms.csv (not UTF-8 text)", field="import-skypilot") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in SKYPILOT_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise CatalogError(f"{path}:1: {missing[0]}: column missing; not a SkyPilot vms.csv (it has {', '.join(SKYPILOT_COLUMNS)} "
                           "…)", field="import-skypilot")  # fmt: skip
    return list(reader)


def _interconnect(catalog: Catalog, accelerator: str, count: int) -> tuple[str, float | None, str]:
    """The interconnect of a built-in instance with the same GPUs, or unknown."""
    if count <= 1:
        return "none", None, ""
    for inst in catalog.instances:
        if inst.accelerator == accelerator and inst.accelerator_count == count and inst.intra_node_bw_gb_s:
            return inst.interconnect, inst.intra_node_bw_gb_s, f"; interconnect as built-in {inst.cloud}:{inst.name}"
    return "pcie", None, "; interconnect not in SkyPilot's catalog (PCIe assumed)"


def import_skypilot(source: Path, target: Path, catalog: Catalog, *, today: str | None = None) -> ImportResult:
    """Read SkyPilot's ``vms.csv`` files under ``source`` and add their instances to ``target``'s catalog files."""
    files = _vms_files(source)
    if not files:
        raise CatalogError(f"no SkyPilot catalog at {source} (looked for {source}/<cloud>/vms.csv); run `sky check` or "
                           "`sky show-gpus` once to download it, or name the directory: trainplan catalog import-skypilot DIR",
                           field="import-skypilot")  # fmt: skip
    as_of = today or date.today().isoformat()
    result = ImportResult(files=files)
    offers: dict[tuple[str, str], _Offer] = {}

    def skip(reason: str) -> None:
        result.skipped[reason] = result.skipped.get(reason, 0) + 1

    for path in files:
        cloud = path.parent.name.lower()
        for row in _read(path):
            name = (row.get("InstanceType") or "").strip()
            price = _num(row.get("Price"))
            if not name:
                skip("no instance type (a GPU priced apart from its machine, GCP)")
                continue
            if price is None or price <= 0:
                skip("no on-demand price")
                continue
            sky_acc = (row.get("AcceleratorName") or "").strip()
            acc = SKYPILOT_NAMES.get(sky_acc, sky_acc) if sky_acc else ""
            if acc and acc not in catalog.accelerators:
                skip(f"GPU {sky_acc} has no accelerators.csv row")
                continue
            if not acc and cloud == "gcp" and name.split("-")[0] in ("a2", "a3", "a4", "g2"):
                skip("no instance type (a GPU priced apart from its machine, GCP)")
                continue
            key = (cloud, name)
            spot = _num(row.get("SpotPrice"))
            region = (row.get("Region") or "").strip()
            have = offers.get(key)
            if have is None or price < have.price:
                offers[key] = _Offer(row, price, spot, (have.regions if have else set()) | {region}, path)
            else:
                have.regions.add(region)

    user_instances = target / "instances.csv"
    user_clouds = target / "clouds.csv"
    existing = _rows(user_instances)
    mine = {(r["cloud"], r["instance"]) for r in existing}
    from trainplan.catalog import builtin_catalog

    built_in = {(i.cloud, i.name) for i in builtin_catalog().instances}
    new_rows = []
    for (cloud, name), offer in sorted(offers.items()):
        if (cloud, name) in mine:
            result.kept += 1
            continue
        if (cloud, name) in built_in:  # its built-in row says more (network, CPU model, sources); override by hand
            skip("already in the built-in catalog")
            continue
        row = offer.row
        sky_acc = (row.get("AcceleratorName") or "").strip()
        acc = SKYPILOT_NAMES.get(sky_acc, sky_acc) if sky_acc else ""
        count = int(_num(row.get("AcceleratorCount")) or 0) if acc else 0
        link, bw, link_note = _interconnect(catalog, acc, count) if acc else ("none", None, "")
        spot = offer.spot if offer.spot is not None and 0 < offer.spot <= offer.price else None
        new_rows.append({
            "cloud": cloud, "instance": name, "region": (row.get("Region") or "").strip(),
            "vcpus": f"{int(_num(row.get('vCPUs')) or 0)}", "ram_gib": f"{_num(row.get('MemoryGiB')) or 0:g}",
            "accelerator": acc, "accelerator_count": str(count) if acc else "", "interconnect": link,
            "intra_node_bw_gb_s": f"{bw:g}" if bw else "", "network_gbps": "", "price_usd_per_h": f"{offer.price:g}",
            "spot_price_usd_per_h": f"{spot:g}" if spot is not None else "", "cpu_model": "",
            "source": f"SkyPilot catalog {offer.file}: the cheapest of {len(offer.regions)} region(s) listed{link_note}",
            "as_of": as_of,
        })  # fmt: skip
    known_clouds = set(catalog.clouds) | {r["cloud"] for r in _rows(user_clouds)}
    cloud_rows = []
    for cloud in sorted({r["cloud"] for r in new_rows} - known_clouds):
        cloud_rows.append({"cloud": cloud, "billing_increment_s": "1", "billing_minimum_s": "0",
                           "startup_s": f"{catalog.clouds['aws'].startup_s:g}" if "aws" in catalog.clouds else "240",
                           "source": "ASSUMED by trainplan catalog import-skypilot (SkyPilot's catalog has no billing terms): "
                                     "per-second billing, no minimum, start-up as AWS's estimate; edit for your provider",
                           "as_of": as_of})  # fmt: skip
        result.clouds.append(cloud)
    result.instances = len(new_rows)
    target.mkdir(parents=True, exist_ok=True)
    if cloud_rows:
        _write(user_clouds, CLOUD_COLUMNS, _rows(user_clouds) + cloud_rows)
    if new_rows:
        _write(user_instances, (*INSTANCE_COLUMNS, "cpu_model"), existing + new_rows)
    return result


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        return [{k: v or "" for k, v in r.items() if k} for r in csv.DictReader(fh)]


def _write(path: Path, columns: tuple[str, ...], rows: list[dict[str, str]]) -> None:
    """Atomically: a temporary file in the same directory, then the rename (the old file is whole until then).
    Columns of the user's file that trainplan does not know are kept."""
    header = list(dict.fromkeys([*columns, *(k for r in rows for k in r)]))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=header, restval="")
            w.writeheader()
            w.writerows(rows)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
