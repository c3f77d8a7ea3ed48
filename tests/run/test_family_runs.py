"""`trainplan run` trains the 2026 families the way transformers builds them: DeepSeek Sparse Attention (DeepSeek-V3.2,
its indexers included) and a config.json whose model_type transformers does not ship for a model a shipped class
builds (Kimi K2: DeepSeek-V3). Each run completes and builds the parameters the prediction counts."""

from __future__ import annotations

import json

import pytest
from conftest import run, write_job

from trainplan.estimate.architecture import param_counts
from trainplan.run.workloads.checks import resolve_arch
from trainplan.spec import parse_job

transformers = pytest.importorskip("transformers")

LATENT = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 4,
          "vocab_size": 101, "pad_token_id": 0, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
          "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": 24,
          "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12}  # fmt: skip
DSV32 = {**LATENT, "model_type": "deepseek_v32", "num_hidden_layers": 3, "index_n_heads": 2, "index_head_dim": 8,
         "index_topk": 8}  # fmt: skip
KIMI = {**LATENT, "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 2,
        "num_nextn_predict_layers": 0, "scoring_func": "sigmoid", "topk_method": "noaux_tc"}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("config", [DSV32, KIMI], ids=["deepseek_v32", "kimi_k2"])
def test_the_run_builds_what_it_predicts(tmp_path, config: dict) -> None:
    from trainplan.estimate.hf_check import transformers_param_count

    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = {"kind": "transformer", "name": "family", "model": str(tmp_path / "config.json"), "seq_len": 16,
            "micro_batch": 2, "steps": 2, "precision": "fp32"}  # fmt: skip
    summary = run(write_job(tmp_path / "job.yaml", spec, data="synthetic"), tmp_path / "run")
    assert summary.status == "completed", summary.message
    built = json.loads((tmp_path / "run" / "result.json").read_text())["workload"]["params"]
    arch = resolve_arch(parse_job(spec))
    assert built == transformers_param_count(config) == param_counts(arch).total
    if config is DSV32:
        assert arch.indexer is not None and arch.indexer_layers == 3
    else:  # built as DeepSeek-V3, which transformers ships
        assert transformers_param_count({**config, "model_type": "deepseek_v3"}) == built
