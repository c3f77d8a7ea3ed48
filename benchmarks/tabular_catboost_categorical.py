"""Measure what CatBoost's categorical columns cost beyond numeric ones, on one core of this machine (issue 20).

CatBoost turns each categorical column into ordered target statistics (CTRs) on its own, and combines categorical
columns greedily as trees grow (Prokhorenkova et al. 2018, Sec. 3; CatBoost docs, "Transforming categorical features
to numerical features").  For each shape the script fits the same data twice — the categorical columns given as
``cat_features`` (string labels), then the same integer codes as plain numeric columns — and attributes the
difference to the categorical handling, per row and tree:

    extra ns per row per tree = a + b * categorical columns

``a`` and ``b`` are fitted by least squares on grid A (2, 4, 6 categorical columns, 200k rows, 50 trees, depth 6) and
checked on grid B (twice the rows, twice the trees, depth 10, 8 columns), which no fit sees.  The two figures are
stored in tabular_rates.csv as equivalent oblivious-tree cells (divided by the CPU rate's ns per cell), the unit
estimate/tabular.py prices.

    python benchmarks/tabular_catboost_categorical.py
"""

from __future__ import annotations

import platform
import time

import numpy as np

CARDINALITIES = (12, 31, 7, 22, 300, 300, 50, 100)  # airline-like: month, day, weekday, carrier, origin, dest, ...
NUMERIC = 2
GRID_A = ((200_000, 2, 50, 6), (200_000, 4, 50, 6), (200_000, 6, 50, 6))
GRID_B = ((400_000, 6, 50, 6), (200_000, 6, 100, 6), (200_000, 6, 50, 10), (200_000, 8, 50, 6))


def _frame(rows: int, categorical: int, as_category: bool, seed: int = 0):  # noqa: ANN202
    import pandas as pd

    rng = np.random.default_rng(seed)
    codes = [rng.integers(0, c, rows) for c in CARDINALITIES[:categorical]]
    numeric = [rng.standard_normal(rows) for _ in range(NUMERIC)]
    logit = sum(0.3 * (c % 3 == 0) for c in codes) + sum(0.2 * n for n in numeric)
    y = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int32)
    cols = {f"c{i}": (c.astype(str) if as_category else c.astype(np.float64)) for i, c in enumerate(codes)}
    cols.update({f"n{i}": n for i, n in enumerate(numeric)})
    return pd.DataFrame(cols), y, [f"c{i}" for i in range(categorical)] if as_category else []


def _fit_s(rows: int, categorical: int, trees: int, depth: int, as_category: bool) -> float:
    from catboost import CatBoostClassifier

    x, y, cat = _frame(rows, categorical, as_category)
    model = CatBoostClassifier(iterations=trees, depth=depth, learning_rate=0.1, thread_count=1, verbose=0,
                               allow_writing_files=False)  # fmt: skip
    t0 = time.perf_counter()
    model.fit(x, y, cat_features=cat)
    return time.perf_counter() - t0


def extra_ns(rows: int, categorical: int, trees: int, depth: int) -> float:
    """Nanoseconds per row per tree the categorical columns add (the median of two repeats of each fit)."""
    cat = sorted(_fit_s(rows, categorical, trees, depth, True) for _ in range(2))
    num = sorted(_fit_s(rows, categorical, trees, depth, False) for _ in range(2))
    return (sum(cat) - sum(num)) / 2 * 1e9 / (rows * trees)


def main() -> None:
    import catboost

    print(f"catboost {catboost.__version__}, 1 thread, {platform.processor() or platform.machine()}")
    measured = [(shape, extra_ns(*shape)) for shape in GRID_A]
    xs = np.array([[1.0, shape[1]] for shape, _ in measured])
    (a, b), *_ = np.linalg.lstsq(xs, np.array([ns for _, ns in measured]), rcond=None)
    for (rows, cat, trees, depth), ns in measured:
        print(f"A rows {rows:>7} categorical {cat} trees {trees:>3} depth {depth:>2}: {ns:6.1f} ns per row-tree, "
              f"fit {a + b * cat:6.1f}")  # fmt: skip
    print(f"fit on grid A: a = {a:.1f} ns per row per tree, b = {b:.1f} ns per categorical column per row per tree")
    for rows, cat, trees, depth in GRID_B:
        ns = extra_ns(rows, cat, trees, depth)
        pred = a + b * cat
        print(f"B rows {rows:>7} categorical {cat} trees {trees:>3} depth {depth:>2}: {ns:6.1f} ns per row-tree, "
              f"predicted {pred:6.1f} ({pred / ns - 1:+.0%})")  # fmt: skip


if __name__ == "__main__":
    main()
