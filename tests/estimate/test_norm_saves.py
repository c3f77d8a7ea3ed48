"""What each family's RMSNorms keep for backward, against autograd (saved-tensor hooks on transformers' own classes).

Two styles exist in the claimed families: Llama's ``weight * x.to(dtype)`` keeps the 16-bit normalised tensor for the
weight's gradient; Gemma's ``x * (1 + weight.float())`` and gpt-oss's / OLMo 2's ``(weight * x).to(dtype)`` keep the
fp32 one. And Qwen3, Gemma 3, OLMoE and GLM-4.5 normalise q and k too, which a Llama of one shape does not.
"""

from __future__ import annotations

import importlib

import pytest

from trainplan.estimate.memory import norm_saved_bytes_per_token
from trainplan.estimate.transformer import qk_norm_bytes_per_token
from trainplan.hfconfig import arch_from_hf_config
from trainplan.spec import Precision

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# model_type -> its RMSNorm class (transformers 5.25 modeling_<family>.py)
NORMS = {"llama": "LlamaRMSNorm", "mistral": "MistralRMSNorm", "qwen2": "Qwen2RMSNorm", "qwen3": "Qwen3RMSNorm",
         "gemma": "GemmaRMSNorm", "gemma2": "Gemma2RMSNorm", "gemma3_text": "Gemma3RMSNorm", "phi3": "Phi3RMSNorm",
         "mixtral": "MixtralRMSNorm", "qwen3_moe": "Qwen3MoeRMSNorm", "olmoe": "OlmoeRMSNorm",
         "deepseek_v3": "DeepseekV3RMSNorm", "gpt_oss": "GptOssRMSNorm", "glm4_moe": "Glm4MoeRMSNorm", "glm": "GlmRMSNorm", "glm4": "Glm4RMSNorm",
         "hunyuan_v1_dense": "HunYuanDenseV1RMSNorm", "ernie4_5": "Ernie4_5RMSNorm",
         "granitemoe": "GraniteMoeRMSNorm", "granitemoeshared": "GraniteMoeSharedRMSNorm", "dots1": "Dots1RMSNorm",
         "minimax_m2": "MiniMaxM2RMSNorm", "ernie4_5_moe": "Ernie4_5_MoeRMSNorm", "arcee": "ArceeRMSNorm",
         "flex_olmo": "FlexOlmoRMSNorm", "hunyuan_v1_moe": "HunYuanMoEV1RMSNorm", "cohere": "CohereLayerNorm", "cohere2": "Cohere2LayerNorm",
         "smollm3": "SmolLM3RMSNorm", "granite": "GraniteRMSNorm", "ministral3": "Ministral3RMSNorm",
         "olmo2": "Olmo2RMSNorm", "olmo3": "Olmo3RMSNorm", "exaone4": "Exaone4RMSNorm"}  # fmt: skip


def _saved(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd saves in ``module(x)``, the input and the parameters left out (each storage once)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x).float().sum()
    own = {x.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in module.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in own)


def _per_token(module: torch.nn.Module, hidden: int) -> float:
    """Saved bytes per token: the difference between 64 and 32 tokens (a per-call constant, such as Gemma's
    ``1 + weight.float()``, drops out)."""
    big, small = (torch.randn(n, hidden, dtype=torch.bfloat16, requires_grad=True) for n in (64, 32))
    return (_saved(module, big) - _saved(module, small)) / 32


@pytest.mark.parametrize("trainable", [True, False], ids=["trainable", "frozen"])
@pytest.mark.parametrize("mt", sorted(NORMS))
def test_each_family_norm_keeps_what_the_estimate_counts(mt: str, trainable: bool) -> None:
    mod = mt if mt != "gemma3_text" else "gemma3"
    cls = getattr(importlib.import_module(f"transformers.models.{mod}.modeling_{mod}"), NORMS[mt])
    hidden = 64
    norm = cls(hidden).to(torch.bfloat16)
    norm.weight.requires_grad_(trainable)
    cfg = transformers.AutoConfig.for_model(mt).to_dict()
    if mt == "deepseek_v3":
        cfg["num_experts_per_tok"] = 8
    if mt in ("hunyuan_v1_dense", "hunyuan_v1_moe"):  # its class default (None) does not build; Hunyuan-7B's config states 128
        cfg["head_dim"] = 128
    if mt == "dots1":  # its class leaves the experts unset
        cfg.update(n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2)
    arch = arch_from_hf_config(cfg)
    expected = norm_saved_bytes_per_token(hidden, arch.norm, Precision.BF16, weight_trainable=trainable,
                                          fp32_weight=arch.norm_fp32_weight, python=arch.norm_python)  # fmt: skip
    assert _per_token(norm, hidden) == expected


