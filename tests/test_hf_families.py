"""Every model family trainplan claims is read exactly (parameter counts equal transformers') or refused.

transformers builds each config on the meta device (no memory, no weights, offline) and is the reference.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from trainplan.catalog import get_catalog, resolve_model
from trainplan.errors import SpecError
from trainplan.estimate.architecture import param_counts
from trainplan.estimate.compute import training_step_flops
from trainplan.estimate.hf_check import CountMismatch, cross_check, read_hf_config, transformers_param_count
from trainplan.hfconfig import READERS, ConfigRefused, arch_from_hf_config
from trainplan.spec import Checkpointing

transformers = pytest.importorskip("transformers")

TINY = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 101, "pad_token_id": 0}  # fmt: skip

# Small configs that switch on each feature a reader models (beside each family's default config below).
VARIANTS = [
    {"model_type": "llama", **TINY, "attention_bias": True, "tie_word_embeddings": True},
    {"model_type": "mistral", **TINY, "head_dim": 32, "sliding_window": 8},
    {"model_type": "qwen2", **TINY, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2},
    {"model_type": "qwen3", **TINY, "head_dim": 8, "attention_bias": True},
    {"model_type": "gemma2", **TINY, "head_dim": 32, "final_logit_softcapping": None},
    {"model_type": "gemma3_text", **TINY, "head_dim": 16, "sliding_window": 8},
    {"model_type": "phi3", **TINY, "tie_word_embeddings": True},
    {"model_type": "mixtral", **TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
    {"model_type": "qwen2_moe", **TINY, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
     "shared_expert_intermediate_size": 40, "decoder_sparse_step": 2, "mlp_only_layers": [3]},
    {"model_type": "qwen2_moe", **TINY, "num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
     "shared_expert_intermediate_size": 0, "qkv_bias": False},
    {"model_type": "qwen3_moe", **TINY, "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 16,
     "mlp_only_layers": [0, 2]},
    {"model_type": "olmoe", **TINY, "num_experts": 8, "num_experts_per_tok": 2},
    {"model_type": "deepseek_v2", **TINY, "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 2,
     "num_experts_per_tok": 2, "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": None,
     "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12},
    {"model_type": "deepseek_v3", **TINY, "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1,
     "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16, "first_k_dense_replace": 2,
     "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12,
     "num_nextn_predict_layers": 0},
    {"model_type": "gpt_oss", **TINY, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 8},
    {"model_type": "granite", **TINY, "attention_bias": True, "tie_word_embeddings": False, "logits_scaling": 16.0},
    {"model_type": "smollm3", **TINY, "use_sliding_window": True, "sliding_window": 8, "no_rope_layer_interval": 2,
     "tie_word_embeddings": False},
    {"model_type": "exaone4", **TINY, "num_hidden_layers": 6, "sliding_window": 8, "sliding_window_pattern": 3,
     "tie_word_embeddings": True},
    {"model_type": "seed_oss", **TINY, "head_dim": 16, "attention_out_bias": True, "attention_dropout": 0.0,
     "residual_dropout": 0.0},
    {"model_type": "ministral", **TINY, "head_dim": 32, "sliding_window": 8,
     "layer_types": ["sliding_attention", "full_attention"] * 2},
    {"model_type": "ministral3", **TINY, "sliding_window": 8, "tie_word_embeddings": True},
    {"model_type": "glm", **TINY, "head_dim": 32, "attention_bias": False, "tie_word_embeddings": True},
    {"model_type": "glm4", **TINY, "head_dim": 16, "partial_rotary_factor": 0.5},
    {"model_type": "hunyuan_v1_dense", **TINY, "head_dim": 32, "attention_bias": True},
    {"model_type": "starcoder2", **TINY, "tie_word_embeddings": False, "sliding_window": 8, "attention_dropout": 0.1,
     "residual_dropout": 0.1, "embedding_dropout": 0.1},
    {"model_type": "gpt_neox", **TINY, "num_key_value_heads": 4, "use_parallel_residual": False, "rotary_pct": 0.5,
     "rotary_emb_base": 10000, "tie_word_embeddings": True, "attention_dropout": 0.1, "hidden_dropout": 0.1},
    {"model_type": "arcee", **TINY, "head_dim": 32, "attention_bias": True, "bos_token_id": None, "eos_token_id": None},
    {"model_type": "nemotron", **TINY, "head_dim": 16, "attention_bias": True, "mlp_bias": True, "partial_rotary_factor": 0.5,
     "tie_word_embeddings": True},
    {"model_type": "flex_olmo", **TINY, "num_experts": 4, "num_experts_per_tok": 2, "attention_bias": True,
     "tie_word_embeddings": True},
    {"model_type": "granitemoe", **TINY, "num_local_experts": 4, "num_experts_per_tok": 2, "attention_bias": True},
    {"model_type": "granitemoeshared", **TINY, "num_local_experts": 4, "num_experts_per_tok": 1,
     "shared_intermediate_size": 40, "tie_word_embeddings": True},
    {"model_type": "minimax_m2", **TINY, "head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2, "rotary_dim": 16,
     "attn_type_list": [1] * 4, "use_qk_norm": True, "qk_norm_type": "per_layer", "use_mtp": False, "num_mtp_modules": 3},
    {"model_type": "ernie4_5_moe", **TINY, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 24,
     "moe_num_shared_experts": 0, "moe_layer_start_index": 0, "moe_layer_end_index": 2, "moe_layer_interval": 2},
    {"model_type": "ernie4_5_moe", **TINY, "head_dim": 32, "moe_num_experts": 6, "moe_k": 3, "moe_intermediate_size": 16,
     "moe_num_shared_experts": 2, "tie_word_embeddings": False, "num_nextn_predict_layers": 0},
    {"model_type": "dots1", **TINY, "head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 2, "num_experts_per_tok": 2,
     "moe_intermediate_size": 16, "first_k_dense_replace": 1, "sliding_window": 8, "max_window_layers": 2,
     "attention_bias": True},
    {"model_type": "ernie4_5", **TINY, "head_dim": 16, "tie_word_embeddings": False},
    {"model_type": "hunyuan_v1_moe", **TINY, "head_dim": 16, "num_experts": 4, "moe_topk": [2] * 4, "attention_bias": True,
     "moe_intermediate_size": [96] * 4, "num_shared_expert": [1] * 4, "use_mixed_mlp_moe": True, "use_qk_norm": True},
    {"model_type": "nanochat", **TINY, "attention_bias": True, "final_logit_softcapping": None, "tie_word_embeddings": True},
    {"model_type": "internlm3", **TINY, "head_dim": 32, "qkv_bias": True, "bias": True},
    {"model_type": "jais2", **TINY, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True},
    {"model_type": "stablelm", **TINY, "use_qkv_bias": True, "use_parallel_residual": True, "tie_word_embeddings": True},
    {"model_type": "stablelm", **TINY, "qk_layernorm": True, "use_parallel_residual": True},
    {"model_type": "minicpm3", **TINY, "num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
     "qk_rope_head_dim": 4, "tie_word_embeddings": False, "scale_emb": 10, "dim_model_base": 32},
    {"model_type": "youtu", **TINY, "num_key_value_heads": 4, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
     "qk_rope_head_dim": 4, "v_head_dim": 12, "tie_word_embeddings": False},
    {"model_type": "helium", **TINY, "head_dim": 16, "attention_bias": True, "tie_word_embeddings": True},
    {"model_type": "vaultgemma", **TINY, "head_dim": 32, "sliding_window": 8, "final_logit_softcapping": None},
    {"model_type": "iquestcoder", **TINY, "head_dim": 16, "attention_bias": True, "tie_word_embeddings": True},
    {"model_type": "solar_open", **TINY, "head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "moe_intermediate_size": 24, "n_shared_experts": 2, "attention_bias": True},
    {"model_type": "glm4_moe_lite", **TINY, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "moe_intermediate_size": 16, "q_lora_rank": None, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
     "v_head_dim": 12, "mlp_layer_types": ["dense", "sparse", "dense", "sparse"], "num_nextn_predict_layers": 1},
    {"model_type": "cohere", **TINY, "use_qk_norm": True, "attention_bias": True, "tie_word_embeddings": False},
    {"model_type": "cohere", **TINY, "head_dim": 32, "logit_scale": 0.5},
    {"model_type": "cohere2", **TINY, "sliding_window": 8, "sliding_window_pattern": 2, "attention_bias": True},
    {"model_type": "cohere2", **TINY, "sliding_window": 8, "tie_word_embeddings": False,
     "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]},
    {"model_type": "glm4_moe", **TINY, "head_dim": 32, "attention_bias": True, "use_qk_norm": True, "n_routed_experts": 8,
     "n_shared_experts": 2, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "first_k_dense_replace": 2,
     "num_nextn_predict_layers": 1},
    {"model_type": "glm4_moe", **TINY, "num_attention_heads": 3, "num_key_value_heads": 1, "n_routed_experts": 4, "num_experts_per_tok": 1,
     "moe_intermediate_size": 8, "first_k_dense_replace": 0, "num_nextn_predict_layers": 0},
    {"model_type": "afmoe", **TINY, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
     "num_shared_experts": 1, "num_dense_layers": 2, "global_attn_every_n_layers": 2, "sliding_window": 8,
     "attention_bias": True, "mup_enabled": True, "route_scale": 2.0},
    {"model_type": "minicpm5_moe", **TINY, "head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "moe_intermediate_size": 16, "attention_bias": True, "mlp_layer_types": ["dense", "sparse", "dense", "sparse"]},
    {"model_type": "minicpm5_moe", **TINY, "head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 1,
     "n_shared_experts": 2, "moe_intermediate_size": 16, "first_k_dense_replace": 2},
    {"model_type": "kolibri1", **{k: v for k, v in TINY.items() if k != "intermediate_size"}, "head_dim": 16, "num_experts": 4,
     "num_experts_per_tok": 2, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 24, "sliding_window": 8},
    {"model_type": "kolibri1", **{k: v for k, v in TINY.items() if k != "intermediate_size"}, "head_dim": 32,
     "num_local_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 16, "sliding_window": None,
     "layer_types": ["full_attention"] * 4},
    {"model_type": "exaone_moe", **TINY, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
     "num_shared_experts": 2, "sliding_window": 8, "sliding_window_pattern": 2, "mlp_layer_types": ["dense", "sparse", "sparse", "dense"]},
    {"model_type": "axk1", **TINY, "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
     "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
     "qk_rope_head_dim": 4, "v_head_dim": 12, "first_k_dense_replace": 1, "moe_layer_freq": 2},
    {"model_type": "mellum", **TINY, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
     "attention_bias": True, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 2,
     "mlp_layer_types": ["dense", "sparse", "sparse", "dense"], "num_mtp_layers": 0},
    {"model_type": "exaone", **{k: v for k, v in TINY.items() if k != "num_hidden_layers"}, "num_layers": 4,
     "activation_function": "silu", "layer_norm_epsilon": 1e-5, "embed_dropout": 0.0, "attention_bias": True,
     "tie_word_embeddings": True},
    {"model_type": "cwm", **TINY, "head_dim": 32, "sliding_window": 8, "bos_token_id": 1},
    {"model_type": "cwm", **TINY, "head_dim": 16, "sliding_window": 8, "bos_token_id": 1,
     "layer_types": ["sliding_attention", "full_attention"] * 2},
    {"model_type": "hyperclovax", **TINY, "head_dim": 32, "use_post_norm": False, "logits_scaling": 0.5},
    {"model_type": "hyperclovax", **TINY, "attention_bias": True, "tie_word_embeddings": True},
    {"model_type": "param2moe", **TINY, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
     "num_shared_experts": 1, "use_qkv_bias": True, "use_qk_norm": False, "first_k_dense_replace": 2, "num_mtp_layers": 1},
    {"model_type": "sarvam_moe", **TINY, "head_dim": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "moe_intermediate_size": 16, "tie_word_embeddings": True},
    {"model_type": "sarvam_mla", **TINY, "num_key_value_heads": 4, "num_experts": 4, "num_shared_experts": 2,
     "num_experts_per_tok": 2, "moe_intermediate_size": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
     "qk_rope_head_dim": 4, "v_head_dim": 12, "q_head_dim": 12, "head_dim": 20, "n_group": 1, "topk_group": 1},
    {"model_type": "deepseek_v32", **TINY, "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1,
     "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16, "q_lora_rank": 24,
     "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "index_n_heads": 2,
     "index_head_dim": 8, "index_topk": 16, "mlp_layer_types": ["dense", "sparse", "dense", "sparse"]},
    {"model_type": "glm_moe_dsa", **TINY, "num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 2,
     "num_experts_per_tok": 2, "moe_intermediate_size": 16, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
     "qk_rope_head_dim": 4, "v_head_dim": 12, "index_n_heads": 3, "index_head_dim": 8, "index_topk": 16,
     "first_k_dense_replace": 1, "indexer_types": ["full", "shared", "full", "shared"]},
    {"model_type": "glm_moe_dsa", **TINY, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
     "moe_intermediate_size": 16, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
     "v_head_dim": 12, "index_n_heads": 2, "index_head_dim": 4, "index_topk_freq": 2, "index_skip_topk_offset": 1},
]


# Kimi K2's released text config (transformers ships no kimi_k2 class; it builds as DeepSeek-V3): the shape Moonshot's
# configs state, as quoted in public code read via the search tool 2026-12-07 (a Kimi K2.6 text config: 61 layers,
# hidden 7168, 64 heads, q / kv ranks 1536 / 512, 128 + 64 q/k and 128 v head dims, 384 routed experts of 2048, 8 a
# token, one shared, vocabulary 163,840; its sigmoid noaux_tc router with scale 2.827; Miles' Kimi K2 page: FFN 18,432,
# one dense layer)
KIMI_K2 = {"model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 163840, "hidden_size": 7168,
           "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
           "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384, "routed_scaling_factor": 2.827,
           "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
           "topk_method": "noaux_tc", "scoring_func": "sigmoid", "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
           "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "num_nextn_predict_layers": 0,
           "max_position_embeddings": 262144, "rope_theta": 50000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}  # fmt: skip


def _default(mt: str) -> dict:
    if mt == "kimi_k2":
        return dict(KIMI_K2)
    cfg = transformers.AutoConfig.for_model(mt).to_dict()
    if mt == "deepseek_v2":  # its default leaves top-k unset; DeepSeek-V2's published config routes to 6
        cfg["num_experts_per_tok"] = 6
    if mt == "nemotron":  # its class leaves num_key_value_heads None, which does not build; Nemotron-4 15B has 8 (GQA)
        cfg["num_key_value_heads"] = 8
    if mt == "dots1":  # its class leaves the experts unset; dots.llm1's published config routes 6 of 128, 2 shared
        cfg.update(n_routed_experts=128, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1)
    if mt in ("hunyuan_v1_dense", "hunyuan_v1_moe"):  # likewise (the attention takes None ** -0.5); Hunyuan's configs state 128
        cfg["head_dim"] = 128
    if mt == "ministral":  # its default head_dim None does not build (MinistralAttention takes None ** -0.5);
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]  # Ministral-8B's config states 128
    return cfg


@pytest.mark.parametrize("mt", sorted(READERS))
def test_every_claimed_family_counts_exactly_what_transformers_builds(mt: str) -> None:
    cfg = _default(mt)
    arch = arch_from_hf_config(cfg)
    counts = param_counts(arch)
    assert counts.total - counts.mtp == transformers_param_count(cfg)


@pytest.mark.parametrize("cfg", VARIANTS, ids=lambda c: c["model_type"] + "-" + "-".join(
    k for k in c if k not in TINY and k != "model_type")[:40])  # fmt: skip
def test_each_modelled_feature_counts_exactly(cfg: dict) -> None:
    arch = arch_from_hf_config(cfg)
    assert cross_check(arch, cfg) == param_counts(arch).total - param_counts(arch).mtp


def test_the_variants_switch_on_what_they_claim() -> None:
    archs = {json.dumps(c, sort_keys=True): arch_from_hf_config(c) for c in VARIANTS}
    qwen2_moe = arch_from_hf_config(VARIANTS[8])
    assert qwen2_moe.moe is not None and qwen2_moe.moe.dense_layers == (0, 2, 3)  # step 2 puts experts on 1; 3 is mlp-only
    assert arch_from_hf_config(VARIANTS[2]).sliding_layers == 2  # layers 2, 3 past max_window_layers
    assert arch_from_hf_config(VARIANTS[5]).sliding_layers == 4  # four of the first five are local
    ds = arch_from_hf_config(VARIANTS[13])
    assert ds.mla is not None and ds.mla.q_lora_rank == 24 and ds.moe is not None and ds.moe.dense_layers == (0, 1)
    smol = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "smollm3"))  # NoPE on layers 1 and 3, which alone take the window
    assert (smol.nope_layers, smol.sliding_layers, smol.sliding_window, smol.tied_embeddings) == (2, 2, 8, False)
    assert arch_from_hf_config(_default("smollm3")).nope_layers == 9  # every 4th of 36 layers (SmolLM3-3B)
    assert len(archs) == len(VARIANTS)


def test_ministral_layers_keep_what_llama_keeps() -> None:
    """Ministral 3 scales its rotated queries by a factor of the position (llama_4_scaling_beta), which keeps nothing
    of the queries for backward: a Ministral 3 saves what a Llama of one shape saves in a training forward pass with
    its loss (saved-tensor hooks, CPU, bf16) plus the scale itself — one bf16 value per position and layer (32
    positions, 4 layers: 256 bytes; 64 KiB a layer at 32K tokens, whatever the batch, which trainplan leaves out) —
    and has the same parameters."""
    shape = {**TINY, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None}
    scaled = {"model_type": "ministral3", **shape, "head_dim": 16, "rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "original_max_position_embeddings": 16,
        "max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "llama_4_scaling_beta": 0.1}}  # fmt: skip
    llama = {"model_type": "llama", **shape}
    assert _saved_by_loss_step(scaled) - _saved_by_loss_step(llama) == 4 * 32 * 2  # layers x positions x bf16
    assert param_counts(arch_from_hf_config(scaled)) == param_counts(arch_from_hf_config(llama))
    windowed = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "ministral"))
    assert (windowed.sliding_layers, windowed.sliding_window, windowed.head_dim) == (2, 8, 32)
    assert arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "ministral3")).sliding_layers == 4
    with pytest.raises(ConfigRefused, match="layer_types"):  # Ministral 3 has none: its window is on every layer
        arch_from_hf_config({"model_type": "ministral3", **TINY, "layer_types": ["full_attention"] * 4})


def test_hunyuan_and_ernie_refuse_what_they_cannot_read() -> None:
    """A Hunyuan config without head_dim does not build in transformers (its attention takes None ** -0.5) and an ERNIE 4.5
    with ``use_bias`` puts biases on the gated MLP, which trainplan does not model: each is refused in one line; an
    ERNIE 4.5 config without head_dim takes its config class's 128."""
    with pytest.raises(ConfigRefused, match="head_dim"):
        arch_from_hf_config({"model_type": "hunyuan_v1_dense", **TINY})
    with pytest.raises(ConfigRefused, match="use_bias"):
        arch_from_hf_config({"model_type": "ernie4_5", **TINY, "use_bias": True})
    ernie = {"model_type": "ernie4_5", **TINY}
    assert arch_from_hf_config(ernie).head_dim == 128
    assert cross_check(arch_from_hf_config(ernie), ernie) == param_counts(arch_from_hf_config(ernie)).total


