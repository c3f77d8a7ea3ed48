"""Models whose transformers class has no PyTorch SDPA path (gpt-oss's attention sinks, Gemma 2's soft-capped
scores) train through ``trainplan run`` with the attention the estimate prices (eager under ``auto``), and
``flash_attention: true`` without the flash-attn package is refused in one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import refused, run, write_job

pytest.importorskip("transformers")

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "vocab_size": 256, "max_position_embeddings": 128}  # fmt: skip
CONFIGS = {
    "gpt_oss": {"model_type": "gpt_oss", **TINY, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"]},
    "gemma2": {"model_type": "gemma2", **TINY, "intermediate_size": 128, "sliding_window": 16},
}  # fmt: skip


def _spec(tmp_path: Path, model_type: str, **extra: Any) -> dict[str, Any]:
    config = tmp_path / f"{model_type}.json"
    config.write_text(json.dumps(CONFIGS[model_type]))
    return {"name": f"tiny-{model_type}", "kind": "transformer", "model": str(config), "method": "full", "seq_len": 32,
            "micro_batch": 2, "precision": "fp32", "optimizer": "adamw", "steps": 3, "data": "synthetic", **extra}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_a_model_without_sdpa_trains_with_eager_attention(tmp_path: Path, model_type: str) -> None:
    from trainplan.estimate.transformer import hf_attention
    from trainplan.run.workloads.checks import resolve_arch
    from trainplan.spec import parse_job

    spec = _spec(tmp_path, model_type)
    assert hf_attention(parse_job(spec), resolve_arch(parse_job(spec))) == "eager"
    summary = run(write_job(tmp_path / "job.yaml", spec), tmp_path / "out")
    assert summary.status == "completed" and summary.steps == 3
    assert 4.0 < summary.measured["final_loss"] < 7.0  # about log(256) = 5.55 from random weights


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="flash-attn installed: true is allowed")
def test_flash_attention_true_without_the_package_is_refused(tmp_path: Path) -> None:
    err = refused(tmp_path, _spec(tmp_path, "gemma2", flash_attention=True))
    assert err.field == "flash_attention" and "install flash-attn" in str(err)


def test_flash_attention_true_for_gpt_oss_is_refused_whatever_is_installed(tmp_path: Path) -> None:
    """The flash-attn 2 package takes no sinks: transformers would drop them silently (s_aux goes only to kernels
    that accept it), so trainplan run refuses rather than train another model."""
    err = refused(tmp_path, _spec(tmp_path, "gpt_oss", flash_attention=True))
    assert err.field == "flash_attention" and "drops gpt-oss's attention sinks" in str(err)