def test_a_weightless_norm_keeps_what_a_frozen_one_keeps() -> None:
    """nanochat's RMSNorm has no weight (``x.float() * rsqrt(mean(x²) + eps)``, cast back): it keeps the fp32 copy of
    its input and the rstd — what a Llama norm with a frozen weight keeps, which the estimate counts for it."""
    from transformers.models.nanochat.modeling_nanochat import NanoChatRMSNorm

    arch = arch_from_hf_config({"model_type": "nanochat", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                                "vocab_size": 101, "intermediate_size": 96})  # fmt: skip
    assert not arch.norm_weight
    expected = norm_saved_bytes_per_token(64, arch.norm, Precision.BF16, weight_trainable=False)
    assert _per_token(NanoChatRMSNorm(eps=1e-6), 64) == expected == 4 * 64 + 4


def _saved_by_loss_step(cfg: dict, batch: int = 2) -> int:
    """benchmarks/lora_saved_bytes.py ``loss_step_saved_bytes``: what a bf16 training forward pass with its loss keeps."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from lora_saved_bytes import loss_step_saved_bytes

    return loss_step_saved_bytes(cfg, batch=batch)


@pytest.mark.parametrize("head_dim", [16, 24])
def test_qwen3_q_and_k_norms_keep_what_the_estimate_counts(head_dim: int) -> None:
    """A Qwen3 and a Llama of one shape (no biases) differ only by the per-head q/k RMSNorms: autograd's difference
    over the 4 layers and 64 tokens is the estimate's :func:`qk_norm_bytes_per_token`, to the byte."""
    shape = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": head_dim, "vocab_size": 101, "pad_token_id": 0,
             "tie_word_embeddings": False, "attention_bias": False, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
    qwen3 = {"model_type": "qwen3", **shape}
    per_token = qk_norm_bytes_per_token(arch_from_hf_config(qwen3), Precision.BF16, trainable=True)
    assert per_token == (4 + 2) * head_dim * (4 + 2) + 4 * (4 + 2)  # fp32 copy + bf16 normalised, an rstd a head
    assert _saved_by_loss_step(qwen3) - _saved_by_loss_step({"model_type": "llama", **shape}) == 4 * 64 * per_token


def test_full_width_and_fp32_weight_q_and_k_norms() -> None:
    """OLMoE's norms span q's and k's full width (one statistic a token); Gemma 3's multiply their weight in fp32;
    compiled, a norm keeps its 16-bit input and the statistic; frozen (LoRA), no normalised copy."""
    tiny = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 101}  # fmt: skip
    olmoe = arch_from_hf_config({"model_type": "olmoe", **tiny, "num_experts": 4, "num_experts_per_tok": 2})
    gemma3 = arch_from_hf_config({"model_type": "gemma3_text", **tiny, "head_dim": 16})
    bf16 = Precision.BF16
    assert qk_norm_bytes_per_token(olmoe, bf16, trainable=True) == 6 * (64 + 32) + 4 * 2
    assert qk_norm_bytes_per_token(gemma3, bf16, trainable=True) == 8 * (64 + 32) + 4 * 6
    assert qk_norm_bytes_per_token(gemma3, bf16, trainable=False) == 4 * (64 + 32) + 4 * 6
    assert qk_norm_bytes_per_token(gemma3, bf16, trainable=True, compiled=True) == 2 * (64 + 32) + 4 * 6
    assert qk_norm_bytes_per_token(arch_from_hf_config({"model_type": "llama", **tiny}), bf16, trainable=True) == 0