def test_starcoder2_reads_one_dropout_and_its_biases() -> None:
    """StarCoder2's three dropouts are one probability in trainplan: equal ones are read, differing ones refused; its
    LayerNorm-GELU block is modelled with biases only (``use_bias: false`` refused)."""
    sc = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "starcoder2"))
    assert (sc.dropout, sc.norm, sc.mlp, sc.bias, sc.sliding_layers) == (0.1, "layernorm", "gelu", True, 4)
    with pytest.raises(ConfigRefused, match="dropouts differ"):
        arch_from_hf_config({"model_type": "starcoder2", **TINY, "residual_dropout": 0.1})
    with pytest.raises(ConfigRefused, match="use_bias"):
        arch_from_hf_config({"model_type": "starcoder2", **TINY, "use_bias": False})
    # the keys its released configs carry from the GPTBigCode conversion, which Starcoder2's modeling does not read
    released = {"model_type": "starcoder2", **TINY, "norm_type": "layer_norm", "mlp_type": "default",
                "attention_softmax_in_fp32": True, "scale_attention_softmax_in_fp32": True, "scale_attn_weights": True}  # fmt: skip
    assert cross_check(arch_from_hf_config(released), released) == param_counts(arch_from_hf_config(released)).total
    with pytest.raises(ConfigRefused, match="norm_type"):
        arch_from_hf_config({**released, "norm_type": "rms_norm"})


