"""Tabular jobs: every library, every data source, parallel folds, bad data, preemption."""

from __future__ import annotations

import math
import threading

import numpy as np
import pandas as pd
import pytest
from conftest import TABULAR_JOB, run, write_job

from trainplan.errors import SpecError
from trainplan.measure.calibration import load_calibrations
from trainplan.run.workloads.tabular import load_table, parallelism, train_tabular
from trainplan.spec import parse_job


@pytest.mark.parametrize(
    "folds,cores,devices,expected",
    [(5, 16, None, (5, 3)), (1, 8, None, (1, 8)), (10, 2, None, (2, 1)), (5, 16, 2, (2, 8)), (3, 1, None, (1, 1))],
)
def test_parallel_fits_times_threads_never_exceed_cores(folds, cores, devices, expected) -> None:
    parallel, threads = parallelism(folds, cores, devices)
    assert (parallel, threads) == expected
    assert parallel * threads <= max(cores, 1)


@pytest.mark.slow
@pytest.mark.parametrize("library", ["xgboost", "lightgbm", "catboost", "sklearn-hgb", "sklearn-rf", "sklearn-linear"])
def test_library_trains_folds_in_parallel(tmp_path, library) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, library=library)
    summary = run(job, tmp_path / "run")
    assert summary.status == "completed", summary.message
    result = (tmp_path / "run" / "result.json").read_text()
    import json

    data = json.loads(result)
    assert len(data["folds"]) == 3 and sorted(f["fold"] for f in data["folds"]) == [0, 1, 2]
    work = data["workload"]
    assert work["parallel_fits"] * work["threads_per_fit"] <= max(2, work["parallel_fits"])
    assert work["rows"] == 600 and work["features"] == 8
    m = summary.measured
    assert 0 < m["final_loss"] < math.log(2)  # better than chance on a learnable synthetic set
    assert m["rows_per_s"] > 0 and m["step_time_s"] > 0 and m["peak_gib"] > 0
    cal = load_calibrations()
    assert len(cal) == 1 and cal[0].kind == "tabular" and cal[0].key == library
    assert cal[0].ns_per_cell is not None and cal[0].ns_per_cell > 0


@pytest.mark.slow
def test_a_finished_run_calibrates_the_next_prediction_on_this_machine(tmp_path) -> None:
    from trainplan.catalog import get_catalog
    from trainplan.estimate.tabular import estimate_tabular
    from trainplan.planner.local import local_cpu_hardware, predict_run

    job_path = write_job(tmp_path / "job.yaml", TABULAR_JOB, rows=3000, trees=30)
    first = run(job_path, tmp_path / "first")
    assert first.status == "completed" and not first.predicted_from_calibration
    (cal,) = load_calibrations()
    assert cal.hardware_id == first.hardware_id and cal.ns_per_cell > 0

    job = parse_job({k: v for k, v in TABULAR_JOB.items() if k != "name"} | {"rows": 3000, "trees": 30})
    cores = int(first.hardware_id.rsplit(":", 1)[1])
    predicted = predict_run(job, "cpu", first.devices, first.hardware_id)
    expected = estimate_tabular(job, local_cpu_hardware(cores), get_catalog(), ns_per_cell=cal.ns_per_cell)
    assert predicted["from_calibration"] is True
    assert predicted["train_s"] == pytest.approx(expected.train_s)
    # another machine (or none recorded) keeps the catalog's rate
    assert predict_run(job, "cpu", first.devices, "cpu:Other CPU:2")["from_calibration"] is False

    second = run(job_path, tmp_path / "second")
    assert second.status == "completed" and second.predicted_from_calibration
    assert second.predicted["train_s"] == pytest.approx(expected.train_s)


@pytest.mark.slow
def test_csv_with_text_column_and_regression(tmp_path) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=300), "b": rng.normal(size=300), "city": rng.choice(["x", "y", "z"], 300)})
    frame["price"] = 3 * frame["a"] - frame["b"] + (frame["city"] == "y") + rng.normal(scale=0.1, size=300)
    frame.loc[5, "a"] = np.nan
    frame.to_csv(tmp_path / "houses.csv", index=False)
    job = write_job(
        tmp_path / "job.yaml", TABULAR_JOB, library="lightgbm", data=str(tmp_path / "houses.csv"),
        target="price", objective="regression", cv_folds=2,
    )
    summary = run(job, tmp_path / "run")
    assert summary.status == "completed", summary.message
    assert summary.measured["final_loss"] < frame["price"].var()  # beats predicting the mean


