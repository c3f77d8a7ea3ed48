"""Serial fraction of XGBoost and LightGBM from published thread scaling (szilard/GBM-perf on a c7i metal).

Reads tests/data/published_tabular_scaling.yaml (median of three runs per core count, 1-48 physical cores of one
socket), fits Amdahl's law t(p) = t(1) · (s + (1 − s)/p) by least squares on log time for each table size, and
prints s with the fit's error per core count next to the catalog's serial fraction (tabular_rates.csv, which takes
the 10M-row fit).

    python benchmarks/tabular_thread_scaling.py
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_tabular_scaling.yaml"


def amdahl_fit(cores: list[int], seconds: list[float]) -> float:
    """The serial fraction s minimising Σ (log t(1)(s + (1 − s)/p) − log t(p))²."""
    from scipy.optimize import minimize_scalar

    t1 = seconds[0]

    def loss(s: float) -> float:
        return sum((math.log(t1 * (s + (1 - s) / n)) - math.log(t)) ** 2 for n, t in zip(cores, seconds))

    return float(minimize_scalar(loss, bounds=(0.0, 1.0), method="bounded").x)


def medians(data: dict, library: str, size: str) -> list[float]:
    return [statistics.median(runs) for runs in data["seconds"][library][size]]


def main() -> None:
    from trainplan.catalog import get_catalog

    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    cores = data["cores"]
    cat = get_catalog()
    print(f"source: {data['source']}")
    for library, sizes in data["seconds"].items():
        print(f"\n{library} (catalog serial fraction {cat.tabular_rates[(library, 'cpu')].serial_fraction})")
        for size in sizes:
            med = medians(data, library, size)
            s = amdahl_fit(cores, med)
            errs = " ".join(f"{n}:{med[0] * (s + (1 - s) / n) / t - 1:+.0%}" for n, t in zip(cores, med))
            print(f"  {size:>4}M rows: s = {s:.3f}; speed-up at 16 cores {med[0] / med[cores.index(16)]:.1f}, "
                  f"at 48 {med[0] / med[-1]:.1f}; fit error by cores {errs}")  # fmt: skip


if __name__ == "__main__":
    main()