def test_minimax_m2_reads_its_own_keys_or_refuses_them() -> None:
    """MiniMax-M2's released config keys are read where they describe what transformers builds, and refused where
    they would describe something else: linear-attention layers, per-head q/k norms, a shared expert, or the
    multi-token-prediction modules (``use_mtp``), which transformers does not build."""
    base = next(c for c in VARIANTS if c["model_type"] == "minimax_m2")
    arch = arch_from_hf_config(base)
    assert arch.qk_norm == "full" and arch.moe is not None and arch.moe.dense_layers == () and arch.head_dim == 32
    for change, match in (({"use_mtp": True}, "use_mtp"), ({"attn_type_list": [1, 0, 1, 1]}, "attn_type_list"),
                          ({"qk_norm_type": "per_head"}, "qk_norm_type"), ({"shared_intermediate_size": 64},
                          "shared_intermediate_size"), ({"use_qk_norm": False}, "use_qk_norm")):  # fmt: skip
        with pytest.raises(ConfigRefused, match=match):
            arch_from_hf_config({**base, **change})


def test_ernie4_5_moe_places_its_experts_and_refuses_what_transformers_does_not_build() -> None:
    """ERNIE 4.5 MoE routes on every ``moe_layer_interval``-th layer between its start and end indices (-1: the last);
    its MTP layer and a null head_dim, which transformers does not build, are refused."""
    grid, every = (arch_from_hf_config(c) for c in VARIANTS if c["model_type"] == "ernie4_5_moe")
    assert grid.moe is not None and grid.moe.dense_layers == (0, 2, 3)  # layers 1 only: odd index, within 0..2
    assert every.moe is not None and every.moe.dense_layers == (0,) and every.moe.shared_ffn_hidden == 32
    base = {"model_type": "ernie4_5_moe", **TINY, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 24}
    for change, match in (({"num_nextn_predict_layers": 1}, "num_nextn_predict_layers"), ({"head_dim": None}, "head_dim"),
                          ({"moe_intermediate_size": [24, 12]}, "moe_intermediate_size"), ({"use_bias": True}, "use_bias"),
                          ({"moe_layer_end_index": None}, "moe_layer_end_index")):  # fmt: skip
        with pytest.raises(ConfigRefused, match=match):
            arch_from_hf_config({**base, **change})


def test_pythia_reads_exactly_and_gpt_neox_refuses_what_it_cannot_model() -> None:
    """Pythia-70M's released config (rotary_pct / rotary_emb_base, the keys transformers 4 wrote) reads the 70,426,624
    parameters transformers builds; an attention without biases beside the MLP's, or differing dropouts, is refused."""
    pythia = {"architectures": ["GPTNeoXForCausalLM"], "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "gelu",
              "hidden_size": 512, "initializer_range": 0.02, "intermediate_size": 2048, "layer_norm_eps": 1e-05,
              "max_position_embeddings": 2048, "model_type": "gpt_neox", "num_attention_heads": 8, "num_hidden_layers": 6,
              "rotary_emb_base": 10000, "rotary_pct": 0.25, "tie_word_embeddings": False, "torch_dtype": "float16",
              "transformers_version": "4.24.0", "use_cache": True, "use_parallel_residual": True, "vocab_size": 50304}  # fmt: skip
    arch = arch_from_hf_config(pythia)
    assert param_counts(arch).total == transformers_param_count(pythia) == 70_426_624
    assert (arch.norm, arch.mlp, arch.bias, arch.tied_embeddings) == ("layernorm", "gelu", True, False)
    with pytest.raises(ConfigRefused, match="attention_bias"):
        arch_from_hf_config({**pythia, "attention_bias": False})
    with pytest.raises(ConfigRefused, match="hidden_dropout"):
        arch_from_hf_config({**pythia, "hidden_dropout": 0.1})
    with pytest.raises(ConfigRefused, match="mlp_bias"):
        arch_from_hf_config({"model_type": "arcee", **TINY, "mlp_bias": True})


def test_dots1_counts_its_published_totals() -> None:
    """dots.llm1's released shape (arXiv 2506.05767: 142B parameters, 14B active) reads 142.8B, exactly what
    transformers builds, and 13.4B matmul weights a token; the DeepSeek-era ``moe_layer_freq`` key is read at 1 only."""
    dots = {"model_type": "dots1", "attention_bias": False, "first_k_dense_replace": 1, "hidden_size": 4096,
            "intermediate_size": 10944, "max_window_layers": 62, "moe_intermediate_size": 1408, "moe_layer_freq": 1,
            "n_routed_experts": 128, "n_shared_experts": 2, "num_attention_heads": 32, "num_experts_per_tok": 6,
            "num_hidden_layers": 62, "num_key_value_heads": 32, "rope_theta": 10000000, "sliding_window": None,
            "tie_word_embeddings": False, "use_sliding_window": False, "vocab_size": 152064}  # fmt: skip
    counts = param_counts(arch_from_hf_config(dots))
    assert counts.total == transformers_param_count(dots) and round(counts.total / 1e9, 1) == 142.8
    assert round(counts.matmul_per_token / 1e9, 1) == 13.4
    with pytest.raises(ConfigRefused, match="moe_layer_freq"):
        arch_from_hf_config({**dots, "moe_layer_freq": 2})


def test_nemotron_reads_biased_layernorms_beside_unbiased_projections() -> None:
    """Nemotron's LayerNorms keep their biases when its projections have none (``norm_bias``: two parameters a
    channel a norm); attention and MLP biases must agree, and a config without num_key_value_heads (which transformers
    cannot build) is refused."""
    plain = {"model_type": "nemotron", **TINY, "head_dim": 16}
    arch = arch_from_hf_config(plain)
    assert (arch.norm, arch.norm_bias, arch.bias, arch.mlp) == ("layernorm", True, False, "gelu")
    assert cross_check(arch, plain) == param_counts(arch).total
    assert param_counts(arch).total - param_counts(arch.model_copy(update={"norm_bias": None})).total == 64 * (2 * 4 + 1)
    with pytest.raises(ConfigRefused, match="mlp_bias"):
        arch_from_hf_config({**plain, "attention_bias": True})
    with pytest.raises(ConfigRefused, match="num_key_value_heads"):
        arch_from_hf_config({**plain, "num_key_value_heads": None})