@pytest.mark.parametrize("mt", ["olmo2", "olmo3"])
def test_olmo_post_norms_keep_what_the_estimate_counts(mt: str) -> None:
    """OLMo 2 / 3 against a Llama of one shape: the norms after the sublayers keep what norms before them keep, so
    autograd's difference is the fp32-weight norms' extra fp32 copy (2 a block and the final one) and the full-width
    q/k norms — the estimate's terms, to the byte (2 x 32 tokens, 4 layers; OLMo 3 with its window on 3 of 4 layers,
    wider than the sequence) — plus the rotary tables: OLMo rotates q and k in fp32, so the cos and sin it keeps
    (one row per position, whatever the batch and the layer count: 32 x 16 values each) are fp32 where Llama keeps
    them in bf16, and OLMo 3 has two pairs (sliding and full layers). They are left out of the estimate."""
    shape = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 101, "pad_token_id": 0, "tie_word_embeddings": False,
             "attention_bias": False, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
    olmo = {"model_type": mt, **shape}
    arch = arch_from_hf_config(olmo)
    assert arch.post_norms and arch.norm_fp32_weight and arch.qk_norm == "full"
    bf16, tokens, layers = Precision.BF16, 64, 4
    norm_extra = (norm_saved_bytes_per_token(64, "rmsnorm", bf16, fp32_weight=True)
                  - norm_saved_bytes_per_token(64, "rmsnorm", bf16))  # fmt: skip
    assert norm_extra == 2 * 64
    expected = tokens * (layers * (2 * norm_extra + qk_norm_bytes_per_token(arch, bf16, trainable=True)) + norm_extra)
    pairs = 2 if mt == "olmo3" else 1
    tables = 2 * 32 * 16 * (4 * pairs - 2)  # cos and sin: fp32 per pair, against Llama's one bf16 pair
    assert _saved_by_loss_step(olmo) - _saved_by_loss_step({"model_type": "llama", **shape}) == expected + tables


def test_the_stack_decides_the_norm_style(monkeypatch: pytest.MonkeyPatch) -> None:
    """LitGPT's own RMSNorm multiplies its weight in fp32 for every model; stacks that run transformers' modeling code
    take the family's class. For a full fine-tune of a Llama under LitGPT the blocks and the final norm keep 2 bytes
    more per norm element than with Llama's norm style (2 norms a block + the final one); a LoRA job's frozen norms
    keep no normalised copy, so the style changes nothing there."""
    from trainplan.catalog import get_catalog, resolve_model
    from trainplan.estimate import transformer
    from trainplan.estimate.stack import effective_knobs
    from trainplan.spec import parse_job

    def job(stack: str, model: str = "llama-2-7b", **extra: object):  # noqa: ANN202
        return parse_job({"kind": "transformer", "model": model, "seq_len": 512, "micro_batch": 1, "precision": "bf16",
                          "steps": 1, "stack": stack, "knobs": {"compile": False}, **extra})  # fmt: skip

    def activations(j) -> float:  # noqa: ANN001
        arch, k = resolve_model(j.model), effective_knobs(j, get_catalog())
        return transformer.block_activation_bytes(j, arch, k) + transformer.head_activation_bytes(j, arch, k)

    llama = resolve_model("llama-2-7b")
    cat = get_catalog()
    assert transformer.norm_fp32_weight(llama, effective_knobs(job("litgpt"), cat))
    assert not transformer.norm_fp32_weight(llama, effective_knobs(job("hf-trainer"), cat))
    assert transformer.norm_fp32_weight(resolve_model("gemma-2-2b"), effective_knobs(job("hf-trainer", "gemma-2-2b"), cat))
    assert not transformer.norm_fp32_weight(resolve_model("gemma-2-2b"), effective_knobs(job("torchtune", "gemma-2-2b"), cat))
    full, lora = job("litgpt"), job("litgpt", method="lora", lora={"rank": 8})
    fp32_full, fp32_lora = activations(full), activations(lora)
    monkeypatch.setattr(transformer, "norm_fp32_weight", lambda arch, k: False)
    assert fp32_full - activations(full) == 512 * (2 * llama.layers + 1) * 2 * llama.hidden
    assert fp32_lora == activations(lora)


def test_exaone4_keeps_what_the_estimate_counts() -> None:
    """EXAONE 4.0 against a Llama of one shape: its norms follow the sublayers (Llama's norm class: the same bytes) and
    it normalises q and k per head — the estimate's q/k term over 4 layers and 64 tokens, to the byte; its global
    layers skip the rotary embedding (NoPE), which keeps nothing of its own (the window, 3 of 4 layers, is wider than
    the sequence)."""
    shape = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 101, "pad_token_id": 0,
             "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
    exaone = {"model_type": "exaone4", **shape, "sliding_window": 64, "sliding_window_pattern": 4}
    arch = arch_from_hf_config(exaone)
    assert (arch.qk_norm, arch.sliding_layers, arch.nope_layers, arch.norm_fp32_weight, arch.post_norms) == (
        "head", 3, 1, False, True)
    per_token = qk_norm_bytes_per_token(arch, Precision.BF16, trainable=True)
    llama = {"model_type": "llama", **shape, "attention_bias": False}
    assert _saved_by_loss_step(exaone) - _saved_by_loss_step(llama) == 4 * 64 * per_token


