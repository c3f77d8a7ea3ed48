"""`trainplan run --ep N`: a small mixture-of-experts model (Qwen3-MoE config.json) trains with its experts split over
the ranks inside FSDP (run/runtime/expert_parallel.py), on CPU over gloo, step for step like FSDP alone; a worker
killed mid-run resumes from the expert-parallel checkpoint; layouts it cannot run are one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

MOE_CONFIG = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
              "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 128}  # fmt: skip


def _job(tmp_path: Path, model: object = None) -> Path:
    from conftest import write_job

    if model is None:
        (tmp_path / "config.json").write_text(json.dumps(MOE_CONFIG))
        model = str(tmp_path / "config.json")
    return write_job(tmp_path / "job.yaml", {
        "name": "tiny-moe", "kind": "transformer", "model": model, "method": "full", "seq_len": 32, "micro_batch": 2,
        "global_batch": 4, "precision": "fp32", "optimizer": "adamw", "steps": 6, "data": "synthetic"})  # fmt: skip


@pytest.mark.slow
def test_expert_parallel_run_trains_like_fsdp_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2 processes, EP 2, against FSDP on 2 (this 2-core machine runs no more FSDP processes; the library test
    ``ep-fsdp`` covers 4 ranks with the experts' FSDP over 2): the same batches reach the same ranks, so every step's
    loss and the saved model agree (fp32, reordered sums)."""
    from conftest import assert_same_training, load_state, run, step_losses

    job = _job(tmp_path)
    ep = run(job, tmp_path / "ep", devices=2, ep=2, checkpoint_every=2)
    dp = run(job, tmp_path / "dp", devices=2, strategy="fsdp")
    assert ep.status == dp.status == "completed" and ep.devices == 2 and ep.strategy == "fsdp"
    a = assert_same_training(tmp_path / "ep", tmp_path / "dp", steps=6)
    assert json.loads((tmp_path / "ep" / "run.json").read_text())["ep"] == 2
    saved = load_state(tmp_path / "ep" / "model.pt")
    assert saved["model.layers.0.mlp.experts.gate_up_proj"].shape[0] == 4  # the whole model, every expert
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "4")
    monkeypatch.setenv("TRAINPLAN_FAULT_RANK", "1")
    killed = run(job, tmp_path / "killed", devices=2, ep=2, checkpoint_every=2)
    assert killed.status == "completed" and killed.restarts == 1
    assert step_losses(tmp_path / "killed")[-1] == pytest.approx(a[-1], rel=1e-6)


DENSE = {"arch": "decoder", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256,
         "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "max_seq_len": 64, "name": "dense"}  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "field", "dense"),
    [
        (["--devices", "3", "--ep", "3"], "--ep", False),  # 3 does not divide the 4 experts
        (["--devices", "2", "--ep", "2", "--strategy", "ddp"], "--strategy", False),
        (["--devices", "3", "--ep", "2"], "--ep", False),  # 2 does not divide 3 processes
        (["--devices", "2", "--ep", "2", "--tp", "2"], "--ep", False),
        (["--devices", "2", "--ep", "2"], "--ep", True),  # a dense model has no experts
        (["--devices", "2", "--ep", "0"], "--ep", False),
    ],
)
def test_run_refuses_an_expert_parallel_layout_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             flags: list[str], field: str, dense: bool) -> None:  # fmt: skip
    from trainplan.cli.main import main

    job = _job(tmp_path, DENSE if dense else None)
    code = main(["run", str(job), "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}:"), err
    assert not (tmp_path / "o").exists()
