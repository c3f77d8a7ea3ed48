"""transformers builds no DeepSeek-V3 or GLM-4.5 multi-token-prediction module, so `trainplan run` predicts the model it trains
without them and says so; `plan` and `estimate` keep counting them (Megatron and torchtitan recipes train them)."""

from __future__ import annotations

import json

import pytest
from conftest import run, write_job

from trainplan.estimate.architecture import param_counts
from trainplan.run.api import check_job, stack_notes
from trainplan.run.workloads.checks import as_built, resolve_arch
from trainplan.spec import parse_job

transformers = pytest.importorskip("transformers")

CONFIG = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 101, "pad_token_id": 0,
          "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
          "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "num_nextn_predict_layers": 1}  # fmt: skip
# GLM-4.5's layout (grouped-query attention with q, k, v biases and q/k norms, DeepSeek-V3's MoE and MTP layer)
GLM = {"model_type": "glm4_moe", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 101, "pad_token_id": 0,
       "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
       "first_k_dense_replace": 1, "attention_bias": True, "use_qk_norm": True, "num_nextn_predict_layers": 1}  # fmt: skip


def _job(tmp_path, config=CONFIG, **changes):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, **changes}))
    return {"kind": "transformer", "name": config["model_type"].replace("_", "-"), "model": str(path), "seq_len": 16,
            "micro_batch": 2, "steps": 2, "precision": "fp32"}  # fmt: skip


@pytest.mark.parametrize("config", [CONFIG, GLM], ids=["deepseek_v3", "glm4_moe"])
def test_the_prediction_counts_what_transformers_builds(tmp_path, config) -> None:
    from trainplan.estimate.hf_check import transformers_param_count

    job = parse_job(_job(tmp_path, config))
    counts = param_counts(resolve_arch(job))
    assert counts.mtp > 0  # the plan's count includes the module
    built, note = as_built(job)
    assert param_counts(resolve_arch(built)).total == transformers_param_count(config) == counts.total - counts.mtp
    assert "1 multi-token-prediction module" in note
    assert job.model.endswith("config.json")  # the user's job is not changed
    checked = check_job(job, None)
    assert resolve_arch(checked).mtp_layers == 0
    assert any("multi-token-prediction" in n for n in stack_notes(job, None))


def test_a_model_without_the_module_is_unchanged(tmp_path) -> None:
    job = parse_job(_job(tmp_path, num_nextn_predict_layers=0))
    assert as_built(job) == (job, None)
    assert stack_notes(job, None) == ()


@pytest.mark.slow
@pytest.mark.parametrize("config", [CONFIG, GLM], ids=["deepseek_v3", "glm4_moe"])
def test_a_run_says_so_and_builds_what_it_predicts(tmp_path, config) -> None:
    from trainplan.estimate.hf_check import transformers_param_count

    job = parse_job(_job(tmp_path, config))
    summary = run(write_job(tmp_path / "job.yaml", _job(tmp_path, config), data="synthetic"), tmp_path / "run")
    assert summary.status == "completed", summary.message
    assert any("multi-token-prediction" in n for n in summary.notes)
    built = json.loads((tmp_path / "run" / "result.json").read_text())["workload"]["params"]
    assert built == transformers_param_count(config) == param_counts(resolve_arch(check_job(job, None))).total
