"""Tabular runs on this machine against their prediction after `trainplan probe` (issue 20's local proof).

Measures this machine's per-core rates once (`trainplan probe --no-save --json`'s tabular figures, saved into a
profile of a temporary $TRAINPLAN_HOME), then trains a grid of synthetic XGBoost and LightGBM jobs with `trainplan
run` — shapes from 10 to 700 features, dense and sparse, depths 4 to 10, one and two threads a fit — each from a
copy of that home holding the profile alone, so no run's prediction is calibrated by an earlier run. Printed per
run: the fits' training time measured and predicted (`measured.train_s`, `predicted.train_s` of the run's summary),
and the error; then the median |error| per library and overall.

    python benchmarks/tabular_local.py                 # the whole grid (about 10 minutes on 2 cores)
    python benchmarks/tabular_local.py --library xgboost --quick
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from trainplan.measure.probe import usable_cores

# (rows, features, density, trees, depth / leaves, folds, devices): devices = parallel fits, so threads a fit =
# cores // devices; folds run min(folds, devices) at a time (trainplan run's split)
GRID = [
    (500_000, 28, 1.0, 100, 6, 1, 1),
    (1_000_000, 28, 1.0, 60, 8, 1, 1),
    (200_000, 200, 1.0, 60, 6, 1, 1),
    (2_000_000, 10, 1.0, 100, 6, 1, 1),
    (300_000, 50, 1.0, 100, 10, 1, 1),
    (100_000, 700, 0.02, 100, 6, 1, 1),
    (500_000, 28, 1.0, 100, 6, 2, 2),
    (200_000, 100, 1.0, 200, 4, 2, 2),
]
QUICK = [GRID[0], GRID[2], GRID[5], GRID[6]]


def trainplan(*args: str, home: Path) -> str:
    env = {**os.environ, "TRAINPLAN_HOME": str(home), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "trainplan.cli.main", *args], env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"trainplan {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--library", choices=["xgboost", "lightgbm"], action="append")
    ap.add_argument("--quick", action="store_true", help="four shapes instead of eight")
    args = ap.parse_args()
    libraries = args.library or ["xgboost", "lightgbm"]
    grid = QUICK if args.quick else GRID
    root = Path(tempfile.mkdtemp(prefix="tabular-local-"))
    try:
        probed = root / "probed"
        probed.mkdir()
        trainplan("probe", "--tabular", home=probed)  # saves hardware_profile.json into the temporary home
        profile = json.loads((probed / "hardware_profile.json").read_text())
        for m in profile.get("measurements", []):
            if str(m.get("name", "")).startswith("tabular_") and m.get("value") is not None:
                print(f"probe {m['name']}: {m['value']:.3g} {m.get('unit', '')} ({m.get('method', '')})")
        errors: dict[str, list[float]] = {lib: [] for lib in libraries}
        print(f"\n{'library':9} {'rows':>9} {'feat':>5} {'dens':>5} {'trees':>5} {'depth':>5} {'fits':>4} {'thr':>3}"
              f" {'measured s':>10} {'predicted s':>11} {'err':>7}")  # fmt: skip
        for lib in libraries:
            for index, (rows, features, density, trees, depth, folds, devices) in enumerate(grid):
                home = root / f"{lib}-{index}"
                home.mkdir()
                shutil.copy(probed / "hardware_profile.json", home / "hardware_profile.json")
                job = {"kind": "tabular", "name": f"{lib}-{rows}x{features}", "library": lib, "rows": rows,
                       "features": features, "trees": trees, "cv_folds": folds, "data": "synthetic",
                       **({"max_depth": depth} if lib == "xgboost" else {"num_leaves": 2**depth}),
                       **({"density": density} if density < 1 else {})}  # fmt: skip
                path = home / "job.yaml"
                path.write_text(yaml.safe_dump(job))
                out = trainplan("run", str(path), "--out", str(home / "run"), "--devices", str(devices), "--json",
                                home=home)  # fmt: skip
                summary = json.loads(out.strip().splitlines()[-1])
                measured, predicted = summary["measured"]["train_s"], summary["predicted"]["train_s"]
                err = predicted / measured - 1
                errors[lib].append(err)
                threads = max(1, usable_cores() // devices)  # trainplan run's split of this machine's cores
                print(f"{lib:9} {rows:9,} {features:5} {density:5.2f} {trees:5} {depth:5} {folds:4} {threads:3}"
                      f" {measured:10.2f} {predicted:11.2f} {err:+7.0%}", flush=True)  # fmt: skip
        every = [e for errs in errors.values() for e in errs]
        for lib, errs in errors.items():
            print(f"{lib}: median |err| {statistics.median(abs(e) for e in errs):.0%}, median {statistics.median(errs):+.0%}, "
                  f"worst {max(errs, key=abs):+.0%} over {len(errs)} runs")  # fmt: skip
        print(f"all: median |err| {statistics.median(abs(e) for e in every):.0%} over {len(every)} runs "
              f"(issue 20's target: within 15%)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
