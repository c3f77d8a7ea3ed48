"""The `trainplan run` command: --json output, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import TABULAR_JOB, TORCH_JOB, write_job

from trainplan.cli.main import main

KEYS = {"step_time_s", "peak_gib", "rows_per_s", "train_s", "final_loss"}


@pytest.mark.slow
def test_json_is_the_last_stdout_line_and_the_run_dir_has_everything(cli, torch_job, tmp_path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [*cli, str(torch_job), "--out", str(out), "--steps", "5", "--checkpoint-every", "2", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == "completed" and result["out"] == str(out)
    assert set(result["measured"]) == set(result["predicted"]) == KEYS
    assert result["steps"] == 5 and all(result["measured"][k] is not None for k in KEYS)
    assert (out / "metrics.jsonl").exists() and (out / "model.pt").exists()
    assert json.loads((out / "summary.json").read_text()) == result
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["step"] == 4


def _errors(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(["run", *argv])
    err = capsys.readouterr().err
    return code, err


@pytest.mark.parametrize(
    "case,option_words",
    [
        ("missing-job", "job file not found"),
        ("bad-strategy", "--strategy: must be one of single, ddp"),
        ("too-many-devices", "--devices: this machine has"),
        ("zero-steps", "--steps: must be >= 1"),
        ("resume-nothing", "--resume: no trainplan run"),
        ("dir-exists", "--out: "),
        ("missing-data", "data: data file not found"),
        ("wrong-target", "target: column 'label' is not in"),
        ("bad-model", "model: cannot import module"),
        ("not-a-module", "model: 'tp_run_models' has no callable"),
        ("encoder", "model.arch: trainplan run builds decoder models only"),
        ("optimizer", "optimizer: trainplan run supports adamw"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, tmp_path, case, option_words) -> None:
    job = write_job(tmp_path / "job.yaml", TORCH_JOB)
    out = tmp_path / "run"
    args = [str(job), "--out", str(out)]
    if case == "missing-job":
        args[0] = str(tmp_path / "nope.yaml")
    elif case == "bad-strategy":
        args += ["--strategy", "turbo"]
    elif case == "too-many-devices":
        args += ["--devices", "4096"]
    elif case == "zero-steps":
        args += ["--steps", "0"]
    elif case == "resume-nothing":
        args += ["--resume"]
    elif case == "dir-exists":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case in ("missing-data", "wrong-target"):
        (tmp_path / "t.csv").write_text("a,b,y\n1,2,0\n")
        data = str(tmp_path / "missing.csv") if case == "missing-data" else str(tmp_path / "t.csv")
        write_job(job, TABULAR_JOB, data=data, target="label")
    elif case == "bad-model":
        write_job(job, TORCH_JOB, model="no_such_pkg.models:net")
    elif case == "not-a-module":
        write_job(job, TORCH_JOB, model="tp_run_models:nothing_here")
    elif case == "encoder":
        arch = {"arch": "encoder", "layers": 2, "hidden": 32, "heads": 2, "ffn_hidden": 64, "vocab": 100}
        write_job(job, {"kind": "transformer", "model": arch, "seq_len": 16, "micro_batch": 2, "steps": 2})
    elif case == "optimizer":
        write_job(job, TORCH_JOB, optimizer="lion")
    code, err = _errors(capsys, args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and option_words in lines[0], err
    assert "Traceback" not in err
    if case == "dir-exists":
        assert (out / "notes.txt").read_text() == "mine"
    elif case != "resume-nothing":
        assert not out.exists()


def test_real_entry_point_passes_on_a_crashed_runs_exit_code(tmp_path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import sys\nsys.exit(5)\n")
    job = write_job(tmp_path / "job.yaml", TORCH_JOB)
    proc = subprocess.run(
        [sys.executable, "-m", "trainplan.cli.main", "run", str(job), "--out", str(tmp_path / "r"), "--script", str(script)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 5
