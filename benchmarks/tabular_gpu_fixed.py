"""Fixed GPU cost per tree level (or split) of XGBoost, LightGBM and CatBoost, from GBM-perf's 2024 runs on four GPUs.

A small table costs a GPU what its kernels' launches and synchronisations cost, whatever the rows: GBM-perf's
100k-row runs (100 rounds of depth 10) take 0.65–1.4 s with XGBoost where the histogram work is milliseconds.  The
estimate adds ``gpu_fixed_us_per_step`` per step of tree growth — a level for the depth-wise XGBoost and the
symmetric CatBoost, a split for the leaf-wise LightGBM — times the rounds.  This script measures it as the median
over the GPUs of (published 0.1M-row time − predicted work) / steps, and checks it on the 1M- and 10M-row runs,
which it was not taken from (tests/data/published_tabular_gpu2024.yaml, with the source).  The same file's
m7i.8xlarge CPU rows are printed as a check of the CPU model (per-term rates and thread terms) on a run it has not
seen.

    python benchmarks/tabular_gpu_fixed.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from trainplan.catalog import find_accelerator, find_instance, get_catalog
from trainplan.estimate.hardware import hardware_for_gpu, hardware_for_instance
from trainplan.estimate.tabular import estimate_tabular, gpu_steps
from trainplan.spec import parse_job

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_tabular_gpu2024.yaml"
SHAPE = {"xgboost": {"max_depth": 10}, "catboost": {"max_depth": 10, "categorical_features": 6},
         "lightgbm": {"num_leaves": 512}}  # CatBoost takes the 6 categorical columns as they are (the data file says so)


def gpu_hardware(gpu: str, cat):  # noqa: ANN001, ANN201
    """One GPU of that kind; a card no catalog instance carries (H100 PCIe at Lambda) on an A100 instance's row —
    only the GPU's own row (its SMs, or its memory bandwidth) enters a tabular GPU estimate."""
    from dataclasses import replace

    from trainplan.errors import CatalogError

    try:
        return hardware_for_gpu(find_accelerator(gpu, cat), cat, gpus=1)
    except CatalogError:
        return replace(hardware_for_gpu(find_accelerator("A100-40GB", cat), cat, gpus=1), accelerator=cat.accelerators[gpu])


def job(library: str, millions: str):  # noqa: ANN201
    return parse_job({"kind": "tabular", "library": library, "rows": int(float(millions) * 1e6), "features": 8,
                      "trees": 100, **SHAPE[library]})  # fmt: skip


def work_s(library: str, millions: str, gpu: str, cat) -> float:  # noqa: ANN001
    """The estimate's time without the fixed cost: the work at the bandwidth-scaled rate."""
    j = job(library, millions)
    e = estimate_tabular(j, gpu_hardware(gpu, cat), cat)
    return e.time_breakdown["fit_s"] - e.time_breakdown.get("gpu_fixed_s", 0.0)


def fixed_us(data: dict, library: str, cat) -> float:  # noqa: ANN001
    first = data["rows_millions"][0]
    per_gpu = [(t[library][0] - work_s(library, first, gpu, cat)) / gpu_steps(job(library, first)) * 1e6
               for gpu, t in data["gpu"].items()]  # fmt: skip
    return statistics.median(per_gpu)


def main() -> None:
    cat = get_catalog()
    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    sizes = data["rows_millions"]
    print(f"source: {data['source']}")
    for library in ("xgboost", "lightgbm", "catboost"):
        us = fixed_us(data, library, cat)
        rate = cat.tabular_rates[(library, "gpu")]
        print(f"\n{library}: fixed {us:.0f} us per step from the {sizes[0]}M-row runs (catalog: {rate.gpu_fixed_us_per_step})")
        print(f"  {'GPU':10} {'rows':>5} {'published s':>12} {'predicted s':>12} {'err':>6} {'work only':>10}")
        held, before = [], []
        for gpu, times in data["gpu"].items():
            for size, t in zip(sizes, times[library]):
                j = job(library, size)
                e = estimate_tabular(j, gpu_hardware(gpu, cat), cat)
                work = work_s(library, size, gpu, cat)
                tag = "" if size == sizes[0] else " (held out)"
                fit = e.time_breakdown["fit_s"]
                print(f"  {gpu:10} {size:>4}M {t:12.2f} {fit:12.2f} {fit / t - 1:+6.0%} {work / t - 1:+10.0%}{tag}")
                if size != sizes[0]:
                    held.append(abs(fit / t - 1))
                    before.append(abs(work / t - 1))
        print(f"  held out (1M, 10M): median |err| {statistics.median(held):.0%}, worst {max(held):.0%}; "
              f"work only: median {statistics.median(before):.0%}, worst {max(before):.0%}")  # fmt: skip
    scaling(data, cat)
    print("\nCPU check (not used for any rate): m7i.8xlarge, 16 physical cores")
    hw = hardware_for_instance(find_instance("m7i.8xlarge", cat), cat)
    for library in ("xgboost", "lightgbm", "catboost"):
        for size, t in zip(sizes, data["cpu"]["m7i.8xlarge"][library]):
            fit = estimate_tabular(job(library, size), hw, cat).time_breakdown["fit_s"]
            print(f"  {library:9} {size:>4}M published {t:7.2f} s, predicted {fit:7.2f} s, {fit / t - 1:+.0%}")


def scaling(data: dict, cat) -> None:  # noqa: ANN001
    """What a GPU's time follows: the largest runs' time above the smallest's (nearly all fixed cost), each GPU over
    the first one's, against its SM and memory-bandwidth ratios (estimate/tabular.py gpu_ns_per_cell)."""
    gpus = list(data["gpu"])
    ref = cat.accelerators[gpus[0]]
    print(f"\nwork above the {data['rows_millions'][0]}M-row run at {data['rows_millions'][-1]}M rows, over {gpus[0]}'s "
          f"(the catalog's SM and bandwidth ratios beside it):")
    print(f"  {'GPU':10} {'xgboost':>8} {'lightgbm':>9} {'catboost':>9} {'SMs':>6} {'bandwidth':>10}")
    for gpu in gpus:
        acc = cat.accelerators[gpu]
        ratios = []
        for library in ("xgboost", "lightgbm", "catboost"):
            t, t0 = data["gpu"][gpu][library], data["gpu"][gpus[0]][library]
            ratios.append((t[-1] - t[0]) / (t0[-1] - t0[0]))
        sms = f"{ref.sm_count / acc.sm_count:6.2f}" if ref.sm_count and acc.sm_count else f"{'-':>6}"
        print(f"  {gpu:10} {ratios[0]:8.2f} {ratios[1]:9.2f} {ratios[2]:9.2f} {sms} "
              f"{ref.mem_bandwidth_gb_s / acc.mem_bandwidth_gb_s:10.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
