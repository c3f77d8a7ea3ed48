"""The warm worker (run/launch.py ``WarmWorker``): while `trainplan run` tokenizes a pretrained job's data, a worker
interpreter already imports torch and transformers; a one-process launch is handed to it, anything else ends it."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from conftest import run, write_job
from test_finetune import ckpt, data, job  # noqa: F401 - module fixtures reused
from trainplan.errors import SpecError
from trainplan.run import launch
from trainplan.run.api import RunRequest, execute

pytest.importorskip("transformers")


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """Record every warm worker started and what each hand-over returned."""
    seen: dict[str, list] = {"started": [], "taken": []}
    start, take = launch.WarmWorker.start, launch.WarmWorker.take

    def recording_start(self: launch.WarmWorker) -> None:
        start(self)
        seen["started"].append(self.proc)

    def recording_take(self: launch.WarmWorker, spec: launch.LaunchSpec, log_path: Path):
        proc = take(self, spec, log_path)
        seen["taken"].append(proc)
        return proc

    monkeypatch.setattr(launch.WarmWorker, "start", recording_start)
    monkeypatch.setattr(launch.WarmWorker, "take", recording_take)
    return seen


@pytest.mark.slow
def test_a_one_process_finetune_runs_in_the_warm_worker(tmp_path, ckpt, data, handed) -> None:
    out = tmp_path / "run"
    summary = run(write_job(tmp_path / "job.yaml", job(ckpt, data["instruction"], steps=3)), out)
    assert summary.status == "completed", summary.message
    assert len(handed["started"]) == 1 and handed["taken"] == handed["started"]  # the same process trained
    assert handed["started"][0].returncode == 0
    log = (out / "launch.log").read_text()
    assert log.startswith("$ ") and "trainplan.run.worker" in log.splitlines()[0]
    assert (out / "final" / "model.safetensors").is_file()


def test_bad_data_found_while_tokenizing_ends_the_warm_worker(tmp_path, ckpt, handed) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no text field"}\n' * 20)
    with pytest.raises(SpecError):
        execute(RunRequest(job_path=write_job(tmp_path / "j.yaml", job(ckpt, bad)), out=tmp_path / "out"))
    assert len(handed["started"]) == 1 and handed["taken"] == []
    assert handed["started"][0].poll() is not None  # ended, not left behind
    assert not (tmp_path / "out").exists()


def test_a_launch_it_cannot_run_ends_it_and_falls_back(tmp_path) -> None:
    warm = launch.WarmWorker()
    warm.start()
    proc = warm.proc
    torchrun = launch.LaunchSpec(argv=[sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "x"], env={})
    assert warm.take(torchrun, tmp_path / "launch.log") is None
    # ended, not left behind: a closed stdin ends it once its imports are done (exit 0); one still importing after
    # launch._close's 5 s (a loaded 2-core CI machine took longer) is killed
    assert proc is not None and proc.returncode in (0, -signal.SIGKILL) and warm.proc is None
    warm.discard()  # nothing left to discard
