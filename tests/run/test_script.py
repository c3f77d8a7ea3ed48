"""`trainplan run --script`: the user's own script under the plan's launcher."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import rank_records, run

from trainplan.errors import SpecError

pytestmark = pytest.mark.slow


def test_script_runs_under_torchrun_with_the_runtime(torch_job, tmp_path, support_dir) -> None:
    out = tmp_path / "run"
    summary = run(torch_job, out, script=support_dir / "script_ok.py", strategy="ddp", devices=2)
    assert summary.status == "completed", summary.message
    ends = rank_records(out, "end")
    assert len({r["pid"] for r in ends}) == 2 and len({r["params_sha256"] for r in ends}) == 1
    assert {r["wrapped_as"] for r in ends} == {"DistributedDataParallel"}
    assert summary.steps == 12 and summary.measured["rows_per_s"] > 0


def test_crashing_script_is_one_line_its_exit_code_and_a_kept_run_dir(cli, torch_job, tmp_path, support_dir) -> None:
    exits_3 = tmp_path / "exits_3.py"
    exits_3.write_text("import sys\nprint('giving up', file=sys.stderr)\nsys.exit(3)\n")
    out = tmp_path / "run"
    for script, code, words in [
        (support_dir / "script_crash.py", 1, "ValueError: bad value in column 3"),
        (exits_3, 3, "giving up"),
    ]:
        proc = subprocess.run(
            [*cli, str(torch_job), "--out", str(out), "--overwrite", "--script", str(script), "--json"],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == code
        message = [ln for ln in proc.stderr.splitlines() if "failed" in ln]
        assert len(message) == 1 and words in message[0] and script.name in message[0]
        assert "Traceback" not in proc.stderr
        assert json.loads(proc.stdout.strip().splitlines()[-1])["status"] == "failed"
        assert json.loads((out / "summary.json").read_text())["status"] == "failed"
        assert words in (out / "launch.log").read_text()  # the full story stays in the run directory


def test_missing_script_is_refused_before_launch(torch_job, tmp_path) -> None:
    with pytest.raises(SpecError) as err:
        run(torch_job, tmp_path / "run", script=tmp_path / "nope.py")
    assert err.value.field == "--script" and not (tmp_path / "run").exists()


def test_a_script_needs_no_model_fields(tmp_path, support_dir) -> None:
    """--script alone (no job file) and a `kind: script` job: the script's own steps, nothing predicted."""
    out = tmp_path / "bare"
    summary = run(None, out, script=support_dir / "script_ok.py", steps=5, strategy="ddp", devices=2)
    assert summary.status == "completed", summary.message
    assert summary.kind == "script" and summary.steps == 5 and summary.measured["step_time_s"] > 0
    assert all(v is None for v in summary.predicted.values()) and "describes no model" in summary.prediction_note
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "event" not in r] == [1, 2, 3, 4, 5]  # progress from the script's steps
    job = tmp_path / "script.yaml"
    job.write_text("kind: script\nname: mine\nsteps: 4\nmicro_batch: 4\nglobal_batch: 8\n")
    summary = run(job, tmp_path / "job", script=support_dir / "script_ok.py", strategy="single")
    assert summary.status == "completed" and summary.steps == 4
    assert json.loads((tmp_path / "job" / "run.json").read_text())["grad_accum"] == 2


def test_a_script_without_the_runtime_is_timed_not_compared(torch_job, tmp_path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text("import time\ntime.sleep(0.2)\nprint('trained')\n")
    summary = run(torch_job, tmp_path / "run", script=plain, strategy="single")
    assert summary.status == "completed" and summary.steps == 0
    assert summary.measured["train_s"] >= 0.2
    assert all(v is None for v in summary.predicted.values()) and all(v is None for v in summary.error.values())
    assert any("did not report steps" in n for n in summary.notes)


def test_script_jobs_are_refused_where_a_model_is_needed(tmp_path) -> None:
    from trainplan.planner import plan_job
    from trainplan.spec import load_job

    job = tmp_path / "script.yaml"
    job.write_text("kind: script\nsteps: 3\n")
    with pytest.raises(SpecError) as err:
        run(job, tmp_path / "run")
    assert err.value.field == "kind" and "--script" in str(err.value)
    with pytest.raises(SpecError) as err:
        plan_job(load_job(job))
    assert err.value.field == "kind" and "nothing to plan" in str(err.value)
    with pytest.raises(SpecError) as err:
        run(None, tmp_path / "run2", script=tmp_path / "x.py")
    assert err.value.field == "--steps"
    job.write_text("kind: script\n")
    with pytest.raises(SpecError) as err:
        load_job(job)
    assert "give steps" in str(err.value)