#: Command R+'s and Command A's shapes as their Hub configs give them (CohereForAI/c4ai-command-r-plus,
#: c4ai-command-a-03-2025; not re-read here — the totals they give match the model cards' 104B and 111B), with the keys
#: of Cohere's own format that Command A's config carries
COMMAND_R_PLUS = {"model_type": "cohere", "hidden_size": 12288, "intermediate_size": 33792, "num_hidden_layers": 64,
                  "num_attention_heads": 96, "num_key_value_heads": 8, "vocab_size": 256000, "use_qk_norm": True,
                  "logit_scale": 0.8333333, "model_max_length": 131072, "rope_theta": 75000000.0}
COMMAND_A = {"model_type": "cohere2", "hidden_size": 12288, "intermediate_size": 36864, "num_hidden_layers": 64,
             "num_attention_heads": 96, "num_key_value_heads": 8, "vocab_size": 256000, "head_dim": 128, "logit_scale": 0.25,
             "sliding_window": 4096, "sliding_window_pattern": 4, "layer_switch": 4, "order_of_interleaved_layers": "local_attn_first",
             "position_embedding_type": "rope_gptj", "rotary_pct": 1.0, "use_gated_activation": True,
             "use_parallel_block": True, "use_parallel_embedding": True, "use_embedding_sharing": True}  # fmt: skip


def test_cohere_reads_its_parallel_block_and_its_released_shapes() -> None:
    """Cohere's block is one bias-free fp32 LayerNorm feeding attention and the MLP side by side (``block_norms`` 1,
    ``norm_python``); Command R+'s q/k norms give each head its own weight; Command 2's full-attention layers are NoPE.
    Command R+ reads 103.8B and Command A 111.1B (published: 104B, 111B), as transformers builds them; Cohere's own
    keys are read where they say what transformers builds and refused otherwise."""
    plus = arch_from_hf_config(COMMAND_R_PLUS)
    assert (plus.block_norms, plus.norm, plus.norm_python, plus.qk_norm, plus.tied_embeddings) == (1, "layernorm", True, "each_head", True)
    assert param_counts(plus).total == 103_810_674_688 == transformers_param_count(COMMAND_R_PLUS)
    a = arch_from_hf_config(COMMAND_A)
    assert (a.sliding_layers, a.nope_layers, a.sliding_window, a.qk_norm) == (48, 16, 4096, None)
    assert param_counts(a).total == 111_057_580_032 == transformers_param_count(COMMAND_A)
    assert arch_from_hf_config({**COMMAND_A, "sliding_window": None}).nope_layers == 64  # no window: no layer rotates
    for key, value in (("layer_switch", 2), ("use_embedding_sharing", False), ("position_embedding_type", "rope"),
                       ("use_parallel_block", False), ("head_dim", 64), ("use_qk_norm", True), ("rotary_pct", 0.5),
                       ("order_of_interleaved_layers", "global_attn_first"), ("sliding_window_pattern", 0)):  # fmt: skip
        with pytest.raises(ConfigRefused, match=key):
            arch_from_hf_config({**COMMAND_A, key: value})
    with pytest.raises(ConfigRefused, match="logit_scale"):
        arch_from_hf_config({**COMMAND_R_PLUS, "logit_scale": None})


#: Hunyuan-A13B's shape with its per-layer lists, as public test code quotes its config (the key names of the
#: released config.json; tie_word_embeddings left at its class default)
HUNYUAN_A13B = {"model_type": "hunyuan_v1_moe", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 128167,
                "num_experts": 64, "moe_intermediate_size": [3072] * 32, "moe_topk": [8] * 32,
                "num_shared_expert": [1] * 32}  # fmt: skip


def test_hunyuan_moe_reads_its_per_layer_lists_where_they_agree() -> None:
    """Hunyuan MoE: experts and one shared MLP of intermediate_size on every layer, an fp32 router; the released
    configs' per-layer lists read when every layer agrees, and their keys that transformers does not read refused
    where they describe another model. Hunyuan-A13B's shape reads 80.9B (published: 80B total, 13B active)."""
    arch = arch_from_hf_config(HUNYUAN_A13B)
    assert arch.moe is not None and (arch.moe.experts, arch.moe.top_k, arch.moe.shared_ffn_hidden, arch.moe.router_fp32) == (64, 8, 3072, True)
    counts = param_counts(arch)
    assert counts.total == transformers_param_count(HUNYUAN_A13B) == 80_918_155_264
    assert 12.7e9 < counts.matmul_per_token < 13.3e9
    for key, value in (("moe_topk", [8] * 31 + [4]), ("moe_topk", [8] * 31), ("num_experts", [64] * 32),
                       ("moe_intermediate_size", [1536] * 32), ("num_shared_expert", [2] * 32), ("use_cla", True),
                       ("use_mixed_mlp_moe", False), ("attention_head_dim", 64)):  # fmt: skip
        with pytest.raises(ConfigRefused, match=key):
            arch_from_hf_config({**HUNYUAN_A13B, key: value})


def test_llama_subclasses_solar_open_and_glm_lite_read_their_defaults_and_refuse_the_rest() -> None:
    """InternLM3 and IQuest-Coder build as Llamas (head_dim 128 when left out; InternLM3's two bias switches must
    agree, as Jais 2's); Jais 2's LayerNorms keep their bias, VaultGemma is Gemma 2 with two norms a block, and a
    Helium whose heads do not span the width (its output projection takes hidden_size inputs) is refused; Solar Open's and GLM-4.x Lite's class defaults read as transformers builds them — Solar-Open-100B's shape
    102.65B total (published 102B) and GLM-4.x Lite's 29.9B with 3.58B matmul weights a token (30B-A3B) — and keys they
    dropped are refused where they would describe a layer transformers does not build."""
    counts = {mt: param_counts(arch_from_hf_config(_default(mt))) for mt in ("internlm3", "iquestcoder", "solar_open", "glm4_moe_lite")}
    assert counts["internlm3"].total == 8_804_241_408 and counts["iquestcoder"].total == 39_794_283_520
    assert counts["solar_open"].total == 102_651_793_408 and counts["glm4_moe_lite"].total == 29_943_390_976
    assert 3.5e9 < counts["glm4_moe_lite"].matmul_per_token < 3.6e9
    assert arch_from_hf_config({"model_type": "internlm3", **TINY}).head_dim == 128
    jais2 = arch_from_hf_config({"model_type": "jais2", **TINY, "attention_bias": False, "mlp_bias": False})
    assert (jais2.norm, jais2.bias, jais2.norm_bias) == ("layernorm", False, True)  # nn.LayerNorm keeps its bias
    assert arch_from_hf_config(_default("vaultgemma")).block_norms == 2  # Gemma 2 without its post-norms
    parallel = arch_from_hf_config({"model_type": "stablelm", **TINY, "use_parallel_residual": True})
    assert (parallel.block_norms, parallel.norm_bias, parallel.norm_python) == (1, True, False)  # one native LayerNorm
    assert arch_from_hf_config({"model_type": "stablelm", **TINY, "qk_layernorm": True}).qk_norm == "each_head"
    minicpm3 = arch_from_hf_config(_default("minicpm3"))
    assert minicpm3.mla is not None and minicpm3.mla.v_head_dim == 2560 // 40 and param_counts(minicpm3).total == 4_073_875_968
    for cfg, key in (({"model_type": "internlm3", **TINY, "qkv_bias": True}, "qkv_bias"),
                     ({**_default("solar_open"), "first_k_dense_replace": 1}, "first_k_dense_replace"),
                     ({**_default("solar_open"), "use_qk_norm": True}, "use_qk_norm"),
                     ({**_default("glm4_moe_lite"), "mlp_layer_types": ["dense"] * 3}, "mlp_layer_types"),
                     ({**_default("glm4_moe_lite"), "head_dim": 128}, "head_dim"),
                     ({"model_type": "jais2", **TINY, "mlp_bias": False}, "mlp_bias"),
                     ({"model_type": "stablelm", **TINY, "hidden_dropout": 0.1}, "hidden_dropout"),
                     ({**_default("youtu"), "n_routed_experts": 8}, "n_routed_experts"),
                     ({"model_type": "helium", **TINY}, "head_dim 128 x 4 heads")):  # fmt: skip
        with pytest.raises(ConfigRefused, match=key):
            arch_from_hf_config(cfg)


