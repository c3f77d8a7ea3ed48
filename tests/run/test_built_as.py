"""A config.json whose model_type transformers does not ship, for a model a shipped class builds (Kimi K2: DeepSeek-V3),
is run as that class: `trainplan run` completes and builds the parameters the prediction counts."""

from __future__ import annotations

import json

import pytest
from conftest import run, write_job

from trainplan.estimate.architecture import param_counts
from trainplan.run.workloads.checks import resolve_arch
from trainplan.spec import parse_job

transformers = pytest.importorskip("transformers")

KIMI = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 101, "pad_token_id": 0,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
        "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "num_nextn_predict_layers": 0,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc"}  # fmt: skip


@pytest.mark.slow
def test_a_kimi_k2_config_runs_as_deepseek_v3(tmp_path) -> None:
    from trainplan.estimate.hf_check import transformers_param_count

    (tmp_path / "config.json").write_text(json.dumps(KIMI))
    spec = {"kind": "transformer", "name": "kimi", "model": str(tmp_path / "config.json"), "seq_len": 16,
            "micro_batch": 2, "steps": 2, "precision": "fp32"}  # fmt: skip
    summary = run(write_job(tmp_path / "job.yaml", spec, data="synthetic"), tmp_path / "run")
    assert summary.status == "completed", summary.message
    built = json.loads((tmp_path / "run" / "result.json").read_text())["workload"]["params"]
    assert built == transformers_param_count(KIMI) == param_counts(resolve_arch(parse_job(spec))).total
    assert transformers_param_count({**KIMI, "model_type": "deepseek_v3"}) == built
