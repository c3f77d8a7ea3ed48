"""Thread scaling of XGBoost, LightGBM and CatBoost from published runs (szilard/GBM-perf on a c7i and a c5 metal).

Reads tests/data/published_tabular_scaling.yaml (median of three runs per core count, 1-48 physical cores of one
socket) and fits the estimate's thread model (src/trainplan/estimate/tabular.py):

    t(p) = t(1) · (s + (1 − s)/p) + c · nodes · (p − 1)

s a serial fraction (Amdahl), c microseconds per tree node and thread beyond the first (the synchronisation of each
split's parallel sections), nodes = (2 · leaves − 1) · rounds.  Fitted by least squares on log time over the 10M-
and 0.1M-row curves; the 1M-row curve is held out and its error printed.  The catalog's serial_fraction and
thread_overhead_us_per_node (tabular_rates.csv) are these fits.  CatBoost's come the same way from the c5.metal file
(tests/data/published_tabular_scaling_c5.yaml, 1-24 cores), fitted on its 10M- and 0.1M-row curves with the 1M curve
held out, as for the c7i file (the 10M curve has no 1-core time: the model passes through its first measured point,
2 cores); that file's XGBoost and LightGBM curves are predicted with the c7i fits, a check on another CPU that no
fit saw.

    python benchmarks/tabular_thread_scaling.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import yaml

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_tabular_scaling.yaml"
DATA_C5 = DATA.with_name("published_tabular_scaling_c5.yaml")
FIT_ON, HELD_OUT = ("10", "0.1"), "1"
FIT_ON_C5, HELD_OUT_C5 = ("10", "0.1"), "1"
# the published runs' trees: XGBoost depth 10 (GBM-perf's setting), LightGBM num_leaves 512 (run/lightgbm.R), CatBoost
# depth 10 (run/catboost.R: 2^10 leaves, counted as the estimate counts a tree's nodes); 100 rounds
NODES = {"xgboost": (2 * 2**10 - 1) * 100, "lightgbm": (2 * 512 - 1) * 100, "catboost": (2 * 2**10 - 1) * 100}


def medians(data: dict, library: str, size: str) -> np.ndarray:
    """Median of the runs per core count (nan where the source has no run)."""
    return np.array([statistics.median(runs) if runs else np.nan for runs in data["seconds"][library][size]])


def model(t1: float, cores: np.ndarray, s: float, c_us: float, nodes: int) -> np.ndarray:
    return t1 * (s + (1 - s) / cores) + c_us * 1e-6 * nodes * (cores - 1)


def predict(t: np.ndarray, cores: np.ndarray, s: float, c_us: float, nodes: int) -> np.ndarray:
    """The model through the curve's first measured point: t(1) solved from it (the 1-core time itself when given)."""
    i = int(np.flatnonzero(~np.isnan(t))[0])
    t1 = (t[i] - c_us * 1e-6 * nodes * (cores[i] - 1)) / (s + (1 - s) / cores[i])
    return model(t1, cores, s, c_us, nodes)


def fit(data: dict, library: str, fit_on: tuple[str, ...] = FIT_ON) -> tuple[float, float]:
    """(s, c in µs per node per extra thread) minimising the squared log error over the ``fit_on`` curves."""
    from scipy.optimize import minimize

    cores = np.array(data["cores"], dtype=float)

    def loss(x: np.ndarray) -> float:
        total = 0.0
        for size in fit_on:
            t = medians(data, library, size)
            ok = ~np.isnan(t)
            total += float(((np.log(predict(t, cores, x[0], x[1], NODES[library])[ok]) - np.log(t[ok])) ** 2).sum())
        return total

    result = minimize(loss, np.array([0.1, 0.1]), bounds=[(0.0, 1.0), (0.0, 100.0)])
    return float(result.x[0]), float(result.x[1])


def report(data: dict, library: str, s: float, c: float, held_out: str | None) -> None:
    """Each curve's error against the model with (s, c), and with s alone."""
    cores = np.array(data["cores"], dtype=float)
    for size in data["seconds"][library]:
        t = medians(data, library, size)
        ok = ~np.isnan(t)
        err = (predict(t, cores, s, c, NODES[library]) / t - 1)[ok]
        amdahl = (predict(t, cores, s, 0.0, 0) / t - 1)[ok]
        tag = " (held out)" if size == held_out else ""
        base = int(cores[ok][0])
        speedups = ", ".join(f"at {n} {t[ok][0] / t[data['cores'].index(n)]:.1f}" for n in (16, data["cores"][-1]))
        print(f"  {size:>4}M{tag:11}: median |err| {np.median(np.abs(err)):.0%}, worst {err[np.argmax(np.abs(err))]:+.0%}"
              f" (without c: median {np.median(np.abs(amdahl)):.0%}, worst {amdahl[np.argmax(np.abs(amdahl))]:+.0%});"
              f" speed-up over {base} core{'s' if base > 1 else ''} {speedups}")  # fmt: skip


def main() -> None:
    from trainplan.catalog import get_catalog

    data = yaml.safe_load(DATA.read_text(encoding="utf-8"))
    cat = get_catalog()
    print(f"source: {data['source']}\nfitted on the {', '.join(FIT_ON)}M-row curves; {HELD_OUT}M held out")
    fits = {}
    for library in data["seconds"]:
        s, c = fits[library] = fit(data, library)
        rate = cat.tabular_rates[(library, "cpu")]
        print(f"\n{library}: s = {s:.3f}, c = {c:.3f} us per node per extra thread (catalog: {rate.serial_fraction}, "
              f"{rate.thread_overhead_us_per_node})")  # fmt: skip
        report(data, library, s, c, HELD_OUT)
    c5 = yaml.safe_load(DATA_C5.read_text(encoding="utf-8"))
    print(f"\nsource: {c5['source']}\ncatboost fitted on the {', '.join(FIT_ON_C5)}M-row curves, {HELD_OUT_C5}M held out;"
          " xgboost and lightgbm: the c7i fits above, every curve out of sample")  # fmt: skip
    s, c = fit(c5, "catboost", FIT_ON_C5)
    rate = cat.tabular_rates[("catboost", "cpu")]
    print(f"\ncatboost: s = {s:.3f}, c = {c:.3f} us per node per extra thread (catalog: {rate.serial_fraction}, "
          f"{rate.thread_overhead_us_per_node})")  # fmt: skip
    report(c5, "catboost", s, c, HELD_OUT_C5)
    for library in ("xgboost", "lightgbm"):
        print(f"\n{library} with the c7i fit (s = {fits[library][0]:.3f}, c = {fits[library][1]:.3f}):")
        report(c5, library, *fits[library], None)


if __name__ == "__main__":
    main()
