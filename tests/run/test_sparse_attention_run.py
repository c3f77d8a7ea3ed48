"""`trainplan run` trains a DeepSeek Sparse Attention model (DeepSeek-V3.2) the way transformers builds it: the run
completes and the model it built has the parameters the prediction counts, indexers included."""

from __future__ import annotations

import json

import pytest
from conftest import run, write_job

from trainplan.estimate.architecture import param_counts
from trainplan.run.workloads.checks import resolve_arch
from trainplan.spec import parse_job

transformers = pytest.importorskip("transformers")

CONFIG = {"model_type": "deepseek_v32", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 101, "pad_token_id": 0,
          "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
          "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "index_n_heads": 2, "index_head_dim": 8,
          "index_topk": 8}  # fmt: skip


@pytest.mark.slow
def test_a_deepseek_v32_run_builds_what_it_predicts(tmp_path) -> None:
    from trainplan.estimate.hf_check import transformers_param_count

    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    spec = {"kind": "transformer", "name": "dsv32", "model": str(tmp_path / "config.json"), "seq_len": 16,
            "micro_batch": 2, "steps": 2, "precision": "fp32"}  # fmt: skip
    summary = run(write_job(tmp_path / "job.yaml", spec, data="synthetic"), tmp_path / "run")
    assert summary.status == "completed", summary.message
    built = json.loads((tmp_path / "run" / "result.json").read_text())["workload"]["params"]
    arch = resolve_arch(parse_job(spec))
    assert arch.indexer is not None and arch.indexer_layers == 3
    assert built == transformers_param_count(CONFIG) == param_counts(arch).total
