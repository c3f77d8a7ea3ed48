"""Interruptions: SIGKILL then --resume, elastic restarts, SIGTERM preemption.

With a fixed seed a run that is killed and resumed must end exactly where an
uninterrupted run ends (same loss, same weights): data order comes from the
step number and the RNG state is restored from the checkpoint.  The test
model has dropout, so a lost RNG state would show.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import TORCH_JOB, assert_same_weights, rank_records, run, write_job

from trainplan.run.api import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.slow


def _latest_step(out: Path) -> int:
    return json.loads((out / "checkpoints" / "latest.json").read_text())["step"]


def test_sigkilled_run_resumes_to_the_uninterrupted_result(baseline, torch_job, tmp_path, monkeypatch) -> None:
    reference, ref_out = baseline("single")
    out = tmp_path / "run"
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "6")
    killed = run(torch_job, out, checkpoint_every=4)
    assert killed.status == "failed" and killed.exit_code == 1
    assert "killed by SIGKILL" in killed.message
    assert _latest_step(out) == 4  # the checkpoint before the kill survived
    assert not list((out / "checkpoints").glob("*.partial"))

    monkeypatch.delenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP")
    resumed = run(torch_job, out, checkpoint_every=4, resume=True)
    assert resumed.status == "completed", resumed.message
    assert resumed.measured["final_loss"] == pytest.approx(reference.measured["final_loss"], rel=1e-6)
    assert_same_weights(out / "model.pt", ref_out / "model.pt")
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "event" not in r]
    assert steps == list(range(1, TORCH_JOB["steps"] + 1))  # lines past the checkpoint were dropped, then redone
    assert any(r.get("event") == "resume" and r["step"] == 4 for r in records)


@pytest.mark.parametrize("strategy, damaged", [("single", "optim.pt"), ("zero2", "deepspeed")])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    baseline, torch_job, tmp_path, monkeypatch, strategy, damaged
) -> None:
    """Bytes flipped in the newest checkpoint (a torch file, or DeepSpeed's own): resume skips it, says why, and
    still ends with the uninterrupted run's weights."""
    devices = 1 if strategy == "single" else 2
    reference, ref_out = baseline(strategy)
    out = tmp_path / "run"
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "10")
    killed = run(torch_job, out, strategy=strategy, devices=devices, checkpoint_every=4, max_restarts=0)
    monkeypatch.delenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP")
    assert killed.status == "failed" and _latest_step(out) == 8
    newest = out / "checkpoints" / "step_00000008"
    victim = max((p for p in (newest / damaged).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size) \
        if damaged == "deepspeed" else newest / damaged
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    resumed = run(torch_job, out, strategy=strategy, devices=devices, checkpoint_every=4, resume=True)
    assert resumed.status == "completed", resumed.message
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    skipped = [r for r in records if r.get("event") == "checkpoint_skipped"]
    assert len(skipped) == 1 and skipped[0]["why"].startswith("step_00000008: ") and "SHA-256" in skipped[0]["why"]
    assert any(r.get("event") == "resume" and r["step"] == 4 for r in records)
    assert "skipped checkpoint step_00000008" in (out / "launch.log").read_text()
    assert resumed.measured["final_loss"] == pytest.approx(reference.measured["final_loss"], rel=1e-6)
    if strategy == "single":
        assert_same_weights(out / "model.pt", ref_out / "model.pt")


@pytest.mark.parametrize("strategy", ["fsdp", "zero2"])
def test_elastic_restart_after_a_worker_is_sigkilled(baseline, torch_job, tmp_path, monkeypatch, strategy) -> None:
    reference, ref_out = baseline(strategy)
    out = tmp_path / "run"
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "6")
    monkeypatch.setenv("TRAINPLAN_FAULT_RANK", "1")
    summary = run(torch_job, out, strategy=strategy, devices=2, checkpoint_every=4, max_restarts=1)
    assert summary.status == "completed", summary.message
    assert summary.restarts == 1
    ends = rank_records(out, "end")
    assert [r["restart_count"] for r in ends] == [1, 1]
    assert len({r["pid"] for r in ends}) == 2
    assert len({r["params_sha256"] for r in ends}) == 1
    assert summary.measured["final_loss"] == pytest.approx(reference.measured["final_loss"], rel=1e-6)
    assert_same_weights(out / "model.pt", ref_out / "model.pt")


def _wait_for_step(metrics: Path, step: int, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        if metrics.exists():
            done = [json.loads(x).get("step", 0) for x in metrics.read_text().splitlines() if '"event"' not in x]
            if done and max(done) >= step:
                return
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout_s} s")


@pytest.mark.parametrize("strategy,devices", [("single", 1), ("ddp", 2)])
def test_sigterm_checkpoints_and_exits_preempted(cli, tmp_path, strategy, devices) -> None:
    job = write_job(tmp_path / "job.yaml", TORCH_JOB, model="tp_run_models:slow", model_args={"delay": 0.05}, steps=40)
    out = tmp_path / "run"
    argv = [*cli, str(job), "--out", str(out), "--strategy", strategy, "--devices", str(devices), "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(out / "metrics.jsonl", 3, proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == PREEMPTED_EXIT_CODE, stderr
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["status"] == "preempted"
    assert "--resume" in stderr and "Traceback" not in stderr
    stopped_at = _latest_step(out)
    assert 3 <= stopped_at < 40
    assert len(rank_records(out, "end")) == devices  # every rank stopped at the same step, cleanly
    # resuming is covered by the SIGKILL tests above and, after SIGTERM, by test_runtime


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGHUP])
def test_the_workers_stop_with_their_launcher(cli, tmp_path, how) -> None:
    """A launcher killed outright (or its terminal closed) leaves no orphans: torchrun and the workers get SIGTERM,
    checkpoint and stop, and the run resumes; the run directory's lock dies with the launcher."""
    import os

    job = write_job(tmp_path / "job.yaml", TORCH_JOB, model="tp_run_models:slow", model_args={"delay": 0.05}, steps=40)
    out = tmp_path / "run"
    argv = [*cli, str(job), "--out", str(out), "--strategy", "ddp", "--devices", "2", "--json"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_step(out / "metrics.jsonl", 3, proc)
        pids = [r["pid"] for r in rank_records(out, "start")]
        assert len(pids) == 2
        proc.send_signal(how)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if how is signal.SIGHUP:
        assert proc.returncode == PREEMPTED_EXIT_CODE  # forwarded like SIGTERM: a checkpoint and a summary
    deadline = time.monotonic() + 60
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "workers outlived their launcher"
    stopped_at = _latest_step(out)
    assert 3 <= stopped_at < 40  # they checkpointed on the way out
    resumed = run(job, out, strategy="ddp", devices=2, resume=True)
    assert resumed.status == "completed", resumed.message
    assert os.path.exists(out / ".lock")


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False