def test_nanochat_reads_its_weightless_norms() -> None:
    """nanochat's norms have no weight (no parameters; an RMSNorm only), one more normalises the embedding's output,
    its logits are soft-capped at 15 unless the config says otherwise; the d20 shape (1280 wide, 20 layers, a 65,536
    vocabulary) reads 560,988,160 parameters, as transformers builds it (nanochat's README: 561M)."""
    from trainplan.model import ModelArch

    d20 = {"model_type": "nanochat", "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 20,
           "num_attention_heads": 10, "vocab_size": 65536}  # fmt: skip
    arch = arch_from_hf_config(d20)
    assert (arch.norm_weight, arch.embedding_norm, arch.qk_norm, arch.mlp, arch.final_logit_softcap) == (False, True, "head", "gelu", 15.0)
    assert param_counts(arch).total == transformers_param_count(d20) == 560_988_160
    weighted = param_counts(arch.model_copy(update={"norm_weight": True})).total
    assert weighted - param_counts(arch).total == 1280 * (2 * 20 + 1) + 2 * 128 * 20  # block, final and q/k norm weights
    with pytest.raises(ValidationError, match="norm_weight"):
        ModelArch(layers=2, hidden=64, heads=4, ffn_hidden=96, vocab=101, norm="layernorm", norm_weight=False)
    # under tensor parallelism its embedding norm stays whole, as the final norm does: 2 norms' saves (a weightless
    # RMSNorm keeps 4h + 4 bytes a token) and the head's 16-bit input a token
    from trainplan.catalog import get_catalog
    from trainplan.estimate.stack import effective_knobs
    from trainplan.estimate.transformer import model_split, resolve_transformer
    from trainplan.spec import parse_job

    job = parse_job({"kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": 2048,
                     "micro_batch": 1, "precision": "bf16", "steps": 1})  # fmt: skip
    split = model_split(job, resolve_transformer(job, get_catalog()), effective_knobs(job, get_catalog()))
    assert split is not None and split.head_replicated == 2048 * (2 * (4 * 1280 + 4) + 2 * 1280)


def test_a_mapping_with_a_family_feature_names_it_where_it_cannot_be_built() -> None:
    """A model given as a mapping (no config.json) with a feature of a 2024-2026 family is planned, but trace and run
    have no config to build it from: the refusal names the fields that stand in the way."""
    from trainplan.model import ModelArch, UnsupportedArchitecture, hf_model_type

    plain = ModelArch(layers=2, hidden=64, heads=4, ffn_hidden=96, vocab=101)
    assert plain.plain and plain.features == [] and hf_model_type(plain) == "llama"
    cohere_like = plain.model_copy(update={"norm": "layernorm", "block_norms": 1, "qk_norm": "each_head"})
    assert cohere_like.features == ["qk_norm", "block_norms"]
    with pytest.raises(UnsupportedArchitecture, match=r"\(qk_norm, block_norms\) is planned, not built"):
        hf_model_type(cohere_like)


def test_a_null_or_differing_value_is_refused_by_name() -> None:
    """Values transformers cannot build, or that trainplan reads as one, are refused naming the key: a null head_dim
    (MiniMax-M2), a null max_window_layers beside a window (dots.llm1), Seed-OSS's two dropouts differing, a null top-k
    (Hunyuan MoE) or expert width and count (Solar Open), Nemotron's bias switches differing; and a
    LayerNorm bias given to an RMSNorm model is refused, not ignored."""
    from trainplan.model import ModelArch

    cases = (
        ({"model_type": "minimax_m2", **TINY, "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": None}, "head_dim"),
        ({"model_type": "dots1", **TINY, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
          "moe_intermediate_size": 16, "sliding_window": 8, "max_window_layers": None}, "max_window_layers"),
        ({"model_type": "seed_oss", **TINY, "attention_dropout": 0.1, "residual_dropout": 0.0}, "dropouts differ"),
        ({"model_type": "hunyuan_v1_moe", **TINY, "head_dim": 16, "num_experts": 4, "moe_topk": None}, "lacks moe_topk"),
        ({"model_type": "solar_open", **TINY, "moe_intermediate_size": None}, "lacks moe_intermediate_size"),
        ({"model_type": "solar_open", **TINY, "n_routed_experts": None}, "lacks n_routed_experts"),
        ({"model_type": "nemotron", **TINY, "head_dim": 16, "attention_bias": True}, "mlp_bias"),
    )  # fmt: skip
    for cfg, match in cases:
        with pytest.raises(ConfigRefused, match=match):
            arch_from_hf_config(cfg)
    with pytest.raises(ValidationError, match="norm_bias applies to a LayerNorm"):
        ModelArch(layers=2, hidden=64, heads=4, ffn_hidden=96, vocab=101, norm_bias=True)


def test_keys_left_out_take_the_config_classes_defaults() -> None:
    """A config.json without a key builds what transformers' config class defaults to, and trainplan reads the same:
    Seed-OSS's head_dim 128 and dropout 0.1, OLMo 3's 4096-token window; a Ministral without head_dim, which
    transformers cannot build, is refused."""
    seed = {"model_type": "seed_oss", **TINY}
    arch = arch_from_hf_config(seed)
    assert (arch.head_dim, arch.dropout) == (128, 0.1)
    assert cross_check(arch, seed) == param_counts(arch).total
    olmo3 = arch_from_hf_config({"model_type": "olmo3", **TINY})
    assert (olmo3.sliding_window, olmo3.sliding_layers) == (4096, 3)
    with pytest.raises(ConfigRefused, match="head_dim"):
        arch_from_hf_config({"model_type": "ministral", **TINY})
    with pytest.raises(ConfigRefused, match="head_dim"):
        arch_from_hf_config({"model_type": "seed_oss", **TINY, "head_dim": None})


