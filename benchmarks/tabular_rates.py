"""Measure the per-core work rates of tabular libraries on this machine.

Prints, for each library, the nanoseconds per unit of work ("cell", defined in
src/trainplan/estimate/tabular.py) on one core and on all cores, and the Amdahl
serial fraction implied by the two.  These are the figures behind the CPU rows
of src/trainplan/catalog/data/tabular_rates.csv for CatBoost and scikit-learn; XGBoost's and LightGBM's rows hold
the per-term rates of benchmarks/tabular_terms.py (the one rate per dense cell printed here is their older unit).

    python benchmarks/tabular_rates.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

from trainplan.estimate.tabular import forest_cells, gbdt_cells, linear_cells, oblivious_cells


def _data(rows: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, features), dtype=np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] + rng.standard_normal(rows) > 0).astype(np.int32)
    return x, y


def _fit(lib: str, x: np.ndarray, y: np.ndarray, threads: int, trees: int, depth: int) -> float:
    t0 = time.perf_counter()
    if lib == "xgboost":
        import xgboost as xgb

        d = xgb.DMatrix(x, label=y, nthread=threads)
        params = {"tree_method": "hist", "max_depth": depth, "nthread": threads, "objective": "binary:logistic"}
        xgb.train(params, d, trees)
    elif lib == "lightgbm":
        import lightgbm as lgb

        params = {"num_leaves": 2**depth - 1, "num_threads": threads, "objective": "binary", "verbose": -1}
        lgb.train(params, lgb.Dataset(x, y), trees)
    elif lib == "catboost":
        import catboost

        catboost.CatBoostClassifier(iterations=trees, depth=depth, thread_count=threads, border_count=254,
                                    allow_writing_files=False, verbose=False).fit(x, y)  # fmt: skip
    else:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(threads):
            if lib == "sklearn-hgb":
                from sklearn.ensemble import HistGradientBoostingClassifier

                HistGradientBoostingClassifier(max_iter=trees, max_depth=depth, max_leaf_nodes=None, early_stopping=False).fit(x, y)
            elif lib == "sklearn-rf":
                from sklearn.ensemble import RandomForestClassifier

                RandomForestClassifier(n_estimators=trees, max_depth=depth, n_jobs=threads).fit(x, y)
            else:
                from sklearn.linear_model import LogisticRegression

                LogisticRegression(max_iter=100, tol=1e-12).fit(x, y)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--features", type=int, default=28)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    x, y = _data(args.rows, args.features)
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores; rows={args.rows} features={args.features}")
    print(f"{'library':14} {'cells':>10} {'1-core s':>9} {'all s':>8} {'ns/cell/core':>13} {'serial':>7}")
    for lib, trees, depth in (("xgboost", 50, 8), ("lightgbm", 50, 8), ("catboost", 50, 8), ("sklearn-hgb", 50, 8),
                              ("sklearn-rf", 4, 10), ("sklearn-linear", 0, 0)):  # fmt: skip
        if lib == "catboost":
            cells = oblivious_cells(rows=args.rows, features=args.features, depth=depth, trees=trees)
        elif lib in ("xgboost", "lightgbm", "sklearn-hgb"):
            cells = gbdt_cells(rows=args.rows, features=args.features, depth=depth, trees=trees)
        elif lib == "sklearn-rf":
            cells = forest_cells(rows=args.rows, features=args.features, depth=depth, trees=trees)
        else:
            cells = linear_cells(rows=args.rows, features=args.features, iterations=100)
        t1 = _fit(lib, x, y, 1, trees, depth)
        tn = _fit(lib, x, y, cores, trees, depth) if cores > 1 else t1
        speedup = t1 / tn
        serial = (cores / speedup - 1) / (cores - 1) if cores > 1 else 0.0
        print(f"{lib:14} {cells:10.3g} {t1:9.2f} {tn:8.2f} {t1 / cells * 1e9:13.3f} {max(0.0, serial):7.3f}")


if __name__ == "__main__":
    main()
