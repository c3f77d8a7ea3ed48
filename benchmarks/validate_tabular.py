"""Published GBDT training times and GPU memory against trainplan's tabular estimator.

    python benchmarks/validate_tabular.py

Reads tests/data/published_tabular.yaml (LightGBM's and XGBoost's docs, szilard/GBM-perf; sources and caveats in
docs/validation-sources.md section 3), builds each run as a job (its rows, features, trees, depth or leaves) on the
hardware it names — CPU runs on as many physical cores as the threads they used, GPU runs on the catalog's row
(consumer Pascal cards from NVIDIA's product pages) — and prints the predicted training time against the published
one as a factor (predicted / measured), and the GPU memory where the source printed it. Left out, with the reason
printed: XGBoost's ``exact`` method (trainplan plans ``hist``) and the comparison page's 2017 runs, whose library
masters are older than any release trainplan measured (the page's 2020 update re-ran them; those rows name their
releases, ``library_version``, priced by tabular_releases.csv). The default rates are used (no calibration from this
machine's runs). ``--no-releases`` prices every run at the rates' own releases (the comparison before
``library_version``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from trainplan.catalog import get_catalog
from trainplan.estimate.hardware import Layout, hardware_for_gpu
from trainplan.estimate.memory import GIB
from trainplan.estimate.tabular import estimate_tabular, gpu_memory_bytes
from trainplan.planner.local import local_cpu_hardware
from trainplan.spec import parse_job

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_tabular.yaml"
# frozen 2026-12-07 before any prediction of it: 2022-2025 releases, never used to choose a change (issue 20)
HELDOUT = DATA.with_name("published_tabular_heldout.yaml")
# Pascal consumer cards the sources used, from NVIDIA's GeForce GTX 1080 Ti / 1080 specification pages:
# 11 GB GDDR5X at 484 GB/s, 8 GB GDDR5X at 320 GB/s (their compute peaks do not enter the tabular estimate), and
# their SMs: 3,584 and 2,560 CUDA cores / 128 per Pascal SM = 28 and 20
PASCAL = {"GTX1080Ti": (11.0, 484.0, 28), "GTX1080": (8.0, 320.0, 20)}


def job_of(rec: dict, *, releases: bool = True) -> object:
    fields = {"kind": "tabular", "name": rec["id"], "library": rec["library"], "rows": rec["rows"],
              "features": rec["features"], "trees": rec.get("trees") or 100, "cv_folds": 1,
              "learning_rate": rec.get("learning_rate", 0.1)}  # fmt: skip
    if rec.get("max_depth"):
        fields["max_depth"] = rec["max_depth"]
    if rec.get("num_leaves"):
        fields["num_leaves"] = rec["num_leaves"]
    if rec.get("density"):
        fields["density"] = rec["density"]
    if releases and rec.get("library_version"):
        fields["library_version"] = rec["library_version"]
    if rec.get("max_bin"):
        fields["max_bins"] = rec["max_bin"]
    elif "max_bin 63" in str(rec.get("algorithm")):
        fields["max_bins"] = 63
    return parse_job(fields)


def hardware_of(rec: dict, cat):  # noqa: ANN001, ANN201
    h = rec["hardware"]
    if h["kind"] == "cpu":
        hw = local_cpu_hardware(int(h["threads"]))
        machines = int(h.get("machines") or 1)
        if machines > 1:  # LightGBM's data-parallel runs: the machines on the network the record names
            gbps = float(str(h["network"]).split("Gbps")[0].split()[-1])
            hw = replace(hw, layout=Layout(1, machines), network_gbps=gbps)
        return hw
    acc_id = h["accelerator"]
    if acc_id in cat.accelerators:
        return hardware_for_gpu(cat.accelerators[acc_id], cat, gpus=int(h.get("gpus") or 1))
    memory, bandwidth, sms = PASCAL[acc_id]  # a card no catalog instance carries: a V100 machine with that card in it
    hw = hardware_for_gpu(cat.accelerators["V100-16GB"], cat, gpus=1)
    return replace(hw, accelerator=replace(hw.accelerator, id=acc_id, memory_gib=memory, mem_bandwidth_gb_s=bandwidth,
                                           sm_count=sms))


def factors_off(factors: list[float]) -> list[float]:
    """Each predicted / measured factor as how far off it is either way (x2 for 0.5 and for 2)."""
    return [math.exp(abs(math.log(f))) for f in factors]


def skip_reason(rec: dict) -> str | None:
    if rec.get("algorithm") == "exact":
        return "xgboost exact: trainplan plans hist"
    if rec.get("superseded_by"):
        return f"2017 masters, older than any measured release; re-run in 2020 as {rec['superseded_by']}"
    return None


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-releases", action="store_true", help="price every run at the rates' own library release")
    args = ap.parse_args()
    cat = get_catalog()
    rows = yaml.safe_load(DATA.read_text())
    factors: list[float] = []
    memory: list[tuple[str, float, float]] = []
    scaling: dict[int, tuple[float, float]] = {}  # machines -> (published s, predicted s) of the data-parallel runs
    timed: dict[str, tuple[float, float]] = {}  # id -> (published s, predicted s)
    print(f"{'record':46} {'hardware':12} {'published s':>12} {'predicted s':>12} {'factor':>7}")
    for rec in rows:
        why = skip_reason(rec)
        if why:
            print(f"{rec['id']:46} skipped: {why}")
            continue
        job, hw = job_of(rec, releases=not args.no_releases), hardware_of(rec, cat)
        m = rec["measured"]
        if "gpu_memory_mb" in m:
            predicted = gpu_memory_bytes(job, cat).peak / 2**20
            memory.append((rec["id"], predicted, float(m["gpu_memory_mb"])))
            continue
        published = float(m["train_s"]) if "train_s" in m else float(m["time_per_tree_s"]) * job.trees
        e = estimate_tabular(job, hw, cat)
        predicted = e.train_s
        factor = predicted / published
        factors.append(factor)
        timed[rec["id"]] = (published, predicted)
        where = rec["hardware"].get("accelerator") or f"{rec['hardware']['threads']} threads"
        if "tree_learner=data" in str(rec.get("algorithm")):
            machines = int(rec["hardware"].get("machines") or 1)
            scaling[machines] = (published, predicted)
            where = f"{machines}x{rec['hardware']['threads']} threads"
        print(f"{rec['id']:46} {where:12} {published:12.1f} {predicted:12.1f} {factor:7.2f}")
    off = factors_off(factors)
    print(f"\ntime: {len(factors)} runs, median factor off x{statistics.median(off):.2f} (median predicted/measured "
          f"{statistics.median(factors):.2f}), worst x{max(off):.2f}, within x1.25: {sum(o <= 1.25 for o in off)}")  # fmt: skip
    if 1 in scaling:
        base_pub, base_pred = scaling[1]
        print("data-parallel speed-up over one machine (LightGBM, Criteo), published / predicted: " + ", ".join(
            f"{m} machines {base_pub / p:.2f} / {base_pred / q:.2f}" for m, (p, q) in sorted(scaling.items()) if m > 1))
    pairs = [(k, k.replace("gbmperf2024-", "gbmperf-")) for k in timed if k.startswith("gbmperf2024-")]
    if pairs:  # the same benchmark on the same r4.8xlarge with the masters of 2019-04-29 and 2024-06-04
        print("\nrelease speed-up on one r4.8xlarge, 2019 -> 2024 masters (older time / newer), published / predicted: "
              + ", ".join(f"{k.removeprefix('gbmperf2024-cpu-airline-')} {timed[old][0] / timed[k][0]:.2f} / "
                          f"{timed[old][1] / timed[k][1]:.2f}" for k, old in pairs if old in timed))  # fmt: skip
    if memory:
        print(f"\n{'GPU memory record':46} {'published MiB':>14} {'predicted MiB':>14} {'err':>7}")
        for name, predicted, published in memory:
            print(f"{name:46} {published:14.0f} {predicted:14.0f} {(predicted - published) / published:+7.1%}")
        ctx = cat.assumption("cuda_context_gib") * GIB / 2**20
        print(f"(predicted includes the CUDA context assumption, {ctx:.0f} MiB)")
    heldout(cat, releases=not args.no_releases)


def heldout(cat, *, releases: bool) -> None:  # noqa: ANN001
    """The frozen held-out set, apart: each run's factor, or trainplan's reason for not estimating it."""
    rows = yaml.safe_load(HELDOUT.read_text())
    print(f"\nHELD OUT ({HELDOUT.name}: frozen 2026-12-07 before any prediction; no change chosen by it), {len(rows)} runs")
    print(f"{'record':50} {'hardware':14} {'published s':>12} {'predicted s':>12} {'factor':>7}")
    factors: dict[str, list[float]] = {}
    for rec in rows:
        job, hw = job_of(rec, releases=releases), hardware_of(rec, cat)
        h = rec["hardware"]
        where = f"{h['gpus']}x{h['accelerator']}" if h["kind"] == "gpu" else f"{h['threads']} cores"
        e = estimate_tabular(job, hw, cat)
        if e.rejection is not None and e.rejection.kind.value not in ("device-memory", "host-memory"):
            print(f"{rec['id']:50} {where:14} not estimated: {e.rejection.text}")
            continue
        published = float(rec["measured"]["train_s"])
        factor = e.train_s / published
        factors.setdefault(rec["library"], []).append(factor)
        print(f"{rec['id']:50} {where:14} {published:12.2f} {e.train_s:12.2f} {factor:7.2f}")
    every = [f for fs in factors.values() for f in fs]
    for library, fs in sorted(factors.items()):
        print(f"  {library:9} {len(fs):2d} runs: median factor off x{statistics.median(factors_off(fs)):.2f}, median predicted/measured "
              f"{statistics.median(fs):.2f}")  # fmt: skip
    off = factors_off(every)
    print(f"held out: {len(every)} runs, median factor off x{statistics.median(off):.2f} (median predicted/measured "
          f"{statistics.median(every):.2f}), worst x{max(off):.2f}, within x1.25: {sum(o <= 1.25 for o in off)}")  # fmt: skip


if __name__ == "__main__":
    main()
