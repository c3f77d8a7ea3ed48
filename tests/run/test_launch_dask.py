"""`trainplan launch --to dask`: the rendered driver trains tabular jobs on a Dask LocalCluster of two
workers (xgboost.dask, LightGBM's Dask estimator); scikit-learn goes through joblib's dask backend."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import TABULAR_JOB, write_job
from launch_support import logs, processes, render_to

from trainplan.cli.main import main


def _drive(plan, rendered, tmp_path: Path) -> dict:  # noqa: ANN001
    """Run the rendered driver to its end; its dask_result.json."""
    (cmd,) = rendered.commands
    with processes() as procs:
        procs.start(cmd.argv, env=cmd.env, cwd=cmd.cwd, log=tmp_path / "dask.log")
        codes = procs.wait_all(timeout=240)
    assert codes == [0], logs(tmp_path / "dask.log")
    return json.loads((plan.out / "dask_result.json").read_text())


def _run(tmp_path: Path, library: str, **changes) -> dict:  # noqa: ANN003
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, library=library, **changes)
    plan, rendered = render_to(job, "dask", tmp_path / "run", cpus=2, options={"workers": 2})
    return _drive(plan, rendered, tmp_path)


@pytest.mark.slow
def test_xgboost_dask_on_two_workers_with_submit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB)
    code = main(["launch", str(job), "--to", "dask", "--cpus", "2", "--workers", "2", "--out", str(tmp_path / "run"), "--submit"])
    err = capsys.readouterr().err
    assert code == 0 and f"dask finished (log: {tmp_path / 'run' / 'launch.log'})" in err, err
    result = json.loads((tmp_path / "run" / "dask_result.json").read_text())
    assert result["workers"] == 2 and result["rows"] == 600 and result["rounds"] == 15
    assert 0 < result["train_logloss"] < 0.69  # learned something (log 2 is a coin toss)
    assert (tmp_path / "run" / "models" / "dask.ubj").stat().st_size > 0


@pytest.mark.slow
def test_lightgbm_dask_on_two_workers(tmp_path: Path) -> None:
    result = _run(tmp_path, "lightgbm")
    assert result["workers"] == 2 and result["rounds"] == 15
    assert (tmp_path / "run" / "models" / "dask.txt").read_text().startswith("tree")


def test_sklearn_goes_through_joblibs_dask_backend(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, library="sklearn-rf")
    plan, rendered = render_to(job, "dask", tmp_path / "run", cpus=4, options={"address": "tcp://10.1.2.3:8786"})
    source = (plan.out / "dask_driver.py").read_text()
    tree = ast.parse(source)
    constants = {n.targets[0].id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
    assert constants["LIBRARY"] == "sklearn" and constants["WORKERS"] == 1
    assert 'joblib.parallel_backend("dask")' in source
    assert list(rendered.commands[0].argv[-1:]) == ["tcp://10.1.2.3:8786"]  # the scheduler, as an argument


def test_a_multi_gpu_xgboost_option_renders_one_gpu_worker_per_gpu(tmp_path: Path) -> None:
    """A plan option that trains one XGBoost model over a node's GPUs (strategy dask-gpu): the driver starts a
    LocalCUDACluster with one worker per GPU and trains with device cuda; the other targets refuse that option."""
    from trainplan.errors import SpecError

    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, rows=20_000_000, features=100, trees=50)
    plan, rendered = render_to(job, "dask", tmp_path / "run", instance="p4d.24xlarge")
    consts = {n.targets[0].id: ast.literal_eval(n.value) for n in ast.parse(rendered.files["dask_driver.py"]).body
              if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Constant, ast.Dict))}  # fmt: skip
    assert consts["GPUS"] is True and consts["WORKERS"] == 8 and consts["PARAMS"]["device"] == "cuda"
    assert "LocalCUDACluster" in rendered.files["dask_driver.py"] and "8 GPU workers" in rendered.commands[0].where
    assert any("dask-cuda" in n for n in rendered.notes)
    with pytest.raises(SpecError, match="launch it with --to dask"):
        render_to(job, "skypilot", tmp_path / "sky", instance="p4d.24xlarge")


@pytest.mark.slow
@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_multi_machine_option_trains_one_model_on_the_clusters_workers(tmp_path: Path, library: str) -> None:
    """A dask-cpu option (one model over 2 machines): without the cluster's address it is one line naming --address;
    with it, the driver trains on that scheduler's workers — here a LocalCluster of two worker processes standing in
    for the two machines."""
    from distributed import LocalCluster

    from trainplan.errors import SpecError

    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, library=library)
    with pytest.raises(SpecError) as err:
        render_to(job, "dask", tmp_path / "none", instance="c5.4xlarge", nodes=2)
    assert err.value.field == "--address" and "over 2 machines" in str(err.value)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        plan, rendered = render_to(job, "dask", tmp_path / "run", instance="c5.4xlarge", nodes=2,
                                   options={"address": cluster.scheduler_address})  # fmt: skip
        assert plan.placement.nodes == 2 and any("each run one Dask worker" in n for n in rendered.notes)
        result = _drive(plan, rendered, tmp_path)
    assert result["workers"] == 2 and result["rounds"] == 15


@pytest.mark.slow
@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_sparse_table_stays_sparse_on_the_workers(tmp_path: Path, library: str) -> None:
    """density < 1: the driver hands each worker CSR chunks (dask arrays of SciPy matrices), which xgboost.dask and
    LightGBM's Dask estimator train as they are (the driver used len() on them and failed)."""
    result = _run(tmp_path, library, rows=4000, features=300, density=0.02)
    assert result["workers"] == 2 and result["rows"] == 4000


@pytest.mark.parametrize("target,options", [("slurm", {"partition": "p"}), ("skypilot", {}), ("ray", {})])
def test_other_targets_refuse_a_multi_machine_tabular_option(tmp_path: Path, target: str, options: dict) -> None:
    """SLURM, SkyPilot and Ray would start the whole job on every machine — N independent fits of the whole table."""
    from trainplan.errors import SpecError

    job = write_job(tmp_path / "job.yaml", TABULAR_JOB)
    with pytest.raises(SpecError) as err:
        render_to(job, target, tmp_path / "run", instance="c5.4xlarge", nodes=2, options=options)
    assert err.value.field == "--to" and "over 2 machines through Dask" in str(err.value)
    assert not (tmp_path / "run").exists()
