"""Thread scaling of XGBoost and LightGBM from published runs (szilard/GBM-perf on a c7i metal).

Reads tests/data/published_tabular_scaling.yaml (median of three runs per core count, 1-48 physical cores of one
socket) and fits the estimate's thread model (src/trainplan/estimate/tabular.py):

    t(p) = t(1) · (s + (1 − s)/p) + c · nodes · (p − 1)

s a serial fraction (Amdahl), c microseconds per tree node and thread beyond the first (the synchronisation of each
split's parallel sections), nodes = (2 · leaves − 1) · rounds.  Fitted by least squares on log time over the 10M-
and 0.1M-row curves; the 1M-row curve is held out and its error printed.  The catalog's serial_fraction and
thread_overhead_us_per_node (tabular_rates.csv) are these fits.

    python benchmarks/tabular_thread_scaling.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import yaml

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_tabular_scaling.yaml"
FIT_ON, HELD_OUT = ("10", "0.1"), "1"
# the published runs' trees: XGBoost depth 10 (GBM-perf's setting), LightGBM num_leaves 512 (run/lightgbm.R); 100 rounds
NODES = {"xgboost": (2 * 2**10 - 1) * 100, "lightgbm": (2 * 512 - 1) * 100}


def medians(data: dict, library: str, size: str) -> np.ndarray:
    return np.array([statistics.median(runs) for runs in data["seconds"][library][size]])


def model(t1: float, cores: np.ndarray, s: float, c_us: float, nodes: int) -> np.ndarray:
    return t1 * (s + (1 - s) / cores) + c_us * 1e-6 * nodes * (cores - 1)


def fit(data: dict, library: str) -> tuple[float, float]:
    """(s, c in µs per node per extra thread) minimising the squared log error over the FIT_ON curves."""
    from scipy.optimize import minimize

    cores = np.array(data["cores"], dtype=float)

    def loss(x: np.ndarray) -> float:
        total = 0.0
        for size in FIT_ON:
            t = medians(data, library, size)
            total += float(((np.log(model(t[0], cores, x[0], x[1], NODES[library])) - np.log(t)) ** 2).sum())
        return total

    result = minimize(loss, np.array([0.1, 0.1]), bounds=[(0.0, 1.0), (0.0, 100.0)])
    return float(result.x[0]), float(result.x[1])


def main() -> None:
    from trainplan.catalog import get_catalog

    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    cores = np.array(data["cores"], dtype=float)
    cat = get_catalog()
    print(f"source: {data['source']}\nfitted on the {', '.join(FIT_ON)}M-row curves; {HELD_OUT}M held out")
    for library in data["seconds"]:
        s, c = fit(data, library)
        rate = cat.tabular_rates[(library, "cpu")]
        print(f"\n{library}: s = {s:.3f}, c = {c:.3f} us per node per extra thread (catalog: {rate.serial_fraction}, "
              f"{rate.thread_overhead_us_per_node})")  # fmt: skip
        for size in data["seconds"][library]:
            t = medians(data, library, size)
            err = model(t[0], cores, s, c, NODES[library]) / t - 1
            amdahl = t[0] * (s + (1 - s) / cores) / t - 1
            tag = " (held out)" if size == HELD_OUT else ""
            print(f"  {size:>4}M{tag:11}: median |err| {np.median(np.abs(err)):.0%}, worst {err[np.argmax(np.abs(err))]:+.0%}"
                  f" (without c: median {np.median(np.abs(amdahl)):.0%}, worst {amdahl[np.argmax(np.abs(amdahl))]:+.0%});"
                  f" speed-up at 16 cores {t[0] / t[data['cores'].index(16)]:.1f}, at 48 {t[0] / t[-1]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
