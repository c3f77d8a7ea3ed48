"""`trainplan launch --to ray`: the rendered Ray Train driver, on a local Ray instance with two workers,
trains the tiny torch model with TorchTrainer (both ranks end identical) and an XGBoost job with
XGBoostTrainer (both workers grow the same model from their halves of the rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TABULAR_JOB, write_job
from launch_support import logs, processes, records, render_to

pytestmark = pytest.mark.slow


def _drive(tmp_path: Path, rendered) -> None:  # type: ignore[no-untyped-def]
    (cmd,) = rendered.commands
    with processes() as procs:  # the driver starts Ray and stops it; the teardown kills whatever is left
        procs.start(cmd.argv, env={**cmd.env, "RAY_USAGE_STATS_ENABLED": "0"}, cwd=cmd.cwd, log=tmp_path / "ray.log")
        codes = procs.wait_all(timeout=400)
    assert codes == [0], logs(tmp_path / "ray.log")


def test_torch_trainer_with_two_workers(tmp_path: Path, torch_job: Path) -> None:
    plan, rendered = render_to(torch_job, "ray", tmp_path / "run", gpu="A100-80GB", gpus=2, strategy="ddp", device="cpu")
    source = (plan.out / "ray_driver.py").read_text()
    assert "NUM_WORKERS = 2\n" in source and "USE_GPU = False\n" in source and "TorchTrainer(" in source
    _drive(tmp_path, rendered)
    starts = records(plan.out, "start")
    assert [r["rank"] for r in starts] == [0, 1] and len({r["pid"] for r in starts}) == 2
    ends = records(plan.out, "end")
    assert ends[0]["params_sha256"] == ends[1]["params_sha256"]
    assert json.loads((plan.out / "result.json").read_text())["status"] == "completed"


def test_xgboost_trainer_with_two_workers(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB)
    plan, rendered = render_to(job, "ray", tmp_path / "run", cpus=2, options={"workers": 2})
    _drive(tmp_path, rendered)
    ranks = [json.loads(p.read_text()) for p in sorted((plan.out / "ray").glob("rank*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["pid"] for r in ranks}) == 2
    assert sum(r["rows"] for r in ranks) == 600  # each worker trained on its half
    assert ranks[0]["model_sha256"] == ranks[1]["model_sha256"]  # one model, grown together through XGBoost's collective
    assert 0 < ranks[0]["loss"] < 0.69