@pytest.mark.slow
def test_parquet_run_and_sklearn_bundled_set_read_the_same_table(tmp_path) -> None:
    from sklearn.datasets import load_breast_cancer

    X, y = load_breast_cancer(return_X_y=True, as_frame=True)
    X.assign(label=y).to_parquet(tmp_path / "bc.parquet")
    job = write_job(tmp_path / "a.yaml", TABULAR_JOB, data=str(tmp_path / "bc.parquet"), target="label", cv_folds=1)
    summary = run(job, tmp_path / "file")
    assert summary.status == "completed", summary.message
    assert 0 < summary.measured["final_loss"] < 0.3
    from_file = load_table(parse_job({**TABULAR_JOB, "data": str(tmp_path / "bc.parquet"), "target": "label"}))
    bundled = load_table(parse_job({**TABULAR_JOB, "data": "sklearn:breast_cancer"}))
    np.testing.assert_array_equal(from_file[0], bundled[0])
    np.testing.assert_array_equal(from_file[1], bundled[1])


@pytest.mark.parametrize(
    "changes,field,words",
    [
        ({"data": "missing.csv", "target": "y"}, "data", "not found"),
        ({"data": "TABLE", "target": "nope"}, "target", "columns: a, y"),
        ({"data": "TABLE", "target": None}, "target", "is required"),
        ({"data": "sklearn:mnist"}, "data", "allowed: breast_cancer"),
        ({"data": "sklearn:iris"}, "objective", "multiclass"),
        ({"data": "notes.txt"}, "data", ".csv, .parquet or SVMlight"),
    ],
)
def test_bad_data_is_one_clear_error_before_launch(tmp_path, changes, field, words) -> None:
    (tmp_path / "t.csv").write_text("a,y\n1,0\n2,1\n")
    changes = {k: (str(tmp_path / "t.csv") if v == "TABLE" else v) for k, v in changes.items()}
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, **changes)
    with pytest.raises(SpecError) as err:
        run(job, tmp_path / "run")
    assert err.value.field == field and words in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()  # nothing was created


def test_strategy_is_refused_for_tabular_jobs(tmp_path) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB)
    with pytest.raises(SpecError) as err:
        run(job, tmp_path / "run", strategy="ddp")
    assert err.value.field == "--strategy"


def test_preempted_folds_resume_to_the_same_result(tmp_path) -> None:
    job = parse_job({**TABULAR_JOB, "cv_folds": 4})
    lines: list[dict] = []
    stop = threading.Event()

    def write(record: dict) -> None:
        lines.append(record)
        if "loss" in record:  # a fold finished: SIGTERM arrives
            stop.set()

    first = train_tabular(job, out_dir=tmp_path / "a", parallel_fits=1, threads_per_fit=1, write_metrics=write, stop=stop)
    assert first["status"] == "preempted" and len(first["folds"]) == 1
    again = train_tabular(
        job, out_dir=tmp_path / "a", parallel_fits=1, threads_per_fit=1, write_metrics=lines.append, stop=threading.Event()
    )
    assert again["status"] == "completed" and len(again["folds"]) == 4
    fresh = train_tabular(
        job, out_dir=tmp_path / "b", parallel_fits=2, threads_per_fit=1, write_metrics=lambda r: None, stop=threading.Event()
    )
    assert again["measured"]["final_loss"] == pytest.approx(fresh["measured"]["final_loss"], rel=1e-9)


def test_sklearn_linear_run_counts_the_steps_the_estimate_counts(tmp_path) -> None:
    """Solver iterations, not trees: the run and the estimate agree on what a step of a linear model is."""
    from trainplan.catalog import get_catalog
    from trainplan.estimate.tabular import estimate_tabular
    from trainplan.planner.local import local_cpu_hardware

    job = parse_job({**TABULAR_JOB, "library": "sklearn-linear", "trees": 100, "iterations": 7, "cv_folds": 2})
    result = train_tabular(
        job, out_dir=tmp_path, parallel_fits=1, threads_per_fit=1, write_metrics=lambda r: None, stop=threading.Event()
    )
    assert result["steps"] == 14 and [f["rounds"] for f in result["folds"]] == [7, 7]
    assert estimate_tabular(job, local_cpu_hardware(2), get_catalog()).steps == result["steps"]


