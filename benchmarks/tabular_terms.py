"""Measure the terms of the histogram-GBDT cost model on this machine (one thread), and check them on shapes they
were not fitted on.

Each fit is timed in two parts: the data preparation (XGBoost's DMatrix and its quantile sketch / gradient index;
LightGBM's Dataset binning) and the boosting rounds.  Per round, four terms (src/trainplan/estimate/tabular.py
``gbdt_terms``): histogram cells of dense data, histogram cells of sparse data (the stored values only), split
scans (nodes × features × bins) and row passes (rows × levels).  The rates are fitted by non-negative least
squares on relative error over grid A, with the trees' real leaf counts; grid B is then predicted as the planner
predicts it (full trees) and compared — the rates of tabular_rates.csv come from grid A of this script.

    python benchmarks/tabular_terms.py [--library xgboost|lightgbm] [--trees 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

# rows, features, density (fraction of stored cells), depth (xgboost max_depth; lightgbm num_leaves = 2^depth - 1)
GRID_A = [
    (1_000_000, 28, 1.0, 8), (200_000, 200, 1.0, 6), (200_000, 200, 0.3, 6), (200_000, 200, 0.1, 6),
    (200_000, 200, 0.02, 6), (100_000, 700, 0.016, 8), (5_000, 2000, 1.0, 6), (20_000, 4000, 0.005, 6),
    (1_000_000, 2, 1.0, 8),
]  # fmt: skip
GRID_B = [
    (500_000, 50, 1.0, 7), (300_000, 100, 0.05, 6), (50_000, 1000, 0.01, 6), (2_000_000, 10, 1.0, 6),
    (10_000, 1000, 1.0, 7), (400_000, 300, 0.2, 5),
]  # fmt: skip


def data(rows: int, features: int, density: float, seed: int = 0):
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    if density < 1:  # CSR: an absent entry is missing to XGBoost and zero to LightGBM; both skip it
        x = sp.random(rows, features, density=density, format="csr", dtype=np.float32, random_state=seed)
    else:
        x = rng.standard_normal((rows, features), dtype=np.float32)
    score = np.asarray(x @ rng.standard_normal(features).astype(np.float32)).ravel() + 0.5 * rng.standard_normal(rows)
    return x, (score > np.median(score)).astype(np.int32)


def fit(library: str, rows: int, features: int, density: float, depth: int, trees: int) -> tuple[float, float, float]:
    """(preparation s, boosting s for ``trees`` rounds, mean leaves per tree), one thread."""
    x, y = data(rows, features, density)
    t0 = time.perf_counter()
    if library == "xgboost":
        import xgboost as xgb

        dm = xgb.DMatrix(x, label=y, nthread=1)
        params = {"tree_method": "hist", "max_depth": depth, "nthread": 1, "objective": "binary:logistic"}
        xgb.train(params, dm, 1)  # builds the gradient index (kept by the DMatrix): preparation plus one round
        t1 = time.perf_counter()
        booster = xgb.train(params, dm, trees)
        t2 = time.perf_counter()
        leaves = [d.count("leaf=") for d in booster.get_dump()]
        prep = (t1 - t0) - (t2 - t1) / trees
    else:
        import lightgbm as lgb

        ds = lgb.Dataset(x, y, params={"verbose": -1, "num_threads": 1}).construct()
        t1 = time.perf_counter()
        params = {"num_leaves": 2**depth - 1, "num_threads": 1, "objective": "binary", "verbose": -1}
        booster = lgb.train(params, ds, trees)
        t2 = time.perf_counter()
        leaves = [t["num_leaves"] for t in booster.dump_model()["tree_info"]]
        prep = t1 - t0
    return prep, t2 - t1, float(np.mean(leaves))


def main() -> None:
    from scipy.optimize import nnls

    from trainplan.estimate.tabular import gbdt_terms

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", choices=("xgboost", "lightgbm"), action="append")
    ap.add_argument("--trees", type=int, default=20)
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; one thread; {args.trees} trees")
    for library in args.library or ["xgboost", "lightgbm"]:
        measured_a = [(shape, fit(library, *shape, args.trees)) for shape in GRID_A]
        terms = np.array([gbdt_terms(library, n, f, d, leaves=lv) for (n, f, d, _), (_, _, lv) in measured_a])
        per_tree = np.array([boost / args.trees for _, (_, boost, _) in measured_a])
        rates, _ = nnls(terms / per_tree[:, None], np.ones(len(per_tree)))
        nnz = np.array([n * f * d for n, f, d, _ in GRID_A])
        prep = np.array([p for _, (p, _, _) in measured_a])
        prep_ns = float(np.median(prep / nnz)) * 1e9
        print(f"\n{library}: ns per dense cell {rates[0] * 1e9:.3f}, per sparse cell {rates[1] * 1e9:.3f}, per split bin "
              f"{rates[2] * 1e9:.3f}, per row-level {rates[3] * 1e9:.3f}; preparation {prep_ns:.0f} ns per stored cell (median)")  # fmt: skip
        print(f"{'grid':5} {'rows':>9} {'feat':>5} {'dens':>6} {'depth':>5} {'leaves':>6} {'prep s':>7} {'round ms':>9} "
              f"{'model ms':>9} {'err':>6} {'fit err':>8} {'before':>7}")  # fmt: skip
        # the planner before the terms: one rate per dense histogram cell, preparation amortised in it (2026-12-02 row)
        dense_rate = {"xgboost": 2.48e-9, "lightgbm": 3.56e-9}[library]
        for grid, shapes in (("A", measured_a), ("B", [(s, fit(library, *s, args.trees)) for s in GRID_B])):
            errs, fit_errs, before_errs = [], [], []
            for (n, f, d, dep), (p, boost, lv) in shapes:
                full = 2**dep if library == "xgboost" else 2**dep - 1  # the planner assumes full trees
                model = float(np.dot(gbdt_terms(library, n, f, d, leaves=lv if grid == "A" else full), rates))
                one = dense_rate * n * f * (1 + (dep - 1) / 2)  # every cell, stored or not: density was not modelled
                m = boost / args.trees
                errs.append(abs(model / m - 1))
                fit_s, fit_model = p + boost, prep_ns * 1e-9 * n * f * d + args.trees * model
                fit_errs.append(abs(fit_model / fit_s - 1))
                before_errs.append(abs(args.trees * one / fit_s - 1))
                print(f"{grid:5} {n:>9} {f:>5} {d:>6} {dep:>5} {lv:>6.1f} {p:>7.2f} {m * 1e3:>9.1f} {model * 1e3:>9.1f} "
                      f"{model / m - 1:>+6.0%} {fit_model / fit_s - 1:>+8.0%} {args.trees * one / fit_s - 1:>+7.0%}")  # fmt: skip
            print(f"grid {grid}: per round median |err| {np.median(errs):.0%} (worst {max(errs):.0%}); whole fit "
                  f"{np.median(fit_errs):.0%} (worst {max(fit_errs):.0%}); one rate per dense cell before: "
                  f"{np.median(before_errs):.0%} (worst {max(before_errs):.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
