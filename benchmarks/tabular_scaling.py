"""Parallel cross-validation on all cores against one core, per library.

Trains the same k-fold job three ways with trainplan's tabular workload:

* **1 core** — one fit at a time, one library thread;
* **all cores** — trainplan's split: min(folds, cores) fits at once, each with
  cores // fits library threads (what ``trainplan run`` does);
* **oversubscribed** — every fold at once, each with all cores as threads
  (what you get by wrapping a default-threaded library in joblib).

Printed: wall seconds of each (best of ``--repeat``, default 2: the first fit
in a process also pays the library's import and warm-up, which once made
XGBoost look 2.8× faster on 2 cores), and the speed-up of "all cores" over
one core.  Wall time includes generating the data.

    python benchmarks/tabular_scaling.py
    python benchmarks/tabular_scaling.py --rows 200000 --features 40 --trees 200 --folds 5
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainplan.measure.probe import usable_cores
from trainplan.run.workloads.tabular import parallelism, train_tabular
from trainplan.spec import parse_job

LIBRARIES = ("xgboost", "lightgbm", "sklearn-hgb", "sklearn-rf")


def _wall(job, parallel: int, threads: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = train_tabular(
            job, out_dir=Path(tmp), parallel_fits=parallel, threads_per_fit=threads,
            write_metrics=lambda record: None, stop=threading.Event(),
        )
        return time.perf_counter() - start, result["measured"]["final_loss"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument("--libraries", nargs="*", default=list(LIBRARIES))
    parser.add_argument("--repeat", type=int, default=2, help="best of N, interleaved (the first pays warm-up)")
    args = parser.parse_args()
    cores = usable_cores()
    parallel, threads = parallelism(args.folds, cores)
    print(
        f"machine: {cores} cores; data: {args.rows} rows × {args.features} features (synthetic, binary), "
        f"{args.trees} trees, max_depth 6, {args.folds}-fold CV; all cores = {parallel} fits × {threads} threads"
    )
    print(f"{'library':<12} {'1 core s':>9} {'all cores s':>12} {'speed-up':>9} {'oversub. s':>11} {'loss':>8}")
    for library in args.libraries:
        job = parse_job(
            {"kind": "tabular", "library": library, "data": "synthetic", "rows": args.rows, "features": args.features,
             "trees": args.trees, "max_depth": 6, "cv_folds": args.folds, "seed": 0}
        )
        one = alls = over = float("inf")
        for _ in range(args.repeat):  # interleaved, best of N
            t, loss = _wall(job, 1, 1)
            one = min(one, t)
            alls = min(alls, _wall(job, parallel, threads)[0])
            over = min(over, _wall(job, args.folds, cores)[0])
        print(f"{library:<12} {one:>9.2f} {alls:>12.2f} {one / alls:>8.2f}× {over:>11.2f} {loss:>8.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
