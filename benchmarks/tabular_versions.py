"""How much slower (or faster) an older XGBoost / LightGBM release trains the same shapes, on this machine.

Published tabular runs name their library releases (LightGBM's comparison page: XGBoost 1b97eaf and LightGBM
bcad692 of March 2020; GBM-perf's CPU table: both libraries' masters of April 2019), and the rates of
tabular_rates.csv are of today's releases.  This script times the boosting rounds and the data preparation of
``benchmarks/tabular_terms.py``'s shapes (one thread, 20 trees) in each interpreter named by ``--env`` (a virtual
environment holding one older release: ``python -m venv E && E/bin/pip install "numpy<2" scipy xgboost==0.90``)
and in this one (the reference release), and prints the ratio per shape.  The four term rates of each release are
fitted on grid A; their ratios (and the median preparation ratio) are the factors of tabular_releases.csv, and grid
B's shapes check them (beside one factor for all terms, grid A's median ratio).  ``--save`` keeps the raw timings,
``--load`` reports them again.

    python benchmarks/tabular_versions.py --env /tmp/v_xgboost_0_90/bin/python [--env ...] [--library xgboost] [--trees 20]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tabular_terms import GRID_A, GRID_B  # noqa: E402

CHILD = """
import json, sys
sys.path.insert(0, {here!r})
from tabular_terms import fit
out = {{}}
for lib in {libraries!r}:
    try:
        mod = __import__(lib)
    except ImportError:
        continue
    out[lib] = {{"version": mod.__version__, "fits": [fit(lib, *s, {trees}) for s in {shapes!r}]}}
print(json.dumps(out))
"""


def run(python: str, shapes: list, trees: int, libraries: tuple[str, ...]) -> dict:
    """{library: {version, fits: [(prep s, boosting s, leaves)]}} of ``libraries`` that ``python`` can import."""
    code = CHILD.format(here=str(HERE), trees=trees, shapes=shapes, libraries=libraries)
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def term_rates(library: str, fits: list, trees: int) -> np.ndarray:
    """The four per-round rates (s per dense cell, sparse cell, split bin, row-level) fitted on grid A as
    ``tabular_terms.py`` fits them: non-negative least squares on relative error, with the trees' real leaves."""
    from scipy.optimize import nnls

    from trainplan.estimate.tabular import gbdt_terms

    terms = np.array([gbdt_terms(library, n, f, d, leaves=lv) for (n, f, d, _), (_, _, lv) in zip(GRID_A, fits)])
    per_tree = np.array([boost / trees for _, boost, _ in fits[: len(GRID_A)]])
    rates, _ = nnls(terms / per_tree[:, None], np.ones(len(per_tree)))
    return rates


def report(lib: str, got: dict, ref: dict, trees: int) -> None:
    from trainplan.estimate.tabular import gbdt_terms

    shapes = GRID_A + GRID_B
    print(f"\n{lib} {got['version']} against {ref['version']} (one thread, {trees} trees; ratio = older / reference time)")
    print(f"{'grid':5} {'rows':>9} {'feat':>5} {'dens':>6} {'depth':>5} {'round ms':>9} {'ref ms':>8} {'ratio':>6} "
          f"{'prep ratio':>10} {'terms err':>9}")  # fmt: skip
    old_rates, ref_rates = term_rates(lib, got["fits"], trees), term_rates(lib, ref["fits"], trees)
    ratios: dict[str, list[float]] = {"A": [], "B": []}
    term_errs: dict[str, list[float]] = {"A": [], "B": []}
    preps: list[float] = []
    for i, (n, f, d, dep) in enumerate(shapes):
        grid = "A" if i < len(GRID_A) else "B"
        (p_old, b_old, lv_old), (p_ref, b_ref, _) = got["fits"][i], ref["fits"][i]
        ratio = b_old / b_ref
        ratios[grid].append(ratio)
        preps.append(p_old / p_ref)
        model = float(np.dot(gbdt_terms(lib, n, f, d, leaves=lv_old), old_rates))  # the older release's own terms
        term_errs[grid].append(model / (b_old / trees) - 1)
        print(f"{grid:5} {n:>9} {f:>5} {d:>6} {dep:>5} {b_old / trees * 1e3:>9.1f} {b_ref / trees * 1e3:>8.1f} "
              f"{ratio:>6.2f} {p_old / p_ref:>10.2f} {model / (b_old / trees) - 1:>+9.0%}")  # fmt: skip
    factor = statistics.median(ratios["A"])
    errs = [abs(r / factor - 1) for r in ratios["B"]]
    names = ("dense cell", "sparse cell", "split bin", "row-level")
    per_term = ", ".join(f"{k} {o / r:.2f}" if r > 0 else f"{k} -" for k, o, r in zip(names, old_rates, ref_rates))
    print(f"{lib} {got['version']}: one factor {factor:.2f} (grid A median; spread {min(ratios['A']):.2f}-"
          f"{max(ratios['A']):.2f}) predicts grid B with median |err| {statistics.median(errs):.0%} (worst {max(errs):.0%})")
    print(f"  per-term rates (ns) {', '.join(f'{x * 1e9:.3f}' for x in old_rates)} against "
          f"{', '.join(f'{x * 1e9:.3f}' for x in ref_rates)}: ratios {per_term}; these terms predict grid B with "
          f"median |err| {statistics.median(abs(e) for e in term_errs['B']):.0%} (worst "
          f"{max(abs(e) for e in term_errs['B']):.0%}); preparation ratio median {statistics.median(preps):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--env", action="append", default=[], help="python of an environment with an older release")
    ap.add_argument("--library", choices=("xgboost", "lightgbm"), action="append")
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument("--save", help="write the raw timings (JSON) here")
    ap.add_argument("--load", help="report timings saved by --save instead of measuring")
    args = ap.parse_args()
    if args.load:
        saved = json.loads(Path(args.load).read_text())
    else:
        if not args.env:
            ap.error("give --env (or --load)")
        shapes = GRID_A + GRID_B
        libraries = tuple(args.library or ("xgboost", "lightgbm"))
        saved = {"trees": args.trees, "machine": platform.processor() or platform.machine(),
                 "reference": run(sys.executable, shapes, args.trees, libraries),
                 "older": [run(python, shapes, args.trees, libraries) for python in args.env]}  # fmt: skip
        if args.save:
            Path(args.save).write_text(json.dumps(saved))
    print(f"machine: {saved['machine']}, one thread per fit")
    for older in saved["older"]:
        for lib, got in older.items():
            report(lib, got, saved["reference"][lib], saved["trees"])


if __name__ == "__main__":
    main()