# keys each of these readers fills from its config class when a config.json leaves them out
_CLASS_DEFAULTS = {"exaone": ("num_key_value_heads", "vocab_size", "intermediate_size"),
                   "cwm": ("head_dim", "num_key_value_heads", "sliding_window"),
                   "hyperclovax": ("use_post_norm",),
                   "minicpm5_moe": ("head_dim", "num_key_value_heads", "n_routed_experts", "num_experts_per_tok",
                                    "n_shared_experts", "moe_intermediate_size", "mlp_layer_types"),
                   "kolibri1": ("head_dim", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                                "shared_expert_intermediate_size", "sliding_window", "layer_types"),
                   "exaone_moe": ("num_key_value_heads", "sliding_window", "first_k_dense_replace", "moe_intermediate_size",
                                  "num_experts", "num_experts_per_tok", "num_shared_experts", "mlp_layer_types", "layer_types"),
                   "axk1": ("num_key_value_heads", "n_shared_experts", "n_routed_experts", "kv_lora_rank", "q_lora_rank",
                            "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "num_experts_per_tok",
                            "moe_intermediate_size", "mlp_layer_types"),
                   "afmoe": ("head_dim", "num_dense_layers", "num_experts", "num_experts_per_tok", "num_shared_experts",
                             "moe_intermediate_size", "global_attn_every_n_layers", "sliding_window", "layer_types"),
                   "mellum": ("head_dim", "num_key_value_heads", "num_local_experts", "mlp_layer_types", "layer_types"),
                   "param2moe": ("use_qk_norm", "num_nextn_predict_layers", "head_dim", "num_key_value_heads",
                                 "n_shared_experts", "tie_word_embeddings", "n_routed_experts"),
                   "sarvam_moe": ("use_qk_norm", "num_nextn_predict_layers", "head_dim", "num_key_value_heads",
                                  "n_routed_experts"),
                   "sarvam_mla": ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                  "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                                  "first_k_dense_replace", "num_nextn_predict_layers")}  # fmt: skip


@pytest.mark.parametrize("mt", sorted(_CLASS_DEFAULTS))
def test_config_subclasses_read_their_own_defaults(mt: str) -> None:
    """EXAONE 3, K-EXAONE, A.X K1, CWM, HyperCLOVA X, Mellum 2, AFMoE, MiniCPM5-MoE, Kolibri 1, Param2 MoE, Sarvam MoE and Sarvam MLA subclass the configs of Llama, Granite,
    GLM-4.5 and DeepSeek-V3 with defaults of their own: a config.json that leaves those keys out builds what the
    subclass defaults to, and trainplan counts exactly that (transformers on the meta device is the reference)."""
    cfg = {k: v for k, v in _default(mt).items() if k not in _CLASS_DEFAULTS[mt]}
    arch = arch_from_hf_config(cfg)
    assert cross_check(arch, cfg) == param_counts(arch).total - param_counts(arch).mtp
    assert param_counts(arch).total - param_counts(arch).mtp == transformers_param_count(_default(mt))


def test_released_key_spellings_are_read_and_what_transformers_drops_is_refused() -> None:
    """The released configs' own spellings (EXAONE's ``num_layers``, Sarvam's and Param2's ``num_experts`` …) read as
    transformers' keys; both spellings with differing values, EXAONE's embedding dropout (its remote code applies it,
    transformers' Llama does not), a CWM with attention biases (``CwmAttention`` builds none) and a Sarvam MLA
    ``q_head_dim`` that is not nope + rope are refused in one line. The released shapes: EXAONE-3.0-7.8B's 7.82B,
    CWM's 32.6B with 48 of 64 layers windowed, Param2-17B-A2.4B's 17.2B, Sarvam-105B's 106.0B."""
    exaone = next(c for c in VARIANTS if c["model_type"] == "exaone")
    assert arch_from_hf_config(exaone).layers == 4
    counts = {mt: param_counts(arch_from_hf_config(_default(mt))) for mt in ("exaone", "cwm", "param2moe", "sarvam_mla")}
    assert counts["exaone"].total == 7_818_448_896 and counts["cwm"].total == 32_581_097_472
    assert counts["param2moe"].total == 17_151_124_096 and counts["sarvam_mla"].total == 106_031_763_456
    cwm = arch_from_hf_config(_default("cwm"))
    assert (cwm.sliding_layers, cwm.sliding_window) == (48, 8192)
    assert arch_from_hf_config(_default("hyperclovax")).block_norms == 4
    assert arch_from_hf_config({**_default("hyperclovax"), "use_post_norm": False}).block_norms == 2
    param2 = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "param2moe"))
    assert param2.moe is not None and (param2.moe.experts, param2.moe.dense_layers, param2.mtp_layers) == (4, (0, 1), 1)
    assert (param2.attention_bias, param2.qk_norm) == ("qkv", None)
    afmoe = arch_from_hf_config(_default("afmoe"))  # Trinity's defaults: a global layer in every 4, the rest local
    assert (afmoe.attention_gate, afmoe.sliding_layers, afmoe.nope_layers, afmoe.block_norms) == ("proj", 24, 8, 4)
    small = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "afmoe"))
    assert small.moe is not None and (small.moe.dense_layers, small.sliding_layers, small.nope_layers) == ((0, 1), 2, 2)
    biased, first2 = (arch_from_hf_config(c) for c in VARIANTS if c["model_type"] == "minicpm5_moe")
    assert biased.attention_gate == "fused" and biased.moe is not None and biased.moe.dense_layers == (0, 2)
    assert first2.moe is not None and first2.moe.dense_layers == (0, 1) and first2.moe.shared_ffn_hidden == 32
    kexaone = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "exaone_moe"))  # pre-norm, unlike EXAONE 4
    assert kexaone.moe is not None and (kexaone.moe.dense_layers, kexaone.post_norms, kexaone.nope_layers) == ((0, 3), False, 2)
    axk1 = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "axk1"))  # sparse on layers 2 (i >= 1, even)
    assert axk1.moe is not None and axk1.moe.output_norm and axk1.moe.dense_layers == (0, 1, 3)
    assert param_counts(arch_from_hf_config(_default("axk1"))).total == 518_983_052_288  # A.X K1's default shape
    kolibri = arch_from_hf_config(_default("kolibri1"))  # a global layer in every five, NoPE; 4 norms a block
    assert (kolibri.sliding_layers, kolibri.nope_layers, kolibri.block_norms, param_counts(kolibri).total) == (40, 10, 4, 78_103_055_360)
    windowless = arch_from_hf_config([c for c in VARIANTS if c["model_type"] == "kolibri1"][1])
    assert (windowless.sliding_layers, windowless.nope_layers) == (0, 0)  # no window: every layer rotates
    mellum = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "mellum"))
    assert mellum.moe is not None and (mellum.moe.dense_layers, mellum.sliding_layers, mellum.attention_bias) == ((0, 3), 2, "qkvo")
    assert param_counts(arch_from_hf_config(_default("mellum"))).total == 12_149_923_072  # Mellum2-12B-A2.5B
    mla = arch_from_hf_config(next(c for c in VARIANTS if c["model_type"] == "sarvam_mla"))
    assert mla.mla is not None and mla.mla.q_lora_rank is None and mla.moe is not None and mla.moe.shared_ffn_hidden == 32
    for cfg, key in (({**exaone, "num_hidden_layers": 6}, "num_layers"), ({**exaone, "embed_dropout": 0.1}, "embed_dropout"),
                     ({"model_type": "cwm", **TINY, "attention_bias": True}, "attention_bias"),
                     ({**_default("sarvam_moe"), "num_experts": 64}, "num_experts"),
                     ({**_default("sarvam_mla"), "q_head_dim": 128}, "q_head_dim"),
                     ({**_default("mellum"), "num_mtp_layers": 1}, "num_nextn_predict_layers"),
                     ({**_default("afmoe"), "num_dense_layers": 32}, "num_dense_layers"),
                     ({**_default("minicpm5_moe"), "use_gated_attention": False}, "use_gated_attention"),
                     ({**_default("kolibri1"), "intermediate_size": 1024}, "intermediate_size"),
                     ({**_default("axk1"), "q_lora_rank": None}, "q_lora_rank"),
                     ({**_default("axk1"), "num_nextn_predict_layers": 1}, "num_nextn_predict_layers"),
                     ({**_default("afmoe"), "num_experts": None}, "num_experts"),
                     ({**_default("mellum"), "mlp_layer_types": ["dense"] * 28}, "mlp_layer_types")):  # fmt: skip
        with pytest.raises(ConfigRefused, match=key):
            arch_from_hf_config(cfg)


def test_glm4_moe_reads_its_attention_and_experts() -> None:
    glm, odd = (arch_from_hf_config(c) for c in VARIANTS if c["model_type"] == "glm4_moe")
    assert (glm.attention_bias, glm.qk_norm, glm.head_dim, glm.mtp_layers) == ("qkv", "head", 32, 1)
    assert glm.moe is not None and glm.moe.dense_layers == (0, 1) and glm.moe.shared_ffn_hidden == 32
    # 64 / 3 heads: head_dim 21, as Glm4MoeAttention floors it; n_shared_experts left out: Glm4MoeConfig's one
    assert (odd.head_dim, odd.attention_bias, odd.qk_norm, odd.mtp_layers) == (21, None, None, 0)
    assert odd.moe is not None and odd.moe.dense_layers == () and odd.moe.shared_ffn_hidden == 8


def test_glm45_counts_its_published_totals() -> None:
    """GLM-4.5's shape as the GLM-5 technical report tabulates it beside GLM-5 (3 dense + 89 MoE layers, 1 MTP layer,
    hidden 5120, dense / MoE intermediate 12288 / 1536, head dim 128, 96 heads, 8 KV heads, 160 experts of which 8
    routed and 1 shared, vocabulary 151552; '355B' total, '32B' activated; read through its transcription at
    glennklockwood.com/garden/GLM-5): the total is 355B within 1% with or without the MTP layer, the active matmul
    weights 32B within 6%, and the count equals transformers' (built on the meta device, MTP left out)."""
    glm45 = {"model_type": "glm4_moe", "hidden_size": 5120, "intermediate_size": 12288, "moe_intermediate_size": 1536,
             "num_hidden_layers": 92, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
             "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8, "first_k_dense_replace": 3,
             "vocab_size": 151552, "num_nextn_predict_layers": 1, "attention_bias": True, "use_qk_norm": True}  # fmt: skip
    arch = arch_from_hf_config(glm45)
    counts = param_counts(arch)
    assert counts.mtp > 0 and counts.total - counts.mtp == transformers_param_count(glm45)
    for total in (counts.total, counts.total - counts.mtp):
        assert abs(total - 355e9) / 355e9 < 0.01, total / 1e9
    active = param_counts(arch.model_copy(update={"mtp_layers": 0})).matmul_per_token
    assert abs(active - 32e9) / 32e9 < 0.06, active / 1e9
    assert arch.moe is not None and arch.moe.dense_layers == (0, 1, 2) and arch.moe_layers == 89


def test_nope_layers_drop_only_their_rotary_bytes() -> None:
    """SmolLM3's NoPE layers skip apply_rotary_pos_emb (modeling_smollm3.py, use_rope per layer): the same weights,
    FLOPs and activations as Llama's layers; only the rotary kernels' bytes (read + write q and k) are gone from them."""
    from trainplan.estimate.compute import memory_bound_bytes_per_token
    from trainplan.spec import Precision

    smol = arch_from_hf_config({"model_type": "smollm3", **TINY, "no_rope_layer_interval": 2, "tie_word_embeddings": False})
    llama = arch_from_hf_config({"model_type": "llama", **TINY})
    assert param_counts(smol) == param_counts(llama)
    a = Precision.BF16.compute_bytes
    rotary = 2 * a * (4 * 16 + 2 * 16)  # q: 4 heads x 16, k: 2 kv heads x 16, read and written
    per_layer = memory_bound_bytes_per_token(llama, Precision.BF16) - memory_bound_bytes_per_token(smol, Precision.BF16)
    assert per_layer == pytest.approx(rotary * smol.nope_layers / smol.layers)
    with pytest.raises(ValidationError, match="nope_layers"):  # no rotary embedding to leave out
        type(llama)(**{**llama.model_dump(), "nope_layers": 1, "position": "learned"})


# ----------------------------------------------------------------------------- presets

PRESETS = sorted(k for k, v in get_catalog().models.items() if "hf_config" in v)


def test_the_2026_families_have_presets() -> None:
    for name in ("mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-20b",
                 "gpt-oss-120b", "olmoe-1b-7b", "gemma-2-9b", "gemma-3-1b", "qwen2.5-7b", "phi-3-mini", "phi-4",
                 "llama-3.2-1b", "llama-3.3-70b", "mistral-nemo-12b", "mistral-small-24b"):  # fmt: skip
        assert name in PRESETS, name


