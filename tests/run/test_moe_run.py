"""A mixture-of-experts config (Qwen3-MoE) read by trainplan trains for real through trainplan run, and traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

CONFIG = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 4,
          "num_experts_per_tok": 2, "vocab_size": 256, "max_position_embeddings": 128}  # fmt: skip


def _job(tmp_path: Path, **extra: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    lines = {"name": "tiny-moe", "kind": "transformer", "model": str(tmp_path / "config.json"), "method": "full",
             "seq_len": "32", "micro_batch": "2", "precision": "fp32", "optimizer": "adamw", "steps": "4",
             "data": "synthetic", **extra}  # fmt: skip
    job = tmp_path / "job.yaml"
    job.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return job


def _run(job: Path, out: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "trainplan.cli.main", "run", str(job), "--out", str(out), "--json", *args],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_moe_trains_alike_under_ddp_and_fsdp(tmp_path: Path) -> None:
    """Two CPU processes over gloo: the experts' weights replicated (DDP) or sharded (FSDP2), the same data."""
    job = _job(tmp_path)
    ddp = _run(job, tmp_path / "ddp", "--strategy", "ddp", "--devices", "2")
    fsdp = _run(job, tmp_path / "fsdp", "--strategy", "fsdp", "--devices", "2")
    assert ddp["devices"] == fsdp["devices"] == 2
    assert fsdp["measured"]["final_loss"] == pytest.approx(ddp["measured"]["final_loss"], rel=1e-5)
    assert 4.0 < ddp["measured"]["final_loss"] < 6.0  # about log(256) = 5.55 after 4 steps from random weights


def test_a_moe_config_traces_in_bf16_pure(tmp_path: Path) -> None:
    from trainplan.estimate.architecture import param_counts
    from trainplan.estimate.torchjob import trace_transformer_job
    from trainplan.hfconfig import arch_from_hf_config
    from trainplan.spec import load_job

    job = load_job(_job(tmp_path, precision="bf16-pure"))
    profile = trace_transformer_job(job)
    assert profile.params.total == param_counts(arch_from_hf_config(CONFIG)).total
