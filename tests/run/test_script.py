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