@pytest.mark.parametrize("name", PRESETS)
def test_preset_counts_equal_transformers_and_the_published_total(name: str) -> None:
    entry = get_catalog().models[name]
    arch = resolve_model(name)
    counts = param_counts(arch)
    assert counts.total - counts.mtp == transformers_param_count(entry["hf_config"])
    assert abs(counts.total - counts.mtp - entry["params"]) / entry["params"] < 0.01  # published totals are rounded
    for key in ("source", "params_source", "as_of"):
        assert entry.get(key), f"{name}: {key}"


@pytest.mark.parametrize("name", [p for p in PRESETS if "active_params" in get_catalog().models[p]])
def test_moe_active_parameters_match_the_published_figure(name: str) -> None:
    """Publications count active parameters with or without the embedding (and without DeepSeek's MTP module);
    one of the two readings must be within 6% of the published figure."""
    arch = resolve_model(name).model_copy(update={"mtp_layers": 0})
    counts = param_counts(arch)
    published = get_catalog().models[name]["active_params"]
    readings = (counts.matmul_per_token, counts.matmul_per_token + counts.embedding)
    assert min(abs(r - published) / published for r in readings) < 0.06, [r / 1e9 for r in readings]
    assert counts.matmul_per_token < 0.4 * counts.total  # a sparse model, not read as dense


def test_moe_flops_are_six_times_the_active_parameters_plus_attention() -> None:
    """Training FLOPs per token: 6 × active matmul weights + 12 · layers · seq · attention width
    (PaLM, Chowdhery et al. 2022, App. B; Megatron-LM ``num_floating_point_operations`` counts a MoE layer's
    experts at top_k, the same)."""
    arch = resolve_model("mixtral-8x7b")
    counts = param_counts(arch)
    seq, tokens = 4096, 4096
    f = training_step_flops(tokens=tokens, matmul_params=counts.matmul_per_token,
                            trainable_matmul_params=counts.matmul_per_token, adapter_params=0, layers=arch.layers,
                            seq_len=seq, attn_dim=arch.heads * arch.hidden // arch.heads,
                            checkpointing=Checkpointing.NONE, lm_head_params=arch.vocab * arch.hidden)  # fmt: skip
    expected = 6 * counts.matmul_per_token + 12 * arch.layers * seq * arch.hidden
    assert f.model / tokens == pytest.approx(expected, rel=1e-12)
    dense_reading = 6 * (counts.block_linear + arch.vocab * arch.hidden)
    assert f.model / tokens < 0.35 * dense_reading


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("cfg, message", [
    ({"model_type": "mamba2", **TINY}, "model_type 'mamba2' is not modelled; supported:"),
    ({"model_type": "qwen3_next", **TINY}, "model_type 'qwen3_next' is not modelled"),
    ({"model_type": "mixtral", **TINY, "num_local_experts": 4, "num_experts_per_tok": 2, "expert_capacity": 3},
     "mixtral config key 'expert_capacity' is not modelled"),
    ({"model_type": "deepseek_v3", **TINY, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
      "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "moe_layer_freq": 2},
     "deepseek_v3 config moe_layer_freq: 2 is not modelled"),
    ({"model_type": "llama", **TINY, "mlp_bias": True}, "llama config mlp_bias: True is not modelled"),
    ({"model_type": "gemma3", "text_config": {}}, "multimodal"),
    ({"model_type": "mixtral", **TINY, "num_experts_per_tok": 2}, "mixtral config lacks num_local_experts"),
])  # fmt: skip
def test_what_is_not_modelled_is_refused(cfg: dict, message: str) -> None:
    with pytest.raises(ConfigRefused, match=message.replace("(", r"\(").replace(")", r"\)")):
        arch_from_hf_config(cfg)


def test_contradictory_moe_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match=r"top_k \(9\) must not exceed experts \(4\)"):
        arch_from_hf_config({"model_type": "mixtral", **TINY, "num_local_experts": 4, "num_experts_per_tok": 9})


def test_a_count_that_differs_from_transformers_is_refused() -> None:
    cfg = {"model_type": "mixtral", **TINY, "num_local_experts": 4, "num_experts_per_tok": 2}
    wrong = arch_from_hf_config(cfg).model_copy(update={"vocab": 100})
    with pytest.raises(CountMismatch, match="transformers builds"):
        cross_check(wrong, cfg)
    assert read_hf_config(cfg).moe is not None


