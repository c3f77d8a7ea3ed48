"""Tensor + sequence parallel, pipeline parallel (1F1B and interleaved) and 2-D tensor × FSDP runs of a small Llama,
and expert parallel (alone and inside FSDP) of a small Qwen3-MoE, on CPU over gloo (trainplan.run.runtime.model_parallel,
expert_parallel): each layout's loss and every gradient equal one process on the same batch.  Tolerance: 1e-5 relative on the loss, 1e-5 of each gradient's largest element (fp32; the sums are
reordered across ranks)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch.distributed.pipelining")

SUPPORT = Path(__file__).parent / "model_parallel_support.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("case", "procs"), [("tp", 2), ("tp-sp", 2), ("pp", 2), ("pp-interleaved", 2), ("tp-fsdp", 4),
                                            ("ep", 2), ("ep-fsdp", 4)])
def test_layout_trains_like_one_process(case: str, procs: int, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()),
           str(SUPPORT), case, str(out)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers: none may outlive the test
        proc.communicate()
        raise
    assert proc.returncode == 0, stderr[-3000:]
    ranks = json.loads(out.read_text())
    assert len(ranks) == procs
    for r in ranks:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5)
        assert r["worst_grad_rel"] < 1e-5
        assert r["grads"] > 0
    if case.startswith("ep"):  # a small Qwen3-MoE: both MoE layers' experts split over the ranks
        assert all(r["expert_parallel_modules"] == 2 for r in ranks)
    if case.startswith("pp"):
        # each stage holds only its own blocks' parameters: together they cover the model once
        assert sum(r["grads"] for r in ranks) == 39


# ----------------------------------------------------------------------------- `trainplan run --tp N [--sp]`

TINY_LLAMA_JOB = {
    "name": "tiny-tp", "kind": "transformer",
    "model": {"arch": "decoder", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256,
              "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "max_seq_len": 64, "name": "tiny"},
    "method": "full", "seq_len": 32, "micro_batch": 2, "global_batch": 4, "precision": "fp32", "optimizer": "adamw",
    "steps": 6,
}  # fmt: skip


@pytest.mark.slow
def test_run_with_tensor_and_sequence_parallel_trains_like_fsdp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 processes: TP 2 + SP inside FSDP over 2 data-parallel ranks, against FSDP on 2 processes — the same
    batches reach the same ranks, so every step's loss agrees (fp32 on CPU, reordered sums: 1e-5); a worker killed at
    step 4 is restarted, resumes from its 2-D (DTensor) checkpoint and ends on the same loss."""
    from conftest import run, step_losses, write_job

    job = write_job(tmp_path / "job.yaml", TINY_LLAMA_JOB)
    tp = run(job, tmp_path / "tp", devices=4, tp=2, sequence_parallel=True, checkpoint_every=2)
    dp = run(job, tmp_path / "dp", devices=2, strategy="fsdp")
    assert tp.status == dp.status == "completed"
    assert tp.devices == 4 and tp.strategy == "fsdp"
    a, b = step_losses(tmp_path / "tp"), step_losses(tmp_path / "dp")
    assert len(a) == len(b) == 6
    assert a == pytest.approx(b, rel=1e-5)
    config = json.loads((tmp_path / "tp" / "run.json").read_text())
    assert config["tp"] == 2 and config["sequence_parallel"] is True and config["grad_accum"] == 1
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "4")
    monkeypatch.setenv("TRAINPLAN_FAULT_RANK", "1")
    killed = run(job, tmp_path / "killed", devices=4, tp=2, sequence_parallel=True, checkpoint_every=2)
    assert killed.status == "completed" and killed.restarts == 1
    assert step_losses(tmp_path / "killed")[-1] == pytest.approx(a[-1], rel=1e-6)


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        (["--devices", "4", "--tp", "3"], "--tp"),
        (["--devices", "4", "--tp", "2", "--strategy", "ddp"], "--strategy"),
        (["--devices", "2", "--sp"], "--sp"),
        (["--devices", "4", "--tp", "4"], "--tp"),  # 4 does not divide the 2 key-value heads
        (["--devices", "2", "--tp", "2", "gpt2"], "--tp"),  # a GPT-2-style model: not a Llama-family block
    ],
)
def test_run_refuses_a_tensor_parallel_layout_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          flags: list[str], field: str) -> None:  # fmt: skip
    from conftest import write_job

    from trainplan.cli.main import main

    base = TINY_LLAMA_JOB
    if "gpt2" in flags:
        flags = [f for f in flags if f != "gpt2"]
        base = {**TINY_LLAMA_JOB, "model": {"arch": "decoder", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256,
                                            "vocab": 256, "position": "learned", "norm": "layernorm", "mlp": "gelu",
                                            "bias": True, "max_seq_len": 64, "name": "g"}}  # fmt: skip
    job = write_job(tmp_path / "job.yaml", base)
    code = main(["run", str(job), "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}:"), err
    assert not (tmp_path / "o").exists()
