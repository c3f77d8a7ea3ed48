"""Run records written before the typed results still load, and new ones keep their format.

The files in ``data/format_v1/`` were written by ``trainplan run`` before
:class:`~trainplan.run.results.WorkerResult` and the enum-typed
:class:`~trainplan.run.config.RunConfig` existed (a torch job on one process,
an XGBoost job with 2-fold CV, and the calibration store both runs appended to).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trainplan.estimate.tabular import measured_ns_per_cell
from trainplan.measure.calibration import load_calibrations, record_calibration, store_path
from trainplan.measure.probe import Accelerator
from trainplan.run.api import tabular_ns_per_cell
from trainplan.run.config import DistBackend, RunConfig
from trainplan.run.results import FitResult, Measured, RunStatus, WorkerResult, WorkloadFacts
from trainplan.spec import JobKind, Precision
from trainplan.strategies import Engine, Strategy

V1 = Path(__file__).parent / "data" / "format_v1"


def _json(name: str) -> dict:
    return json.loads((V1 / name).read_text())


def test_an_old_neural_result_loads_typed_and_writes_back_the_same_keys() -> None:
    old = _json("torch_result.json")
    result = WorkerResult.from_dict(old)
    assert result.status is RunStatus.COMPLETED and result.completed and result.steps == 6
    assert result.strategy is Strategy.SINGLE and result.device is Accelerator.CPU and result.precision is Precision.FP32
    assert result.measured.rows_per_s == pytest.approx(451.8425120783397) and result.measured.tokens_per_s is None
    assert result.workload.params == 36 and result.workload.samples_per_step == 4 and result.folds is None
    again = result.to_dict()
    # the unknown (null) workload figures are left out; everything else is as it was
    assert again["workload"] == {k: v for k, v in old["workload"].items() if v is not None}
    assert {k: v for k, v in again.items() if k != "workload"} == {k: v for k, v in old.items() if k != "workload"}


def test_an_old_tabular_result_round_trips_exactly() -> None:
    old = _json("tabular_result.json")
    result = WorkerResult.from_dict(old)
    assert result.folds == (FitResult(0, 0.4715981185436249, 0.04409252300047228, 150, 5),
                            FitResult(1, 0.4464072287082672, 0.04729963499994483, 150, 5))
    assert result.workload.threads_per_fit == 1 and result.workload.rounds_per_fit == 5
    assert result.to_dict() == old


def test_the_calibration_rate_from_an_old_tabular_result() -> None:
    from trainplan import get_catalog, parse_job

    job = parse_job(_json("tabular_run.json")["job"])
    result = WorkerResult.from_dict(_json("tabular_result.json"))
    rates = sorted(
        measured_ns_per_cell(job, get_catalog(), rows=f.rows, rounds=f.rounds, fit_s=f.fit_s, threads=1)
        for f in result.folds or ()
    )
    assert tabular_ns_per_cell(job, result) == pytest.approx(sum(rates) / 2)  # median of two


@pytest.mark.parametrize("name,kind", [("torch_run.json", JobKind.TORCH), ("tabular_run.json", JobKind.TABULAR)])
def test_an_old_run_json_loads_with_enums_and_dumps_unchanged(name: str, kind: JobKind) -> None:
    old = _json(name)
    config = RunConfig.from_json(old)
    assert config.strategy is Strategy.SINGLE and config.engine is Engine.TORCH
    assert config.accelerator is Accelerator.CPU and config.precision is Precision.FP32
    assert config.kind is kind and config.dist_backend is DistBackend.GLOO
    assert config.to_json() == old
    assert json.loads(config.dumps()) == old


def test_a_run_json_with_an_unknown_strategy_is_one_clear_error() -> None:
    from trainplan.errors import TrainplanError

    bad = {**_json("torch_run.json"), "strategy": "zero9"}
    with pytest.raises(TrainplanError, match="run.json is not a run configuration") as err:
        RunConfig.from_json(bad)
    assert "\n" not in str(err.value)


def test_the_old_calibration_store_loads_and_keeps_its_records_when_appended_to() -> None:
    store_path().parent.mkdir(parents=True)
    shutil.copy(V1 / "calibrations.json", store_path())
    first, second = load_calibrations()
    assert (first.kind, first.key, first.throughput_unit) == ("torch", "single", "samples/s")
    assert (second.kind, second.key, second.ns_per_cell) == ("tabular", "xgboost", pytest.approx(5077.342111134284))
    record_calibration(first)
    data = json.loads(store_path().read_text())
    assert data["calibrations"][:2] == _json("calibrations.json")["calibrations"]
    assert len(data["calibrations"]) == 3 and data["version"] == 1


def test_a_missing_or_broken_result_reads_as_none(tmp_path: Path) -> None:
    assert WorkerResult.read(tmp_path / "result.json") is None
    (tmp_path / "result.json").write_text('{"steps": 3}')  # no status
    assert WorkerResult.read(tmp_path / "result.json") is None
    (tmp_path / "result.json").write_text('{"status": "exploded"}')
    assert WorkerResult.read(tmp_path / "result.json") is None


def test_user_workload_keys_are_kept_and_unknown_figures_are_refused() -> None:
    facts = WorkloadFacts.from_dict({"samples_per_step": 8, "my_dataset": "cifar"})
    assert facts.samples_per_step == 8 and facts.extra == {"my_dataset": "cifar"}
    assert facts.to_dict() == {"samples_per_step": 8, "my_dataset": "cifar"}
    with pytest.raises(KeyError, match="tokens_per_sec"):
        Measured().figure("tokens_per_sec")


def test_a_tabular_rate_recorded_in_an_earlier_unit_is_not_applied() -> None:
    """The old store's XGBoost rate (5,077 ns per cell of the one-rate model) would price the per-term model's
    dense-cell unit thousands of times too slow: it is left out, and a record in the current unit is used."""
    from dataclasses import replace

    from trainplan.estimate.tabular import tabular_work_unit
    from trainplan.planner.calibrated import _tabular_rate_lookup
    from trainplan.planner.local import local_cpu_hardware
    from trainplan.spec import parse_job

    store_path().parent.mkdir(parents=True)
    shutil.copy(V1 / "calibrations.json", store_path())
    old = load_calibrations()[1]
    job = parse_job({"kind": "tabular", "library": "xgboost", "rows": 1000, "features": 10})
    assert old.work_unit is None and _tabular_rate_lookup(job, old.hardware_id) is None
    record_calibration(replace(old, ns_per_cell=0.5, work_unit=tabular_work_unit("xgboost"), recorded_at="2026-12-05T00:00:00+00:00"))
    lookup = _tabular_rate_lookup(job, old.hardware_id)
    assert lookup is not None and lookup(local_cpu_hardware(2)) == 0.5
    assert json.loads(store_path().read_text())["calibrations"][2]["work_unit"] == "gbdt-terms-2026-12-05"
