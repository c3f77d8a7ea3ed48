"""Sparse tabular data (`density`): the histogram GBDT terms count stored values, memory holds a CSR matrix, and
`trainplan run` trains a real CSR matrix."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainplan import get_catalog, parse_job
from trainplan.errors import SpecError
from trainplan.estimate.tabular import estimate_tabular, gbdt_terms, gpu_memory_bytes, work_cells
from trainplan.planner.local import local_cpu_hardware


def _job(**fields):
    base = {"kind": "tabular", "library": "xgboost", "rows": 1_000_000, "features": 700, "trees": 100, "max_depth": 8}
    return parse_job(base | fields)


def test_the_terms_count_stored_values_apart_from_dense_ones() -> None:
    dense = gbdt_terms("xgboost", 1000, 100, 1.0, leaves=64)
    sparse = gbdt_terms("xgboost", 1000, 100, 0.1, leaves=64)
    assert dense[1] == 0 and sparse[0] == 0
    assert sparse[1] == pytest.approx(0.1 * dense[0])  # the same histogram cells, stored values only
    assert dense[2] == 127 * 100 * 256 and sparse[2] == 127 * 100 * 101  # bins: the 100 values a feature holds, + 1
    assert sparse[3] == dense[3] == 1000 * 7  # every row, once per level and once for the gradients


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_sparse_data_is_cheaper_but_not_in_proportion(library) -> None:
    cat = get_catalog()
    machine = local_cpu_hardware(16)
    dense = estimate_tabular(_job(library=library), machine, cat)
    sparse = estimate_tabular(_job(library=library, density=0.01), machine, cat)
    # fewer histogram cells, but a sparse value costs more than a dense one and the split scans and row passes stay
    assert 0.01 * dense.train_s < sparse.train_s < 0.2 * dense.train_s
    # a CSR of 1% of the cells (8 bytes a stored value); the per-thread histograms (features × bins) stay
    assert sparse.memory.activations < 0.3 * dense.memory.activations


def test_a_calibrated_rate_scales_the_whole_model() -> None:
    cat = get_catalog()
    job = _job(density=0.02)
    rate = cat.tabular_rates[("xgboost", "cpu")]
    base = estimate_tabular(job, local_cpu_hardware(1), cat)
    twice = estimate_tabular(job, local_cpu_hardware(1), cat, ns_per_cell=2 * rate.ns_per_cell)
    assert twice.train_s - twice.startup_s == pytest.approx(2 * (base.train_s - base.startup_s))
    assert work_cells(job, rate=rate) > work_cells(job) > 0  # the other terms on top of the stored histogram cells


def test_xgboost_gpu_memory_of_sparse_data_is_an_ellpack_of_the_row_stride() -> None:
    cat = get_catalog()
    dense = gpu_memory_bytes(_job(), cat)
    sparse = gpu_memory_bytes(_job(density=0.01), cat)
    # 7 symbols a row of ceil(log2(700 * 256 + 1)) = 18 bits, against 700 of 8 bits
    assert sparse.activations - sparse.activations // 1 == 0
    matrix = lambda m, hist: m.activations - hist  # noqa: E731
    hist = dense.activations - 1_000_000 * 700 * 8 / 8
    assert matrix(sparse, hist) == pytest.approx(1_000_000 * 7 * 18 / 8)


@pytest.mark.parametrize("fields,message", [
    ({"density": 0}, "density: must be > 0"),
    ({"density": 1.5}, "density: Input should be less than or equal to 1"),
    ({"library": "catboost", "density": 0.1}, "density: 0.1 (sparse input) is planned for xgboost and lightgbm"),
    ({"library": "sklearn-hgb", "density": 0.5}, "sklearn-hgb is planned on dense data"),
])  # fmt: skip
def test_bad_density_is_one_line_naming_the_field(fields, message) -> None:
    with pytest.raises(SpecError) as err:
        _job(**fields)
    assert message in f"{err.value.field}: {err.value}"


@pytest.mark.slow
@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_run_trains_a_sparse_matrix_and_refuses_a_table_file_said_to_be_sparse(tmp_path, library) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: sp\nkind: tabular\nlibrary: {library}\nrows: 4000\nfeatures: 300\ndensity: 0.02\n"
                   "trees: 10\nmax_depth: 4\ncv_folds: 2\n")  # fmt: skip
    run = [sys.executable, "-m", "trainplan.cli.main", "run", str(job), "--json"]
    done = subprocess.run([*run, "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import json

    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "completed" and summary["measured"]["final_loss"] < 0.69  # it learns the score
    from trainplan.run.workloads.tabular import load_table

    X, y = load_table(parse_job(__import__("yaml").safe_load(job.read_text())))
    assert X.format == "csr" and X.nnz == round(4000 * 300 * 0.02) and set(y) == {0, 1}
    table = tmp_path / "t.csv"
    table.write_text("a,b,y\n1,0,1\n0,1,0\n")
    job.write_text(job.read_text() + f"data: {table}\ntarget: y\n")
    refused = subprocess.run([*run, "--out", str(tmp_path / "run2")], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "error: density: 0.02 describes a sparse matrix" in refused.stderr
    assert not (tmp_path / "run2").exists()


def test_the_estimate_says_where_a_fit_s_time_goes() -> None:
    """A wide sparse table with few rows is split-scan bound (nodes × features × bins), a long dense one histogram
    bound; the terms add up to the fit."""
    cat = get_catalog()
    machine = local_cpu_hardware(8)
    terms = ("histogram_s", "split_scans_s", "row_passes_s", "binning_s")
    wide = estimate_tabular(_job(rows=20_000, features=4_000, density=0.005), machine, cat).time_breakdown
    long = estimate_tabular(_job(rows=10_000_000, features=200), machine, cat).time_breakdown
    for b in (wide, long):
        assert sum(b[t] for t in terms) + b.get("thread_sync_s", 0.0) == pytest.approx(b["fit_s"])
    assert max(terms, key=wide.get) == "split_scans_s" and max(terms, key=long.get) == "histogram_s"


def _svmlight(path, rows=3000, features=400, density=0.02):
    import numpy as np
    import scipy.sparse
    from sklearn.datasets import dump_svmlight_file

    X = scipy.sparse.random(rows, features, density=density, format="csr", dtype=np.float32, random_state=0)
    score = np.asarray(X @ np.random.default_rng(0).standard_normal(features)).ravel()
    dump_svmlight_file(X, (score > np.median(score)).astype(int), str(path))
    return X.nnz


def test_an_svmlight_file_gives_its_rows_features_and_density(tmp_path) -> None:
    from trainplan.run.api import check_job
    from trainplan.run.workloads.tabular import load_table

    path = tmp_path / "train.svm"
    nnz = _svmlight(path)
    job = _job(library="lightgbm", data=str(path), rows=1, features=1)
    checked = check_job(job, None)
    assert (checked.rows, checked.features) == (3000, 400) and checked.density == pytest.approx(nnz / (3000 * 400))
    X, y = load_table(checked)
    assert X.format == "csr" and X.nnz == nnz and set(y) == {0, 1}
    with pytest.raises(SpecError) as err:
        check_job(_job(library="lightgbm", data=str(path), target="label"), None)
    assert err.value.field == "target" and "no target column" in str(err.value)
    with pytest.raises(SpecError) as err:
        check_job(_job(library="catboost", data=str(path), max_depth=6), None)
    assert err.value.field == "library" and "xgboost and lightgbm train it" in str(err.value)
    (tmp_path / "bad.svm").write_text("1 3:x\n")
    with pytest.raises(SpecError, match="cannot read .* as SVMlight"):
        check_job(_job(data=str(tmp_path / "bad.svm")), None)
