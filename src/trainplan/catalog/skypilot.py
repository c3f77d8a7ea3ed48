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
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from trainplan.catalog.loader import CLOUD_COLUMNS, INSTANCE_COLUMNS, Catalog
from trainplan.errors import CatalogError
from trainplan.files import write_text_atomic

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
    "A6000": "RTXA6000",  # Lambda's and Fluidstack's name for the RTX A6000 (RunPod's "RTXA6000" is the id itself)
    "RTX6000-Ada": "RTX6000Ada",  # RunPod's
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
    try:
        reader = csv.DictReader(io.StringIO(text))
        missing = [c for c in SKYPILOT_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CatalogError(f"{path}:1: {missing[0]}: column missing; not a SkyPilot vms.csv (it has "
                               f"{', '.join(SKYPILOT_COLUMNS)} …)", field="import-skypilot")  # fmt: skip
        return list(reader)
    except csv.Error as exc:  # a NUL byte, a damaged quote
        raise CatalogError(f"{path}: not a SkyPilot vms.csv ({exc})", field="import-skypilot") from None


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
    user_cloud_rows = _rows(user_clouds)
    known_clouds = set(catalog.clouds) | {r["cloud"] for r in user_cloud_rows}
    cloud_rows = []
    for cloud in sorted({r["cloud"] for r in new_rows} - known_clouds):
        cloud_rows.append({"cloud": cloud, "billing_increment_s": "1", "billing_minimum_s": "0",
                           "startup_s": f"{catalog.clouds['aws'].startup_s:g}" if "aws" in catalog.clouds else "240",
                           "source": "ASSUMED by trainplan catalog import-skypilot (SkyPilot's catalog has no billing terms): "
                                     "per-second billing, no minimum, start-up as AWS's estimate; edit for your provider",
                           "as_of": as_of})  # fmt: skip
        result.clouds.append(cloud)
    result.instances = len(new_rows)
    texts = {}
    if cloud_rows:
        texts["clouds.csv"] = _csv_text(CLOUD_COLUMNS, user_cloud_rows + cloud_rows)
    if new_rows:
        texts["instances.csv"] = _csv_text((*INSTANCE_COLUMNS, "cpu_model"), existing + new_rows)
    _check_then_write(target, texts)
    return result


def _rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as fh:
        return [{k: v or "" for k, v in r.items() if k} for r in csv.DictReader(fh)]


def _csv_text(columns: tuple[str, ...], rows: list[dict[str, str]]) -> str:
    """The rows as CSV; columns of the user's file that trainplan does not know are kept."""
    header = list(dict.fromkeys([*columns, *(k for r in rows for k in r)]))
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=header, restval="", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def _check_then_write(target: Path, texts: dict[str, str]) -> None:
    """Load the user's catalog as it would be after the import, with every check a user's catalog gets, and only
    then replace its files (each atomically): a row trainplan would refuse leaves the directory as it was."""
    from trainplan.catalog import builtin_catalog
    from trainplan.catalog.loader import OVERLAY_FILES, apply_overlay

    if not texts:
        return
    with tempfile.TemporaryDirectory() as tmp:
        for name in OVERLAY_FILES:
            if (target / name).exists():
                shutil.copyfile(target / name, Path(tmp) / name)
        for name, text in texts.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        try:
            apply_overlay(builtin_catalog(), tmp)
        except CatalogError as exc:
            raise CatalogError(f"the import would leave a catalog trainplan refuses, so nothing was written: "
                               f"{str(exc).replace(tmp, str(target))}", field="import-skypilot") from None  # fmt: skip
    for name, text in texts.items():
        write_text_atomic(target / name, text)