@pytest.mark.parametrize("cfg, needle", [
    ({"model_type": "mixtral", **TINY, "num_local_experts": 4, "num_experts_per_tok": 5}, "top_k (5) must not exceed experts (4)"),
    ({"model_type": "mamba2", **TINY}, "model_type 'mamba2' is not modelled"),
    # a config transformers itself cannot build (the pad token beyond the vocabulary): refused, not a traceback
    ({"model_type": "smollm3", **TINY, "pad_token_id": 500}, "cannot build this model"),
])  # fmt: skip
def test_cli_refuses_a_bad_config_in_one_line(tmp_path: Path, cfg: dict, needle: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    job = tmp_path / "job.yaml"
    job.write_text(f"name: x\nkind: transformer\nmodel: {tmp_path / 'config.json'}\nmethod: lora\nseq_len: 512\nmicro_batch: 1\ntokens: 1.0e6\n")
    r = subprocess.run([sys.executable, "-m", "trainplan.cli.main", "plan", str(job)], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "model" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_moe_config_plans_with_every_expert_in_memory(tmp_path: Path) -> None:
    """Mixtral 8x7B LoRA: 87 GiB of bf16 weights does not fit one 80 GB A100 (the old reading said 61 GiB to spare)."""
    from trainplan.catalog import find_accelerator
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.planner.core import estimate_option
    from trainplan.spec import parse_job
    from trainplan.strategies import Strategy

    cat = get_catalog()
    job = parse_job({"name": "m", "kind": "transformer", "model": "mixtral-8x7b", "method": "lora", "seq_len": 2048, "micro_batch": 1,
                     "precision": "bf16", "tokens": 1e7})  # fmt: skip
    hw = hardware_for_gpu(find_accelerator("A100-80GB", cat), cat, gpus=1)
    est = estimate_option(job, hw, cat, strategy=Strategy.SINGLE)
    assert est.memory.weights / 2**30 == pytest.approx(46_702_792_704 * 2 / 2**30, rel=1e-3)
    assert not est.fits


def _saved_bytes(module, step):  # noqa: ANN001, ANN202
    """The saved-tensor counter of benchmarks/lora_saved_bytes.py (bytes autograd saves while ``step()`` runs)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from lora_saved_bytes import saved_bytes

    return saved_bytes(module, step)


def _moe_block_saved_and_expected(model_type: str, block_cls: object, h: int, f: int, experts: int, k: int,
                                  trainable: bool, **extra: object) -> tuple[int, float]:
    """(bytes autograd saves for one forward of transformers' MoE block on a bf16 CPU batch — parameters are not
    activations — , what trainplan counts: ``routed_expert_bytes`` of the model read from the same config, plus the
    block input the router keeps when it trains and grouped GEMM's int32 group offsets)."""
    import torch

    from trainplan.estimate.transformer import routed_expert_bytes
    from trainplan.spec import parse_job

    torch.manual_seed(0)
    seq, batch = 32, 2
    hf = {"hidden_size": h, "intermediate_size": f, "num_local_experts": experts, "num_experts_per_tok": k, **extra}
    cfg = transformers.AutoConfig.for_model(model_type, **hf)
    cfg._experts_implementation = "grouped_mm"  # what from_pretrained / from_config choose where it can dispatch
    block = block_cls(cfg).to(torch.bfloat16)  # type: ignore[operator]
    for p in block.parameters():
        p.requires_grad_(trainable)
    x = torch.randn(batch, seq, h, dtype=torch.bfloat16, requires_grad=True)
    saved = _saved_bytes(block, lambda: block(x))
    arch = arch_from_hf_config({"model_type": model_type, "num_hidden_layers": 2, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "vocab_size": 100, **hf})  # fmt: skip
    job = parse_job({"name": "t", "kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": seq,
                     "micro_batch": batch, "precision": "bf16", "tokens": 1e6,
                     **({} if trainable else {"method": "lora"})})  # fmt: skip
    router_input = batch * seq * h * 2 if trainable else 0  # a frozen router keeps no input
    return saved, routed_expert_bytes(job, arch) + router_input + 4 * experts


@pytest.mark.parametrize("trainable", [True, False], ids=["experts-train", "experts-frozen"])
def test_routed_expert_activations_match_autograd(trainable: bool) -> None:
    """What transformers' Mixtral block (its default grouped-GEMM experts) saves for backward equals trainplan's
    count, experts training and frozen."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    saved, expected = _moe_block_saved_and_expected("mixtral", MixtralSparseMoeBlock, 64, 48, 4, 2, trainable)
    assert saved == expected


@pytest.mark.parametrize("trainable", [True, False], ids=["experts-train", "experts-frozen"])
@pytest.mark.parametrize("shape", [(64, 48, 4, 2), (128, 96, 8, 3)], ids=["small", "wider"])
def test_gpt_oss_experts_keep_what_autograd_saves(trainable: bool, shape: tuple[int, int, int, int]) -> None:
    """gpt-oss's clamped SwiGLU experts and its top-k-then-softmax router (transformers ``GptOssMLP``): what autograd
    saves equals trainplan's count (``MoE.clamped_swiglu``, set for a gpt_oss config) at two shapes."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    assert arch_from_hf_config({"model_type": "gpt_oss", **TINY, "num_local_experts": 4}).moe.clamped_swiglu
    saved, expected = _moe_block_saved_and_expected("gpt_oss", GptOssMLP, *shape, trainable, head_dim=16,
                                                    sliding_window=8)  # fmt: skip
    assert saved == expected


def test_the_cross_check_count_is_kept_for_the_next_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path))
    cfg = {"model_type": "olmoe", **TINY, "num_experts": 8, "num_experts_per_tok": 2}
    n = transformers_param_count(cfg)
    stored = json.loads((tmp_path / "hf_param_counts.json").read_text())
    assert list(stored.values()) == [n] and n == param_counts(arch_from_hf_config(cfg)).total
    (tmp_path / "hf_param_counts.json").write_text(json.dumps({k: n + 1 for k in stored}))  # the store is read first
    assert transformers_param_count(cfg) == n + 1


MOE_TRACE = {"model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
             "vocab_size": 1000}  # fmt: skip


def test_the_trace_counts_expert_flops_by_routed_tokens() -> None:
    """transformers 5 runs the experts as one grouped GEMM over the routed tokens; the tally counts it
    (2·S·K·N forward), so the traced forward equals 2 × active matmul weights × tokens + the attention scores."""
    from trainplan.estimate.trace import build_hf_causal_lm, trace_training_step
    from trainplan.spec import InputSpec

    seq, batch = 128, 2
    r = trace_training_step(lambda: build_hf_causal_lm(MOE_TRACE), [InputSpec(shape=(seq,), dtype="int64", high=1000)],
                            micro_batch=batch, precision="bf16-pure", optimizer="adamw",
                            activation_checkpointing="none", loss="cross_entropy", device="cuda")  # fmt: skip
    arch = arch_from_hf_config(MOE_TRACE)
    counts = param_counts(arch)
    tokens = seq * batch
    matmul, scores = 2 * counts.matmul_per_token * tokens, 4 * arch.layers * seq * arch.hidden * tokens
    assert r.params == counts.total
    assert r.flops_forward == matmul + scores
    # backward: twice the matmuls; the fused attention kernel's backward is 2.5× its forward (compute.py)
    assert r.flops_backward == 2 * matmul + 2.5 * scores


def test_the_trace_refuses_fp32_experts_in_one_line() -> None:
    from trainplan.estimate.trace import TraceError, build_hf_causal_lm, trace_training_step
    from trainplan.spec import InputSpec

    with pytest.raises(TraceError, match="grouped-GEMM experts need bf16 weights") as info:
        trace_training_step(lambda: build_hf_causal_lm(MOE_TRACE), [InputSpec(shape=(64,), dtype="int64", high=1000)],
                            micro_batch=1, precision="bf16", optimizer="adamw", activation_checkpointing="none",
                            loss="cross_entropy", device="cuda")  # fmt: skip
    assert "\n" not in str(info.value)


def test_the_cli_prints_that_refusal_alone(tmp_path: Path) -> None:
    """`estimate --trace` of the same model prints the one line and nothing else on stderr: torch's fake-tensor mode
    logs the failing operator's traceback before raising it, which the trace keeps off the terminal."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(MOE_TRACE))
    job = tmp_path / "job.yaml"
    job.write_text(f"kind: transformer\nname: moe\nmodel: {config}\nseq_len: 16\nmicro_batch: 1\nsteps: 1\nprecision: fp32\n")
    done = subprocess.run([sys.executable, "-m", "trainplan.cli.main", "estimate", str(job), "--gpu", "A100-80GB", "--trace"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "grouped-GEMM experts need bf16 weights" in lines[0], done.stderr[:2000]


def _saved_by_loss_step(cfg: dict) -> int:
    """benchmarks/lora_saved_bytes.py ``loss_step_saved_bytes``: equal for two configs that keep the same tensors."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from lora_saved_bytes import loss_step_saved_bytes

    return loss_step_saved_bytes(cfg)


def test_granite_keeps_what_llama_keeps() -> None:
    """Granite's four scalars (embedding, attention, residual, logits) keep nothing for backward: a Granite and a Llama
    of the same shape save the same bytes in a training forward pass with its loss (saved-tensor hooks, CPU, bf16)."""
    shape = {**TINY, "attention_bias": False, "tie_word_embeddings": False}

    granite = {"model_type": "granite", **shape, "embedding_multiplier": 12.0, "attention_multiplier": 0.015625,
               "residual_multiplier": 0.22, "logits_scaling": 8.0}  # fmt: skip
    assert _saved_by_loss_step(granite) == _saved_by_loss_step({"model_type": "llama", **shape})
    assert param_counts(arch_from_hf_config(granite)).total == param_counts(arch_from_hf_config({"model_type": "llama", **shape})).total


def test_smollm3_nope_layers_keep_what_llama_keeps() -> None:
    """SmolLM3's NoPE layers skip the rotary embedding, which keeps nothing of its own for backward (the product with
    cos / sin needs only them): a SmolLM3 with NoPE on every other layer and a Llama of the same shape save the same
    bytes in a training forward pass with its loss (saved-tensor hooks, CPU, bf16) — so trainplan models NoPE as
    Llama's memory (docs/models.md)."""
    shape = {**TINY, "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None}

    smol = {"model_type": "smollm3", **shape, "no_rope_layer_interval": 2}
    assert arch_from_hf_config(smol).nope_layers == 2
    assert _saved_by_loss_step(smol) == _saved_by_loss_step({"model_type": "llama", **shape})


def test_kimi_k2_reads_as_the_deepseek_v3_it_is_built_as() -> None:
    """Kimi K2's config.json names model_type kimi_k2, which transformers does not ship, for a model DeepSeek-V3's class
    builds exactly (Moonshot's deployment guide): read with DeepSeek-V3's reader, cross-checked, traced and run as
    deepseek_v3; its 1.03T parameters and 32.9B a token (matmul weights and embedding) against the published "1
    trillion total, 32 billion activated". Kimi K2.5's multimodal config points at its text config."""
    from trainplan.model import hf_config

    arch = arch_from_hf_config(KIMI_K2)
    counts = param_counts(arch)
    assert arch.hf_model_type == "kimi_k2" and arch.moe is not None and arch.moe.experts == 384
    assert cross_check(arch, KIMI_K2) == counts.total == 1_026_408_209_408
    assert round((counts.matmul_per_token + counts.embedding) / 1e9, 1) == 32.9
    assert hf_config(arch)["model_type"] == "deepseek_v3"
    with pytest.raises(ConfigRefused, match="text_config .*kimi_k2"):
        arch_from_hf_config({"model_type": "kimi_k25", "text_config": KIMI_K2})


@pytest.mark.parametrize(("changes", "needle"), [
    ({"model_type": "deepseek_v32", "layer_types": ["sliding_attention"] * 61}, "layer_types"),
    ({"model_type": "deepseek_v32", "layer_types": ["indexed_attention"] * 60}, "layer_types"),
    ({"model_type": "deepseek_v32", "indexer_types": ["full"] * 61}, "indexer_types"),
    ({"model_type": "deepseek_v32", "q_lora_rank": None}, "q_lora_rank"),
    ({"model_type": "deepseek_v32", "index_n_heads": 0}, "index_n_heads"),
    ({"model_type": "deepseek_v32", "index_topk": "2048"}, "index_topk"),
    ({"model_type": "glm_moe_dsa", "indexer_types": ["shared"] + ["full"] * 77}, "indexer_types"),
    ({"model_type": "glm_moe_dsa", "indexer_types": ["full", "sparse"] + ["full"] * 76}, "indexer_types"),
    ({"model_type": "glm_moe_dsa", "index_topk_pattern": "FX"}, "index_topk_pattern"),
    ({"model_type": "glm_moe_dsa", "index_topk_freq": -1}, "index_topk_freq"),
    ({"model_type": "glm_moe_dsa", "index_topk_pattern": "F" * 10}, "indexer_types"),
])  # fmt: skip
def test_deepseek_sparse_attention_configs_it_cannot_read_are_refused_in_one_line(changes: dict, needle: str) -> None:
    """DeepSeek-V3.2's and GLM-5's readers refuse, naming the key, what they do not model: a layer that is not indexed,
    per-layer indexer modes on DeepSeek-V3.2, a first layer without its own indexer, an indexer without the compressed
    query it reads, indexer sizes that are not positive integers, a pattern that is not F / S or not one per layer."""
    with pytest.raises(ConfigRefused) as err:
        arch_from_hf_config(changes)
    assert needle in str(err.value) and "\n" not in str(err.value)