# ------------------------------------------------------------------------------- whole models against a Llama

TINY = {"intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 101, "pad_token_id": 0, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None}  # fmt: skip
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
_ABSENT = object()  # a FAMILIES value that drops the key from the family's config (Kolibri 1 has no intermediate_size)
FAMILIES = {
    "qwen2": {}, "qwen3": {"head_dim": 16}, "mistral": {}, "gemma": {"head_dim": 16}, "gemma3_text": {"head_dim": 16},
    "gemma2": {"head_dim": 16}, "phi3": {}, "gpt_oss": {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "glm4_moe": {"head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                 "num_nextn_predict_layers": 0, "use_qk_norm": True},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2}, "qwen2_moe": {**MOE, "shared_expert_intermediate_size": 48},
    "qwen3_moe": {**MOE, "head_dim": 16}, "olmoe": {"num_experts": 4, "num_experts_per_tok": 2},
    "deepseek_v3": {"num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                    "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": 24,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12,
                    "num_nextn_predict_layers": 0},
    "smollm3": {}, "granite": {}, "exaone4": {"head_dim": 16, "sliding_window": 64}, "olmo2": {}, "olmo3": {},
    "seed_oss": {"head_dim": 16, "attention_dropout": 0.0, "residual_dropout": 0.0}, "ministral": {"head_dim": 16},
    "ministral3": {"head_dim": 16}, "glm": {"head_dim": 16}, "glm4": {"head_dim": 16},
    "hunyuan_v1_dense": {"head_dim": 16}, "ernie4_5": {"head_dim": 16},
    "granitemoe": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "granitemoeshared": {"num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 48},
    "minimax_m2": {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2},
    "ernie4_5_moe": {"head_dim": 16, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 32},
    "arcee": {"num_key_value_heads": 4, "bos_token_id": None, "eos_token_id": None},
    "gpt_neox": {"num_key_value_heads": 4},
    "flex_olmo": {"num_experts": 4, "num_experts_per_tok": 2},
    "nemotron": {"head_dim": 16, "bos_token_id": None, "eos_token_id": None},
    "starcoder2": {"attention_dropout": 0.0, "residual_dropout": 0.0, "embedding_dropout": 0.0},
    "dots1": {"head_dim": 16, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
              "moe_intermediate_size": 16, "first_k_dense_replace": 1},
    "cohere": {"use_qk_norm": True, "logit_scale": 0.5}, "cohere2": {"sliding_window": 64},
    "hunyuan_v1_moe": {"head_dim": 16, "num_experts": 4, "moe_topk": 2}, "nanochat": {"num_key_value_heads": 2},
    "internlm3": {"head_dim": 16, "qkv_bias": True, "bias": True}, "iquestcoder": {"head_dim": 16},
    "solar_open": {"head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "jais2": {"num_key_value_heads": 4}, "helium": {}, "vaultgemma": {"head_dim": 16},
    "stablelm": {"use_qkv_bias": True}, "stablelm-parallel": {"model_type": "stablelm", "use_parallel_residual": True},
    "stablelm-qk-layernorm": {"model_type": "stablelm", "use_parallel_residual": True, "qk_layernorm": True},
    "youtu": {"num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
              "v_head_dim": 12},
    "minicpm3": {"num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                 "v_head_dim": 12},
    "glm4_moe_lite": {"num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                      "moe_intermediate_size": 16, "q_lora_rank": 24, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                      "qk_rope_head_dim": 4, "v_head_dim": 12},
    "axk1": {"num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
             "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16, "q_lora_rank": 24, "kv_lora_rank": 16,
             "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12},
    "exaone_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "sliding_window": 64},
    "kolibri1": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                 "shared_expert_intermediate_size": 24, "sliding_window": 64, "intermediate_size": _ABSENT},
    "minicpm5_moe": {"head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "afmoe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "sliding_window": 64,
              "num_shared_experts": 1},
    "mellum": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
               "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]},
    "exaone": {}, "cwm": {"head_dim": 16, "sliding_window": 64, "bos_token_id": 0}, "hyperclovax": {},
    "param2moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                  "num_shared_experts": 1},
    "sarvam_moe": {"head_dim": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "sarvam_mla": {"num_key_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
                   "moe_intermediate_size": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                   "v_head_dim": 12},
    "deepseek_v32": {"num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                     "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": 24,
                     "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12,
                     "index_n_heads": 2, "index_head_dim": 8, "index_topk": 32},
    "glm_moe_dsa": {"num_key_value_heads": 4, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 16, "first_k_dense_replace": 1, "q_lora_rank": 24, "kv_lora_rank": 16,
                    "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12, "index_n_heads": 2,
                    "index_head_dim": 8, "index_topk": 32, "indexer_types": ["full", "shared", "full", "shared"]},
}  # fmt: skip


def _predicted(cfg: dict, micro_batch: int = 2) -> float:
    from trainplan.catalog import get_catalog
    from trainplan.estimate.stack import effective_knobs
    from trainplan.estimate.transformer import block_activation_bytes, head_activation_bytes
    from trainplan.spec import parse_job

    arch = arch_from_hf_config(cfg)
    job = parse_job({"kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": 32,
                     "micro_batch": micro_batch, "precision": "bf16-pure", "steps": 1, "stack": "plain"})  # fmt: skip
    k = effective_knobs(job, get_catalog())
    return block_activation_bytes(job, arch, k) + head_activation_bytes(job, arch, k)


#: families whose query reaches SDPA heads-major (the concatenating rotary of Phi-3, the GLMs — Param2 and Sarvam MoE
#: run GLM-4.5's, which concatenates an empty pass-through at a full-width rotary too —, MiniMax-M2, Nemotron and
#: StableLM) or that attend eagerly here (Gemma 2, VaultGemma, gpt-oss): their attention output is copied for the
#: output projection on this CPU too (measured)
_OUTPUT_COPIED_ON_CPU = frozenset({"phi3", "glm4_moe", "param2moe", "sarvam_moe", "glm", "glm4", "minimax_m2", "nemotron",
                                  "gemma2", "vaultgemma", "gpt_oss", "stablelm"})


def _unexplained_per_token(cfg: dict) -> float:
    """(autograd's bytes − the estimate's) per token: the difference between micro-batches of 4 and 2 sequences of
    32 tokens, so what is kept once per call (a norm's ``1 + weight``, a router's fp32 weight, rotary tables) drops out.

    One known CPU / CUDA difference is put back: where a Llama-style rotary leaves the query laid out (B, S, H, D), this
    CPU's SDPA kernel returns its output in that order and the output projection's input is a view of it (one
    storage), where the estimate counts the contiguous copy CUDA's flash kernel is taken to make (docs/estimates.md,
    *The attention output twice*) — e·q a token and layer, added to the measurement here."""
    def kept(batch: int) -> int:
        # GLM-4.5's router breaks score ties differently from one identical run to the next, and the expert dispatch's
        # index buffers then vary by up to 2 KB (DeepSeek-V3.2 and GLM-5 by up to 4 KB): an MoE step is read as the
        # most it keeps over five runs
        runs = 5 if any(k in cfg for k in ("n_routed_experts", "num_experts", "num_local_experts")) else 1
        return max(_saved_by_loss_step(cfg, batch=batch) for _ in range(runs))

    measured = kept(4) - kept(2)
    arch = arch_from_hf_config(cfg)
    # latent attention concatenates its query heads-major too (DeepseekV3Attention: torch.cat((q_pass, q_rot)))
    if cfg["model_type"] not in _OUTPUT_COPIED_ON_CPU and arch.mla is None:
        from trainplan.estimate import architecture as arch_mod

        measured += 2 * arch_mod.attention_inner_dim(arch) * arch.layers * 64
    return (measured - (_predicted(cfg, 4) - _predicted(cfg, 2))) / 64


def _gap(mt: str, hidden: int) -> float:
    """:func:`_unexplained_per_token` for the family less the same for a Llama of one shape, per layer (4 layers, bf16, SDPA
    where the family has it)."""
    extra = FAMILIES[mt]
    if mt == "helium":  # its output projection takes hidden_size inputs: heads x head_dim must be the width
        extra = {"head_dim": hidden // TINY["num_attention_heads"]}
    cfg = {"model_type": mt, **TINY, "hidden_size": hidden, **extra}  # a variant's key names its model_type
    cfg = {k: v for k, v in cfg.items() if v is not _ABSENT}
    llama = {"model_type": "llama", **TINY, "hidden_size": hidden, "attention_bias": False,
             **{k: v for k, v in extra.items() if k in ("head_dim", "num_key_value_heads")}}  # fmt: skip
    if "kv_lora_rank" in extra:  # MLA's widths do not follow the hidden size: keep the Llama's attention fixed too
        llama["head_dim"] = 16
    return (_unexplained_per_token(cfg) - _unexplained_per_token(llama)) / 4


@pytest.mark.parametrize("mt", sorted(FAMILIES))
def test_each_family_keeps_what_the_estimate_counts_beyond_a_llama(mt: str) -> None:
    """For every claimed decoder family, what a training forward pass keeps beyond a Llama of one shape (saved-tensor
    hooks) is what the estimate adds beyond that Llama: within 48 bytes per token and layer (the routers' per-expert
    and constant terms; what is kept once per call is differenced out), and the difference does not grow with the
    width (h 64 -> 128: within 8 bytes, an eighth of a byte per hidden element), so no width-proportional term of a
    byte or more per element is missing."""
    narrow, wide = _gap(mt, 64), _gap(mt, 128)
    assert abs(narrow) <= 48, narrow
    assert abs(wide - narrow) <= 8, (narrow, wide)


def _reference_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):  # noqa: ANN001, ANN202
    """A stand-in for PyTorch's fused SDPA kernels that keeps what they keep for backward — the query, key and value
    as passed, the output allocated in the query's layout, an fp32 log-sum-exp per head and row
    (``ScaledDotProductFlashAttentionForCpuBackward0``'s ``_saved_*``; ``_scaled_dot_product_efficient_attention`` in
    PyTorch's derivatives.yaml) — for head widths this CPU's flash kernel does not take: with q/k wider or narrower
    than v it falls back to the math path, which keeps the s² probabilities and fp32 copies no GPU kernel keeps."""
    import torch

    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):  # noqa: ANN001, ANN205
            with torch.no_grad():
                scores = (q.float() @ k.float().transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
                n = scores.shape[-1]
                if is_causal or attn_mask is None:
                    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
                else:
                    scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask
                lse = torch.logsumexp(scores, dim=-1)
                result = (torch.softmax(scores, -1) @ v.float()).to(q.dtype)
            order = sorted(range(4), key=lambda d: -q.stride(d))  # the query's layout, outermost first
            out = q.new_empty([result.shape[d] for d in order]).permute([order.index(d) for d in range(4)])
            out.copy_(result)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):  # noqa: ANN001, ANN205
            q, k, v, _, _ = ctx.saved_tensors
            with torch.enable_grad():
                inputs = [x.detach().requires_grad_() for x in (q, k, v)]
                o = Fused.apply(*inputs)  # never reached by the byte count, which runs forward only
                return torch.autograd.grad(o, inputs, grad)

    return Fused.apply(query, key, value)


def test_latent_attention_at_unequal_head_widths_keeps_what_the_estimate_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSeek-V3's q/k heads are wider than its v heads (192 against 128). V is a view of ``kv_b_proj``'s output,
    which the kernel keeps as passed (not a V of its own), and the output is v_head_dim wide: what the estimate counts
    (``transformer._attention_widths``). This CPU's flash kernel takes equal widths only, so the comparison runs
    through :func:`_reference_sdpa`, which first reproduces the real kernel's bytes at equal widths (for the latent
    attention and for the Llama it is compared with); then at v narrower and wider than q/k the gap against a Llama
    is the equal-width gap (the router's ties move it by up to 4 bytes run to run)."""
    equal = _gap("deepseek_v3", 64)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", _reference_sdpa)
    assert abs(_gap("deepseek_v3", 64) - equal) <= 4
    for v in (8, 16):
        monkeypatch.setitem(FAMILIES, "deepseek_v3-v", {**FAMILIES["deepseek_v3"], "model_type": "deepseek_v3", "v_head_dim": v})
        assert abs(_gap("deepseek_v3-v", 64) - equal) <= 8, v


def test_fp32_routers_keep_a_fp32_copy_of_their_input() -> None:
    """DeepSeek-V2 / V3's and GLM-4.5's routers take F.linear of the layer input cast to fp32 and keep that copy for
    their weight's gradient: 4 bytes per hidden element a token more than Mixtral's router, the term the estimate adds
    for them (``MoE.router_fp32``)."""
    def slope(module_name: str, cls: str, **cfg: object) -> float:
        mod = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
        def saved(router: torch.nn.Module, tokens: int, hidden: int) -> int:
            seen: dict[int, int] = {}

            def pack(t: torch.Tensor) -> torch.Tensor:
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                return t

            x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                router(x)[1].float().sum()
            own = {x.untyped_storage().data_ptr()} | {p.untyped_storage().data_ptr() for p in router.parameters()}
            return sum(n for p, n in seen.items() if p not in own)

        per_token = []
        for hidden in (64, 128):
            router = getattr(mod, cls)(transformers.AutoConfig.for_model(module_name, hidden_size=hidden, **cfg))
            router = router.to(torch.bfloat16)
            per_token.append((saved(router, 128, hidden) - saved(router, 64, hidden)) / 64)
        return (per_token[1] - per_token[0]) / 64  # bytes per hidden element and token

    assert slope("deepseek_v3", "DeepseekV3TopkRouter", n_routed_experts=8, num_experts_per_tok=2, n_group=1,
                 topk_group=1) == 4  # fmt: skip
    assert slope("glm4_moe", "Glm4MoeTopkRouter", n_routed_experts=8, num_experts_per_tok=2) == 4
    assert slope("deepseek_v2", "DeepseekV2TopkRouter", n_routed_experts=8, num_experts=8, num_experts_per_tok=2) == 4
    assert slope("mixtral", "MixtralTopKRouter", num_local_experts=8, num_experts_per_tok=2) == 0
    for cfg in ({"model_type": "deepseek_v3", **TINY, "hidden_size": 64, **FAMILIES["deepseek_v3"]},
                {"model_type": "glm4_moe", **TINY, "hidden_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "moe_intermediate_size": 16}):  # fmt: skip
        moe = arch_from_hf_config(cfg).moe
        assert moe is not None and moe.router_fp32


def test_on_this_cpu_a_llama_s_sdpa_output_and_its_projection_input_are_one_storage() -> None:
    """The CPU fact the family comparison corrects for: a Hugging Face Llama's SDPA output and its output projection's
    input share one storage here, so with the copy put back the unexplained rest does not change with the attention's
    width (head_dim 16 -> 32) — without it, it would move by 2 bytes per q element."""
    def llama(head_dim: int) -> dict:
        return {"model_type": "llama", **TINY, "hidden_size": 64, "attention_bias": False, "head_dim": head_dim}

    assert _unexplained_per_token(llama(16)) == _unexplained_per_token(llama(32))


def test_the_fp32_router_copy_is_transformers_own() -> None:
    """The router's fp32 input copy is counted where transformers' DeepSeek-V3 runs (plain, hf-trainer …), not under
    torchtitan, whose router runs its gate in the model's dtype: a full DeepSeek-V3-shaped job's MoE layer differs
    between the two by 4 bytes per hidden element a token, beside torchtitan's own fp32 combine of the experts."""
    from trainplan.catalog import get_catalog
    from trainplan.estimate.stack import effective_knobs
    from trainplan.estimate.transformer import kept_routed_expert_bytes, routed_expert_bytes
    from trainplan.spec import parse_job

    cfg = {"model_type": "deepseek_v3", **TINY, "hidden_size": 64, **FAMILIES["deepseek_v3"]}
    arch = arch_from_hf_config(cfg)

    def kept(stack: str) -> float:
        job = parse_job({"kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": 32,
                         "micro_batch": 2, "precision": "bf16", "steps": 1, "stack": stack})  # fmt: skip
        return kept_routed_expert_bytes(job, arch, effective_knobs(job, get_catalog()))

    titan = parse_job({"kind": "transformer", "model": arch.model_dump(exclude_none=True), "seq_len": 32,
                       "micro_batch": 2, "precision": "bf16", "steps": 1, "stack": "torchtitan"})  # fmt: skip
    combine = routed_expert_bytes(titan, arch, fp32_combine=True) - routed_expert_bytes(titan, arch)
    assert kept("hf-trainer") - (kept("torchtitan") - combine) == 64 * 4 * 64