def test_catboost_takes_the_first_columns_as_categories(tmp_path) -> None:
    """categorical_features: the first columns reach CatBoost as cat_features (integer codes), and the saved model
    says so; predictions go through the same frame."""
    import catboost

    job = parse_job({**TABULAR_JOB, "library": "catboost", "trees": 8, "max_depth": 4, "features": 6,
                     "categorical_features": 2, "cv_folds": 2})  # fmt: skip
    done = train_tabular(job, out_dir=tmp_path, parallel_fits=1, threads_per_fit=1, write_metrics=lambda r: None,
                         stop=threading.Event())  # fmt: skip
    assert done["status"] == "completed" and [f["rounds"] for f in done["folds"]] == [8, 8]
    assert all(f["loss"] == f["loss"] for f in done["folds"])  # a held-out loss from the categorical frame (not NaN)
    for saved in tmp_path.rglob("*.cbm"):
        model = catboost.CatBoost()
        model.load_model(str(saved))
        assert model.get_cat_feature_indices() == [0, 1]


def test_categorical_columns_of_a_file_must_be_categories(tmp_path) -> None:
    """A file's first categorical_features columns are taken as category codes: text or integers pass, a column of
    fractional numbers (it would be truncated) and more categorical columns than the file has are refused in one line."""
    from trainplan.errors import SpecError
    from trainplan.run.workloads.tabular import inspect_data

    path = tmp_path / "t.csv"
    path.write_text("city,size,price,y\nparis,3,1.5,0\nrome,2,2.25,1\nparis,4,0.5,1\n")
    base = {**TABULAR_JOB, "library": "catboost", "data": str(path), "target": "y", "features": 3}
    assert inspect_data(parse_job({**base, "categorical_features": 2})).features == 3  # text, then integer codes
    with pytest.raises(SpecError) as err:
        inspect_data(parse_job({**base, "categorical_features": 3}))  # price: 1.5, 2.25, 0.5
    assert err.value.field == "categorical_features" and "\n" not in str(err.value)
    assert "feature column 3 of t.csv holds non-integer numbers" in str(err.value)
    with pytest.raises(SpecError) as err:
        inspect_data(parse_job({**base, "features": 4, "categorical_features": 4}))
    assert "4 categorical columns, but t.csv has 3 feature columns" in str(err.value)


@pytest.mark.parametrize("objective,classes", [("binary", 2), ("multiclass", 3), ("regression", 2)])
def test_catboost_trains_what_the_job_says_and_stops_on_sigterm(tmp_path, objective, classes) -> None:
    """CatBoost fits every round the job asks for with the job's depth and borders, saves a model CatBoost loads,
    and a stop between rounds preempts the fold (its callback returns False) instead of finishing it."""
    import catboost

    fields = {**TABULAR_JOB, "library": "catboost", "objective": objective, "trees": 12, "max_depth": 4,
              "max_bins": 32, "cv_folds": 1}  # fmt: skip
    if objective == "multiclass":
        fields["classes"] = classes
    job = parse_job(fields)
    done = train_tabular(job, out_dir=tmp_path / "a", parallel_fits=1, threads_per_fit=1, write_metrics=lambda r: None,
                         stop=threading.Event())  # fmt: skip
    assert done["status"] == "completed" and done["folds"][0]["rounds"] == 12
    (saved,) = (tmp_path / "a").rglob("*.cbm")
    model = catboost.CatBoost()
    model.load_model(str(saved))
    assert model.tree_count_ == 12 and model.get_params()["depth"] == 4
    stop = threading.Event()
    rounds = []

    def write(record: dict) -> None:
        rounds.append(record)
        stop.set()  # SIGTERM after the first progress line

    cut = train_tabular(job, out_dir=tmp_path / "b", parallel_fits=1, threads_per_fit=1, write_metrics=write, stop=stop)
    assert cut["status"] == "preempted" and not cut["folds"]
