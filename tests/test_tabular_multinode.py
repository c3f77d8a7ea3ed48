"""One XGBoost / LightGBM model over several CPU machines (strategy dask-cpu): each machine works on its share of
the rows, the histograms cross the network every round, and nothing else is planned over several machines."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainplan import get_catalog, parse_job, plan_job
from trainplan.catalog import find_instance
from trainplan.estimate.hardware import hardware_for_instance
from trainplan.estimate.result import RejectKind
from trainplan.estimate.tabular import MAX_TABULAR_NODES, estimate_tabular, histogram_sync


def _job(**fields):
    base = {"kind": "tabular", "library": "lightgbm", "rows": 200_000_000, "features": 67, "trees": 100, "num_leaves": 255}
    return parse_job(base | fields)


def _hw(nodes: int):
    cat = get_catalog()
    return hardware_for_instance(find_instance("c5.18xlarge", cat), cat, nodes=nodes)


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_machines_divide_the_rows_and_add_the_histogram_exchange(library) -> None:
    cat = get_catalog()
    job = _job(library=library)
    one, four = estimate_tabular(job, _hw(1), cat), estimate_tabular(job, _hw(4), cat)
    assert one.strategy == "cpu" and four.strategy == "dask-cpu" and four.fits
    assert one.train_s / 4 < four.train_s < one.train_s / 3  # a quarter of the rows each, plus the split scans and sync
    assert any("histogram exchange" in n for n in four.notes)
    assert four.memory.peak < 0.3 * one.memory.peak  # a machine holds its share of the table
    no_network = replace(_hw(4), network_gbps=None)
    assert estimate_tabular(job, no_network, cat).rejection.kind is RejectKind.MISSING_FIGURE


def test_lightgbm_reduce_scatters_what_xgboost_all_reduces() -> None:
    (xb, xf), (lb, lf) = histogram_sync(_job(library="xgboost")), histogram_sync(_job())
    assert xb == lb and (xf, lf) == (2.0, 1.0)


@pytest.mark.parametrize("library", ["catboost", "sklearn-hgb", "sklearn-rf"])
def test_libraries_without_a_data_parallel_learner_stay_on_one_machine(library) -> None:
    e = estimate_tabular(_job(library=library, num_leaves=None, max_depth=6), _hw(2), get_catalog())
    assert e.rejection.kind is RejectKind.WASTE and "one machine" in e.reason


def test_a_table_no_machine_holds_is_planned_over_several() -> None:
    """1.7 billion rows × 67 features (LightGBM's Criteo run): 456 GB as float32, more than any CPU instance's RAM."""
    plan = plan_job(_job(rows=1_700_000_000))
    assert plan.options and all(e.strategy == "dask-cpu" for e in plan.options)
    assert {e.hardware.layout.nodes for e in plan.options} <= {2, 4, 8, MAX_TABULAR_NODES}
    assert all(e.memory.peak <= e.hardware.ram_gib_per_node * 2**30 for e in plan.options)


def test_the_histogram_exchange_is_shown_apart() -> None:
    b = estimate_tabular(_job(), _hw(8), get_catalog()).time_breakdown
    compute = sum(b[t] for t in ("histogram_s", "split_scans_s", "row_passes_s", "binning_s"))
    assert b["histogram_exchange_s"] > 0 and b["thread_sync_s"] > 0
    assert compute + b["thread_sync_s"] + b["histogram_exchange_s"] == pytest.approx(b["fit_s"])
