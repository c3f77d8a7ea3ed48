"""A tabular job that names its library release (``library_version``): a launch to other machines pins that release
in what the nodes install and the worker refuses another one where it runs; only a launch that runs here checks this
environment's release."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TABULAR_JOB, write_job
from launch_support import render_to

from trainplan.errors import SpecError
from trainplan.run.api import library_pin


def _other_release() -> str:
    """A measured XGBoost release whose major.minor is not the installed one."""
    import xgboost

    installed = xgboost.__version__.split(".")[:2]
    return next(r for r in ("2.1.4", "1.7.6") if r.split(".")[:2] != installed)


def test_the_pin_is_the_release_or_its_series() -> None:
    from trainplan.spec import parse_job

    job = parse_job({**TABULAR_JOB, "library_version": "1.7.6"})
    assert library_pin(job) == "xgboost==1.7.6"
    assert library_pin(job.model_copy(update={"library_version": "1.7"})) == "xgboost==1.7.*"
    assert library_pin(parse_job(TABULAR_JOB)) is None


def test_a_remote_launch_pins_the_release_and_the_worker_refuses_another(tmp_path: Path) -> None:
    release = _other_release()
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, library_version=release)
    # this machine's release is not the job's: a local launch is refused, one to other machines renders
    with pytest.raises(SpecError) as err:
        render_to(job, "local", tmp_path / "local")
    assert err.value.field == "library_version"

    _, sky = render_to(job, "skypilot", tmp_path / "sky", cpus=4)
    setup = yaml.safe_load((tmp_path / "sky" / "task.yaml").read_text())["setup"]
    assert setup.split()[:2] == ["pip", "install"] and setup.split()[-1] == f"xgboost=={release}"

    plan, slurm = render_to(job, "slurm", tmp_path / "slurm", cpus=4, options={"partition": "cpu"})
    assert any(f"'xgboost=={release}'" in n for n in slurm.notes)

    _, dask = render_to(job, "dask", tmp_path / "dask", options={"address": "tcp://10.0.0.1:8786"})
    assert any(f"xgboost=={release}" in n and "cluster's workers" in n for n in dask.notes)

    # the worker the SLURM script starts, on a node with another release: one line, exit 2, nothing trained
    done = subprocess.run([sys.executable, "-m", "trainplan.run.worker", str(tmp_path / "slurm" / "run.json")],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: library_version: the job names xgboost {release} but ")
    assert not (tmp_path / "slurm" / "result.json").exists()


def test_a_job_without_a_release_installs_no_pin(tmp_path: Path) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB)
    render_to(job, "skypilot", tmp_path / "sky", cpus=4)
    setup = yaml.safe_load((tmp_path / "sky" / "task.yaml").read_text())["setup"]
    assert "xgboost" not in setup
