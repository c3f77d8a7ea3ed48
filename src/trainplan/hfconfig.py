"""Reading a Hugging Face ``config.json`` as a :class:`~trainplan.model.ModelArch`: understood completely, or refused.

One reader per claimed ``model_type``.  Each consumes the keys that change parameters, FLOPs or memory and
names the keys it knows to change none of them (:data:`INERT_KEYS`, with the reason); any other key, or a
value the reader does not model (``mlp_bias: true``, a ``moe_layer_freq`` above 1 …), is refused in one line
(:class:`ConfigRefused`).  A ``model_type`` without a reader is refused too: reading a mixture-of-experts
config as a dense Llama was the silent error this module exists to prevent.

Key names and the layer structure each reader assumes follow the transformers configuration and modeling
files of each family (``models/<family>/configuration_*.py`` and ``modeling_*.py``, transformers 5.x); the
parameter counts that follow from them are cross-checked against transformers building the model on the
meta device (``estimate/hf_check.py``) and tested for every family in ``tests/test_hf_families.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from trainplan.model import MLA, Indexer, ModelArch, MoE


class ConfigRefused(ValueError):
    """A config that trainplan cannot read exactly: the message names the key and what is allowed."""


# Keys that change neither parameters, FLOPs nor memory of a training step, with the reason.
INERT_KEYS: dict[str, str] = {
    **dict.fromkeys(("architectures", "model_type", "transformers_version", "_name_or_path", "name_or_path", "auto_map",
                     "torch_dtype", "dtype", "use_cache", "cache_implementation", "output_attentions",
                     "output_hidden_states", "return_dict", "torchscript", "_attn_implementation",
                     "attn_implementation", "id2label", "label2id", "task_specific_params", "problem_type",
                     "tokenizer_class", "chat_template", "is_encoder_decoder", "bad_words_ids",
                     "keys_to_ignore_at_inference", "license", "language", "sequence_length",
                     "output_scores", "return_dict_in_generate", "tf_legacy_loss", "use_bfloat16"),
                    "bookkeeping or inference-only"),  # fmt: skip
    # SmolLM / SmolLM2 configs (exported by nanotron): transformers' Llama reads neither key
    **dict.fromkeys(("is_llama_config", "rope_interleaved"), "nanotron export bookkeeping, unread by transformers"),
    "transformers.js_config": "settings of transformers.js (in-browser inference)",
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
                     "image_token_index", "boi_token_index", "eoi_token_index", "eod_token_id"), "token ids"),
    **dict.fromkeys(("initializer_range", "initializer_factor", "init_std", "initializer_cutoff_factor"), "initialisation"),
    **dict.fromkeys(("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "norm_epsilon"), "a norm's epsilon"),
    **dict.fromkeys(("rope_theta", "rope_scaling", "rope_parameters", "rope_local_base_freq", "rope_interleave",
                     "partial_rotary_factor", "original_max_position_embeddings", "rope_type", "rotary_dim"),
                    "rotary frequencies (no parameters; rotary cost is per q/k element whatever the base)"),  # fmt: skip
    **dict.fromkeys(("hidden_act", "hidden_activation", "activation_function"),
                    "the MLP's activation (a gated MLP has three matrices whatever its non-linearity)"),
    **dict.fromkeys(("output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "aux_loss_alpha",
                     "seq_aux", "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group",
                     "topk_group", "ep_size", "router_z_loss_coef", "swiglu_limit", "swiglu_alpha"),
                    "routing hyper-parameters (which experts a token picks, not how many or how large)"),  # fmt: skip
    **dict.fromkeys(("query_pre_attn_scalar", "attn_logit_softcapping", "clip_qkv", "pretraining_tp",
                     "attention_multiplier", "embedding_multiplier"),
                    "a scalar applied inside attention or the embedding (no parameters; element-wise cost)"),
    **dict.fromkeys(("chunk_size_feed_forward",), "feed-forward chunking, which none of these families' modeling code applies"),
    **dict.fromkeys(("quantization_config",),
                    "the checkpoint's storage format; training runs in the job's precision (method: qlora quantises)"),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_window_layers", "use_sliding_window",
                     "sliding_window_pattern", "_sliding_window_pattern"),
                    "read where the family uses it (rotary families: no position table)"),
    **dict.fromkeys(("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop",
                     "hidden_dropout_prob", "dropout", "dropout_rate"), "dropout (read as the block's dropout)"),
}


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def _need(cfg: dict[str, Any], key: str, mt: str) -> Any:
    if cfg.get(key) is None:
        raise ConfigRefused(f"{mt} config lacks {key}")
    return cfg[key]


def _renamed(cfg: dict[str, Any], mt: str, names: dict[str, str]) -> dict[str, Any]:
    """``cfg`` with the keys a family's released configs spell their own way (its config class's ``attribute_map``:
    ``names`` maps each to transformers' key) under transformers' names; both spellings with differing values refused."""
    out = dict(cfg)
    for own, key in names.items():
        if own not in out:
            continue
        value = out.pop(own)
        if key in out and out[key] != value:
            raise ConfigRefused(f"{mt} config {own} ({value!r}) and {key} ({out[key]!r}) name one setting and differ")
        out[key] = value
    return out


def _refuse_unknown(cfg: dict[str, Any], mt: str, consumed: set[str]) -> None:
    unknown = sorted(k for k in cfg if k not in consumed and k not in INERT_KEYS and not k.startswith("_"))
    if unknown:
        raise ConfigRefused(
            f"{mt} config key {unknown[0]!r} is not modelled (it may change parameters, FLOPs or memory); trainplan "
            "ignores only keys known to change none of them (hfconfig.INERT_KEYS)"
        )


def _sliding(cfg: dict[str, Any], mt: str, layers: int, default_types: Callable[[int], list[str]] | None) -> dict[str, Any]:
    """sliding_window and how many layers use it, from ``layer_types`` or the family's default pattern."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is None:
        types = default_types(layers) if default_types else (["sliding_attention"] * layers if window else [])
    if types and len(types) != layers:
        raise ConfigRefused(f"{mt} config: layer_types has {len(types)} entries for {layers} layers")
    bad = [t for t in types if t not in ("sliding_attention", "full_attention")]
    if bad:
        raise ConfigRefused(f"{mt} config: layer_types entry {bad[0]!r} is not modelled; allowed: sliding_attention, full_attention")
    n = sum(t == "sliding_attention" for t in types)
    if n and not window:
        return {}  # sliding layers without a window attend to everything
    return {"sliding_window": window, "sliding_layers": n} if n else {}


def _common(cfg: dict[str, Any], mt: str) -> dict[str, Any]:
    hidden = _need(cfg, "hidden_size", mt)
    heads = _need(cfg, "num_attention_heads", mt)
    out: dict[str, Any] = {
        "layers": _need(cfg, "num_hidden_layers", mt),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": _first(cfg, "num_key_value_heads", default=heads),
        "vocab": _need(cfg, "vocab_size", mt),
        "max_seq_len": cfg.get("max_position_embeddings"),
        "name": _first(cfg, "_name_or_path", default=mt) or mt,
        "dropout": float(cfg.get("attention_dropout") or 0.0),
        "mlp": "swiglu",
        "position": "rope",
        "norm": "rmsnorm",
        "bias": False,
        "hf_model_type": mt,
    }
    if cfg.get("head_dim") is not None and cfg["head_dim"] * heads != hidden:
        out["head_dim"] = cfg["head_dim"]
    return out


COMMON_KEYS = {"hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size",
               "max_position_embeddings", "head_dim", "intermediate_size", "tie_word_embeddings", "attention_dropout"}


def _no(cfg: dict[str, Any], mt: str, key: str, allowed: Any = (None, False, 0)) -> None:
    if cfg.get(key) not in allowed:
        raise ConfigRefused(f"{mt} config {key}: {cfg[key]!r} is not modelled; allowed: {', '.join(map(str, allowed))}")


def _tied(cfg: dict[str, Any], default: bool) -> bool:
    return bool(cfg.get("tie_word_embeddings", default))


def _head_dim_or(cfg: dict[str, Any], mt: str, default: int | None, attention: str) -> dict[str, Any]:
    """``cfg`` with ``head_dim`` at its config class's ``default`` when left out (None: hidden ÷ heads). A null or zero
    head_dim is refused: ``attention`` reads ``config.head_dim`` as is and transformers cannot build it."""
    if "head_dim" in cfg and not cfg["head_dim"]:
        raise ConfigRefused(f"{mt} config head_dim: null is not built by transformers' {attention}; give the head width")
    return cfg if default is None else {"head_dim": default, **cfg}


def _agreeing_biases(cfg: dict[str, Any], mt: str, default: bool) -> bool:
    """Whether every projection has a bias, where ``attention_bias`` (q, k, v, o) and ``mlp_bias`` (the MLP), each
    ``default`` when left out, must agree: trainplan models biases on every projection or on none."""
    attention, mlp = bool(cfg.get("attention_bias", default)), bool(cfg.get("mlp_bias", default))
    if attention != mlp:
        raise ConfigRefused(f"{mt} config attention_bias ({attention}) and mlp_bias ({mlp}) differ; trainplan models "
                            "biases on every projection or on none")  # fmt: skip
    return attention


def _one_dropout(cfg: dict[str, Any], mt: str, *keys: str) -> float:
    """The one dropout probability trainplan models, read from the config's ``keys`` (0 when left out or null); a
    config whose keys differ is refused."""
    drops = {k: float(cfg.get(k) or 0.0) for k in keys}
    if len(set(drops.values())) > 1:
        listed = ", ".join(f"{k} {v:g}" for k, v in drops.items())
        raise ConfigRefused(f"{mt} config dropouts differ ({listed}); trainplan models one dropout probability for all of them")
    return drops[keys[0]]


def _integers(cfg: dict[str, Any], mt: str, *keys: str, minimum: int | None = None) -> None:
    """Refuse any of ``keys`` whose value is not an integer (a bool or a null included) of at least ``minimum``."""
    allowed = {None: "an integer", 0: "a non-negative integer", 1: "a positive integer"}[minimum]
    for key in keys:
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or (minimum is not None and value < minimum):
            raise ConfigRefused(f"{mt} config {key}: {allowed} is modelled (got {value!r})")


def _dense_by_type(cfg: dict[str, Any], mt: str, layers: int, default: list[str]) -> tuple[int, ...]:
    """The dense layers of ``mlp_layer_types`` (one of dense, sparse per layer; ``default`` when left out), at least one
    layer sparse."""
    types = cfg.get("mlp_layer_types") or default
    if len(types) != layers or any(t not in ("dense", "sparse") for t in types):
        raise ConfigRefused(f"{mt} config mlp_layer_types: one of dense, sparse per layer ({layers}) is modelled")
    if "sparse" not in types:
        raise ConfigRefused(f"{mt} config mlp_layer_types: every layer dense; give at least one sparse layer")
    return tuple(i for i, t in enumerate(types) if t == "dense")


# ----------------------------------------------------------------------------- dense families


def _llama_like(cfg: dict[str, Any], mt: str, *, tied_default: bool = False) -> dict[str, Any]:
    out = _common(cfg, mt)
    out["ffn_hidden"] = _need(cfg, "intermediate_size", mt)
    out["tied_embeddings"] = _tied(cfg, tied_default)
    if cfg.get("attention_bias"):
        out["attention_bias"] = "qkvo"
    _no(cfg, mt, "mlp_bias")
    return out


def _read_llama(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Llama 1-3.3 (``LlamaForCausalLM``): attention_bias puts biases on q, k, v and o."""
    return _llama_like(cfg, mt), COMMON_KEYS | {"attention_bias", "mlp_bias"}


def _read_llama_subclass(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """InternLM3 (``internlm3``) and IQuest-Coder (``iquestcoder``): ``LlamaConfig`` subclasses that transformers builds
    as ``LlamaForCausalLM``, with ``head_dim`` 128 when left out (their config classes' default). InternLM3 names its
    biases ``qkv_bias`` (q, k, v and o: ``attention_bias``) and ``bias`` (the MLP: ``mlp_bias``), which must agree
    (``InternLM3Config.validate_architecture``); both on is a bias on every projection."""
    cfg = _head_dim_or(cfg, mt, 128, "LlamaAttention")
    if mt != "internlm3":
        return _llama_like(cfg, mt), COMMON_KEYS | {"attention_bias", "mlp_bias"}
    attention = bool(_first(cfg, "attention_bias", "qkv_bias", default=False))
    mlp = bool(_first(cfg, "mlp_bias", "bias", default=False))
    if attention != mlp:
        raise ConfigRefused(f"{mt} config qkv_bias ({attention}) and bias ({mlp}) differ, which transformers does not build")
    out = _llama_like({k: v for k, v in cfg.items() if k not in ("attention_bias", "mlp_bias")}, mt)
    out["bias"] = attention
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "qkv_bias", "bias"}


def _read_exaone(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """EXAONE 3.0 / 3.5 (``exaone``): ``ExaoneConfig`` subclasses ``LlamaConfig`` and transformers builds
    ``LlamaForCausalLM`` from it; the released configs spell three keys their own way (``num_layers``,
    ``layer_norm_epsilon``, ``activation_function``: its ``attribute_map``) and carry ``embed_dropout``, which the
    Llama modeling does not apply (read at 0, refused otherwise: the checkpoint's remote code applies it). Keys left
    out take ``ExaoneConfig``'s defaults (8 KV heads, vocabulary 102,400, MLP 14,336; transformers 5.25
    ``modular_exaone.py``)."""
    cfg = _renamed(cfg, mt, {"num_layers": "num_hidden_layers", "layer_norm_epsilon": "rms_norm_eps",
                             "activation_function": "hidden_act"})  # fmt: skip
    cfg = {"num_key_value_heads": 8, "vocab_size": 102400, "intermediate_size": 14336, **cfg}
    if cfg.get("embed_dropout"):
        raise ConfigRefused(f"{mt} config embed_dropout: {cfg['embed_dropout']!r} is not applied by transformers' Llama "
                            "modeling (EXAONE's remote code applies it); allowed: 0")  # fmt: skip
    return _llama_like(cfg, mt), COMMON_KEYS | {"attention_bias", "mlp_bias", "embed_dropout", "num_layers",
                                                "layer_norm_epsilon", "activation_function"}  # fmt: skip


def _read_cwm(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Meta CWM (``CwmForCausalLM``, Code World Model 32B): Llama's layers without any bias (``CwmAttention`` builds q,
    k, v and o without one: ``attention_bias`` refused) and a ``sliding_window`` on the layers ``layer_types`` names —
    by default three of every four, the first of each four global (``CwmConfig.__post_init__``). Keys left out take
    ``CwmConfig``'s defaults: head_dim 128, 8 KV heads, an 8,192-token window (transformers 5.25 ``modular_cwm.py``)."""
    cfg = {"head_dim": 128, "num_key_value_heads": 8, "sliding_window": 8192, **cfg}
    _no(cfg, mt, "attention_bias")
    out = _llama_like(cfg, mt)
    out.update(_sliding(cfg, mt, out["layers"],
                        lambda n: ["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(n)]))
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "sliding_window", "layer_types"}


def _read_granite(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """IBM Granite 3.x and PowerLM (``GraniteForCausalLM``): Llama's layers and four scalars — the embedding, the
    attention scores, each block's residual branch and the logits multiplied or divided by a constant
    (``modeling_granite.py``); a product or quotient by a Python scalar keeps nothing for backward, and the divided
    logits replace the projection's (the one it divides is dropped), so parameters, FLOPs and memory are Llama's."""
    return _llama_like(cfg, mt), COMMON_KEYS | {"attention_bias", "mlp_bias", "residual_multiplier", "logits_scaling"}


def _read_hyperclovax(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """HyperCLOVA X SEED (``HyperCLOVAXForCausalLM``): Granite's layers and scalars (the logits multiplied by
    ``logits_scaling`` instead of divided: a product by a Python scalar keeps nothing either) with, when
    ``use_post_norm`` (the default), a Llama RMSNorm after attention and one after the MLP inside each residual branch
    (Peri-LN) — four norms a block, as GLM-4-0414's (transformers 5.25 ``modular_hyperclovax.py``); head_dim
    hidden ÷ heads when left out."""
    out, keys = _read_granite(cfg, mt)
    if cfg.get("use_post_norm", True):
        out["block_norms"] = 4
    return out, keys | {"use_post_norm"}


def _read_mistral(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Mistral 7B / Nemo / Small (``MistralForCausalLM``): Llama's layers, an optional sliding window on every layer."""
    out = _llama_like(cfg, mt)
    out.update(_sliding(cfg, mt, out["layers"], None))
    return out, COMMON_KEYS | {"sliding_window", "layer_types"}


def _read_ministral(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Ministral 8B (``MinistralForCausalLM``) and Ministral 3 (``Ministral3ForCausalLM``, the language model of
    ``Mistral3ForConditionalGeneration``): Llama's layers with no bias anywhere (transformers 5.25
    ``modeling_ministral.py`` / ``modeling_ministral3.py``). Ministral's window applies to the ``layer_types`` it names;
    Ministral 3's ``sliding_window``, when set, to every layer (it has no ``layer_types``), and it multiplies the
    rotated queries by a scale that depends on the position alone (``rope_parameters``' ``llama_4_scaling_beta``):
    a product with a tensor of one value per position keeps only that tensor for backward (one value per position
    and layer, whatever the batch: left out), so the layer saves what Llama's saves (measured,
    ``tests/test_hf_families.py``); the scale's element-wise pass over q is not priced."""
    if mt == "ministral" and not cfg.get("head_dim"):
        # MinistralConfig's head_dim defaults to None, which MinistralAttention takes as is (None ** -0.5)
        raise ConfigRefused(f"{mt} config lacks head_dim (transformers' MinistralAttention cannot build without it)")
    out = _common(cfg, mt)
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False))
    if mt == "ministral3":
        # Ministral3Config's head_dim defaults to 128 (not hidden // heads) when the key is left out
        head_dim = cfg.get("head_dim", 128) or out["hidden"] // out["heads"]
        out.pop("head_dim", None)
        if head_dim * out["heads"] != out["hidden"]:
            out["head_dim"] = head_dim
        out.update(_sliding({k: v for k, v in cfg.items() if k != "layer_types"}, mt, out["layers"], None))
        return out, COMMON_KEYS | {"sliding_window"}
    out.update(_sliding(cfg, mt, out["layers"], None))
    return out, COMMON_KEYS | {"sliding_window", "layer_types"}


def _read_seed_oss(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Seed-OSS (``SeedOssForCausalLM``): Llama's layers with biases on q, k and v (``attention_bias``) and on o
    (``attention_out_bias``), and dropout both in attention and after each sublayer (``residual_dropout``,
    transformers 5.25 ``modeling_seed_oss.py``), which trainplan models as one probability: the two must agree.  A key
    left out takes ``SeedOssConfig``'s default: head_dim 128 (``SeedOssAttention`` reads ``config.head_dim`` as is),
    dropout 0.1 in both places."""
    cfg = {"attention_dropout": 0.1, "residual_dropout": 0.1, **_head_dim_or(cfg, mt, 128, "SeedOssAttention")}
    out = _llama_like({k: v for k, v in cfg.items() if k != "attention_bias"}, mt)
    bias_qkv, bias_o = bool(cfg.get("attention_bias", True)), bool(cfg.get("attention_out_bias", False))
    if bias_o and not bias_qkv:
        raise ConfigRefused(f"{mt} config attention_out_bias: true without attention_bias is not modelled")
    out["attention_bias"] = ("qkvo" if bias_o else "qkv") if bias_qkv else None
    out["dropout"] = _one_dropout(cfg, mt, "attention_dropout", "residual_dropout")
    return out, COMMON_KEYS | {"attention_bias", "attention_out_bias", "mlp_bias", "residual_dropout"}


def _read_smollm3(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """SmolLM3 (``SmolLM3ForCausalLM``): Llama's layers, the head tied by default, no rotary embedding on every
    ``no_rope_layer_interval``-th layer (``no_rope_layers``: 1 = rotary, 0 = NoPE) and, with ``use_sliding_window``, a
    window on the NoPE layers (``SmolLM3Config.__post_init__``, transformers 5.25)."""
    out = _llama_like(cfg, mt, tied_default=True)
    n = out["layers"]
    interval = int(cfg.get("no_rope_layer_interval") or 4)
    rope = cfg.get("no_rope_layers")
    if rope is None:
        rope = [int((i + 1) % interval != 0) for i in range(n)]
    if len(rope) != n or any(r not in (0, 1) for r in rope):
        raise ConfigRefused(f"{mt} config no_rope_layers: one 0 or 1 per layer ({n}) is modelled")
    if n - sum(rope):
        out["nope_layers"] = n - sum(rope)
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    out.update(_sliding(dict(cfg, sliding_window=window), mt, n,
                        lambda _: ["sliding_attention" if window and not r else "full_attention" for r in rope]))
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "sliding_window", "use_sliding_window", "layer_types",
                               "no_rope_layers", "no_rope_layer_interval"}  # fmt: skip


def _read_qwen2(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Qwen2 / Qwen2.5 (``Qwen2Attention``: q, k, v with biases, o without); sliding layers from max_window_layers."""
    out = _common(cfg, mt)
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False), attention_bias="qkv")
    win = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    first = cfg.get("max_window_layers") or 0
    sliding = dict(cfg, sliding_window=win)
    out.update(_sliding(sliding, mt, out["layers"],
                        lambda n: ["sliding_attention" if win and i >= first else "full_attention" for i in range(n)]))
    return out, COMMON_KEYS | {"sliding_window", "layer_types", "use_sliding_window", "max_window_layers"}


def _read_qwen3(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Qwen3 (``Qwen3Attention``): a per-head RMSNorm on q and k; attention_bias on q, k, v and o."""
    out, keys = _read_qwen2(cfg, mt)
    out["attention_bias"] = "qkvo" if cfg.get("attention_bias") else None
    out["qk_norm"] = "head"
    return out, keys | {"attention_bias"}


def _read_olmo2(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """OLMo 2 and OLMo 3 (``Olmo2ForCausalLM``, ``Olmo3ForCausalLM``): Llama's weights with q and k RMSNorms over
    their full width, ``attention_bias`` on q, k, v and o, and the block's two norms after attention and the MLP
    instead of before them (OLMo 2 report, arXiv 2501.00656, Sec. 3.1); the norms multiply their weight in fp32.
    Placed after a sublayer, a norm keeps what it keeps before one, and the projections keep the block's input in
    place of the norm's output: the same bytes as Llama's order (measured with saved-tensor hooks against a Llama
    of one shape, ``tests/estimate/test_norm_saves.py``). OLMo 3 attends within ``sliding_window`` on the layers
    ``layer_types`` names — by default three of every four (``Olmo3Config``, transformers 5.25)."""
    out = _llama_like(cfg, mt)
    out["qk_norm"] = "full"
    out["post_norms"] = True
    out["norm_fp32_weight"] = True  # Olmo2RMSNorm: (self.weight * hidden_states).to(input_dtype)
    keys = COMMON_KEYS | {"attention_bias"}
    if mt == "olmo3":  # a sliding_window left out is Olmo3Config's 4096
        out.update(_sliding({"sliding_window": 4096, **cfg}, mt, out["layers"],
                            lambda n: ["sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n)]))
        keys |= {"sliding_window", "layer_types"}
    return out, keys


def _read_exaone4(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """EXAONE 4.0 (``Exaone4ForCausalLM``): Llama's weights with per-head q/k RMSNorms, the block's two norms after
    attention and the MLP (as OLMo 2; Llama's norm class, so Llama's bytes: measured, ``tests/estimate/test_norm_saves.py``),
    and, with a ``sliding_window``, local attention on the layers ``layer_types`` names (by default all but every
    ``sliding_window_pattern``-th) while the global layers apply no rotary embedding (NoPE: "We use global NoPE for
    hybrid attention model", transformers 5.25 ``modeling_exaone4.py``)."""
    out = _llama_like(cfg, mt)
    out["qk_norm"] = "head"
    out["post_norms"] = True
    n = out["layers"]
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    if types is None:  # Exaone4Config.__post_init__: every pattern-th layer global, counting from 1
        pattern = cfg.get("sliding_window_pattern", 4)
        if not window or not isinstance(pattern, int) or pattern < 1:
            raise ConfigRefused(f"{mt} config: without layer_types, sliding_window and an integer sliding_window_pattern "
                                "are needed (Exaone4Config derives the layer types from them)")  # fmt: skip
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    out.update(_sliding(dict(cfg, layer_types=types), mt, n, None))
    if window:
        global_layers = sum(t == "full_attention" for t in types)
        if global_layers:
            out["nope_layers"] = global_layers
    return out, COMMON_KEYS | {"sliding_window", "sliding_window_pattern", "layer_types"}


def _read_exaone_moe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """K-EXAONE (``ExaoneMoeForCausalLM``, K-EXAONE-236B-A23B): EXAONE 4's attention (per-head q/k RMSNorms; local
    attention on the layers ``layer_types`` names — by default all but every ``sliding_window_pattern``-th — and the
    global ones without rotary) in OLMoE's block (the two norms before attention and the MLP), and DeepSeek-V3's MoE —
    routed experts of ``moe_intermediate_size`` and ``num_shared_experts`` of them shared, behind a sigmoid router
    taking the layer input in fp32 — on the layers ``mlp_layer_types`` marks ``sparse`` (by default all but the first
    ``first_k_dense_replace``), a dense MLP of ``intermediate_size`` elsewhere. The router's weight is kept in fp32
    (``_keep_in_fp32_modules_strict``): 2 bytes a router weight more than trainplan counts (h × experts a layer). Its
    checkpoint's MTP layer is not built (keys naming it refused as unknown). Keys left out take ``ExaoneMoeConfig``'s
    defaults (transformers 5.25 ``modular_exaone_moe.py``)."""
    cfg = {"num_key_value_heads": 32, "sliding_window": 4096, "sliding_window_pattern": 4, "first_k_dense_replace": 1,
           "moe_intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1, **cfg}  # fmt: skip
    _integers(cfg, mt, "first_k_dense_replace", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
              "num_shared_experts", minimum=0)  # fmt: skip
    out, keys = _read_exaone4({k: v for k, v in cfg.items() if k != "mlp_layer_types"}, mt)
    out["post_norms"] = False  # OlmoeDecoderLayer: pre-norm
    n, first, fe = out["layers"], cfg["first_k_dense_replace"], cfg["moe_intermediate_size"]
    out["moe"] = MoE(experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"], expert_ffn_hidden=fe,
                     shared_ffn_hidden=cfg["num_shared_experts"] * fe, router_fp32=True,
                     dense_layers=_dense_by_type(cfg, mt, n, ["dense" if i < first else "sparse" for i in range(n)]))  # fmt: skip
    return out, keys | {"first_k_dense_replace", "moe_intermediate_size", "num_experts", "num_experts_per_tok",
                        "num_shared_experts", "mlp_layer_types"}  # fmt: skip


def _read_gemma(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Gemma (``GemmaForCausalLM``): gated GELU MLP, head tied to the embedding, embedding scaled by √h, norms that
    multiply ``1 + weight`` in fp32 (``GemmaRMSNorm``)."""
    out = _llama_like(cfg, mt, tied_default=True)
    out["norm_fp32_weight"] = True
    _no(cfg, mt, "use_bidirectional_attention")
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "use_bidirectional_attention"}


def _alternate(n: int) -> list[str]:
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]


def _read_gemma2(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Gemma 2: four norms per block (pre and post around attention and MLP), alternating sliding layers,
    final-logit and attention-logit soft-capping (Gemma 2 report, arXiv 2408.00118, Sec. 2; transformers'
    ``Gemma2Config`` defaults: 30.0 and 50.0)."""
    out = _llama_like(cfg, mt, tied_default=True)
    out["block_norms"] = 4
    out["norm_fp32_weight"] = True  # Gemma2RMSNorm: output * (1.0 + self.weight.float())
    out.update(_sliding(cfg, mt, out["layers"], _alternate))
    if cfg.get("final_logit_softcapping", 30.0):
        out["final_logit_softcap"] = float(cfg.get("final_logit_softcapping", 30.0))
    if cfg.get("attn_logit_softcapping", 50.0):
        out["attention_softcap"] = float(cfg.get("attn_logit_softcapping", 50.0))
    _no(cfg, mt, "use_bidirectional_attention")
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "sliding_window", "layer_types", "final_logit_softcapping",
                               "use_bidirectional_attention"}


def _read_vaultgemma(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """VaultGemma (``VaultGemmaForCausalLM``): Gemma 2's layers without the two post-norms (``VaultGemmaDecoderLayer``
    deletes them: two norms a block), its attention soft-capped, alternating sliding layers and the final logits
    soft-capped (transformers 5.25 ``modular_vaultgemma.py``)."""
    out, keys = _read_gemma2(cfg, mt)
    out["block_norms"] = 2
    return out, keys


def _read_gemma3_text(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Gemma 3 text (``Gemma3ForCausalLM``): Gemma 2's block with per-head q/k RMSNorm instead of attention
    soft-capping, five local layers per global one (Gemma 3 report, arXiv 2503.19786, Sec. 2)."""
    out = _llama_like(cfg, mt, tied_default=True)
    out["block_norms"] = 4
    out["qk_norm"] = "head"
    out["norm_fp32_weight"] = True  # Gemma3RMSNorm, on the block and on q and k
    pattern = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
    out.update(_sliding(cfg, mt, out["layers"],
                        lambda n: ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]))
    if cfg.get("final_logit_softcapping"):
        out["final_logit_softcap"] = float(cfg["final_logit_softcapping"])
    _no(cfg, mt, "use_bidirectional_attention")
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "sliding_window", "layer_types", "final_logit_softcapping",
                               "use_bidirectional_attention", "sliding_window_pattern"}  # fmt: skip


def _read_glm(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """GLM-4 (``GlmForCausalLM``, GLM-4-9B) and GLM-4-0414 / GLM-Z1 (``Glm4ForCausalLM``): Llama's weights with biases
    on q, k and v (``attention_bias``, o without), the gate and up projections fused into one matrix (the same
    weights) and a rotary embedding on half of each head (``partial_rotary_factor``: no parameters). ``glm4`` adds a
    norm after attention and one after the MLP, each inside its residual branch — four Llama-style RMSNorms a block,
    as Gemma 2's four (transformers 5.25 ``modeling_glm.py`` / ``modeling_glm4.py``). Keys left out take
    ``GlmConfig`` / ``Glm4Config``'s defaults: q/k/v biases on and head_dim 128 (the attention reads
    ``config.head_dim`` as is)."""
    cfg = {"attention_bias": True, **_head_dim_or(cfg, mt, 128, f"{mt.capitalize()}Attention")}
    out = _llama_like({k: v for k, v in cfg.items() if k != "attention_bias"}, mt)
    out["attention_bias"] = "qkv" if cfg["attention_bias"] else None
    if mt == "glm4":
        out["block_norms"] = 4
    return out, COMMON_KEYS | {"attention_bias"}


def _read_hunyuan_dense(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Hunyuan dense (``HunYuanDenseV1ForCausalLM``, Hunyuan-0.5B … 7B): Llama's layers, ``attention_bias`` on q, k, v
    and o, and a per-head RMSNorm on the rotated q and k (``query_layernorm`` / ``key_layernorm``, transformers 5.25
    ``modeling_hunyuan_v1_dense.py``). ``HunYuanDenseV1Attention`` reads ``config.head_dim`` as is, so a config
    without it (its config class defaults to None) does not build and is refused."""
    if not cfg.get("head_dim"):
        raise ConfigRefused(f"{mt} config lacks head_dim (transformers' HunYuanDenseV1Attention cannot build without it)")
    out = _llama_like(cfg, mt)
    out["qk_norm"] = "head"
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias"}


def _read_ernie4_5(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """ERNIE 4.5 dense (``Ernie4_5ForCausalLM``, ERNIE-4.5-0.3B): Llama's layers, the head tied by default, its rotary
    applied in fp32 to interleaved pairs (transient: it keeps only the tables), and ``use_bias`` putting a bias on
    every projection of attention and the MLP — refused when on: trainplan models no gated MLP with biases
    (transformers 5.25 ``modeling_ernie4_5.py``; keys left out take ``Ernie4_5Config``'s defaults: head_dim 128, no
    bias)."""
    _no(cfg, mt, "use_bias")
    cfg = _head_dim_or(cfg, mt, 128, "Ernie4_5Attention")
    return _llama_like(cfg, mt, tied_default=True), COMMON_KEYS | {"use_bias"}


def _read_starcoder2(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """StarCoder2 (``Starcoder2ForCausalLM``): grouped-query attention with rotary embeddings, LayerNorms with biases,
    a GELU MLP of two matrices (``c_fc``, ``c_proj``), ``use_bias`` on every projection, the head tied by default, a
    sliding window on every layer when set, and dropout on the attention probabilities (``attention_dropout``), after
    each sublayer (``residual_dropout``) and after the embedding (``embedding_dropout``), read as one probability: the
    three must agree (transformers 5.25 ``modeling_starcoder2.py``; StarCoder2 report, arXiv 2402.19173)."""
    cfg = {"use_bias": True, "hidden_act": "gelu_pytorch_tanh", **cfg}
    out = _common(cfg, mt)
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, True), mlp="gelu",
               norm="layernorm", bias=bool(cfg["use_bias"]), gelu_python=cfg["hidden_act"] in PYTHON_GELUS)  # fmt: skip
    if not cfg["use_bias"]:
        raise ConfigRefused(f"{mt} config use_bias: false is not modelled (trainplan's LayerNorm-GELU block carries biases)")
    out["dropout"] = _one_dropout(cfg, mt, "residual_dropout", "attention_dropout", "embedding_dropout")
    out.update(_sliding(cfg, mt, out["layers"], None))
    # keys the released configs carry over from their GPTBigCode conversion, which Starcoder2's modeling code does not
    # read: read where they describe the model it builds (a LayerNorm block, the default MLP), refused otherwise
    _no(cfg, mt, "norm_type", (None, "layer_norm"))
    _no(cfg, mt, "mlp_type", (None, "default"))
    unread = {"norm_type", "mlp_type", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "scale_attn_weights"}
    return out, COMMON_KEYS | unread | {"use_bias", "residual_dropout", "embedding_dropout", "sliding_window"}


def _read_gpt_neox(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """GPT-NeoX / Pythia (``GPTNeoXForCausalLM``): multi-head attention with a fused q/k/v projection (the same weights
    as three), rotary on ``partial_rotary_factor`` of each head (Pythia: 0.25), LayerNorms, a two-matrix GELU MLP,
    biases on every projection, an untied head, and attention and MLP reading the block input side by side when
    ``use_parallel_residual`` (the same weights and saves as in sequence: each sublayer keeps its own norm's output);
    dropout on the attention probabilities (``attention_dropout``) and after the embedding and each sublayer
    (``hidden_dropout``), read as one probability: the two must agree (transformers 5.25 ``modeling_gpt_neox.py``;
    Black et al. 2022, arXiv 2204.06745; Biderman et al. 2023, arXiv 2304.01373)."""
    cfg = {"attention_bias": True, "hidden_act": "gelu", **cfg}
    if not cfg["attention_bias"]:
        raise ConfigRefused(f"{mt} config attention_bias: false is not modelled (its MLP keeps biases; trainplan's "
                            "LayerNorm-GELU block has them everywhere or nowhere)")  # fmt: skip
    out = _common(cfg, mt)
    out.pop("head_dim", None)
    if cfg.get("num_key_value_heads") not in (None, out["heads"]):
        raise ConfigRefused(f"{mt} config num_key_value_heads: GPT-NeoX attends with every head (multi-head)")
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False), mlp="gelu",
               norm="layernorm", bias=True, gelu_python=cfg["hidden_act"] in PYTHON_GELUS)  # fmt: skip
    out["dropout"] = _one_dropout(cfg, mt, "hidden_dropout", "attention_dropout")
    return out, COMMON_KEYS | {"attention_bias", "hidden_dropout", "use_parallel_residual", "classifier_dropout",
                               "is_decoder", "rotary_pct", "rotary_emb_base"}  # fmt: skip


def _read_stablelm(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """StableLM (``StableLmForCausalLM``: StableLM-3B-4E1T, StableLM 2): grouped-query attention with rotary on
    ``partial_rotary_factor`` of each head (a quarter by default), ``use_qkv_bias`` on q, k and v (o never), a gated
    SiLU MLP without biases and ``nn.LayerNorm``s with their biases; with ``use_parallel_residual`` one norm a block whose
    output attention and the MLP read side by side (``block_norms`` 1); with ``qk_layernorm`` (StableLM 2 12B) a
    bias-free LayerNorm per head of q and k, each head its own (``qk_norm`` each_head). Its dropouts, which fall after the
    MLP only, are refused (transformers 5.25 ``modeling_stablelm.py``)."""
    for key in ("hidden_dropout", "attention_dropout"):
        _no(cfg, mt, key, (None, 0, 0.0))
    out = _common(cfg, mt)
    if out.get("head_dim"):
        raise ConfigRefused(f"{mt} config head_dim: StableLmAttention's heads are hidden_size / num_attention_heads wide")
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False), norm="layernorm",
               norm_bias=True, attention_bias="qkv" if cfg.get("use_qkv_bias") else None,
               block_norms=1 if cfg.get("use_parallel_residual") else 2)  # fmt: skip
    if cfg.get("qk_layernorm"):
        out["qk_norm"] = "each_head"
    return out, COMMON_KEYS | {"use_qkv_bias", "qk_layernorm", "use_parallel_residual", "hidden_dropout"}


def _read_arcee(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Arcee AFM (``ArceeForCausalLM``, AFM-4.5B): Llama's attention with a two-matrix MLP (``up_proj``, ``down_proj``,
    no gate) under ``hidden_act`` — ReLU² by default (transformers 5.25 ``modeling_arcee.py``); ``mlp_bias`` refused.
    ``head_dim`` is read as the config gives it (``ArceeConfig`` defaults it to 80 for its default shape)."""
    out = _llama_like(cfg, mt)
    out["mlp"] = "gelu"  # the two-matrix MLP of trainplan's model, whatever its element-wise activation
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias"}


def _read_nemotron(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Nemotron-4 and Minitron (``NemotronForCausalLM``): grouped-query attention with rotary on
    ``partial_rotary_factor`` of each head (0.5 by default), LayerNorms with biases that scale by ``1 + weight``
    (``NemotronLayerNorm1P``: a LayerNorm's parameters and saves), and a two-matrix MLP (``up_proj``, ``down_proj``)
    under ReLU²; ``attention_bias`` puts biases on q, k, v and o, ``mlp_bias`` on the MLP — both together, or neither
    (transformers 5.25 ``modeling_nemotron.py``; Nemotron-4 15B report, arXiv 2402.16819, Sec. 2)."""
    attention = _agreeing_biases(cfg, mt, default=False)
    if cfg.get("num_key_value_heads") is None:  # NemotronConfig leaves it None, which NemotronAttention divides by
        raise ConfigRefused(f"{mt} config lacks num_key_value_heads (transformers' NemotronAttention cannot build without it)")
    cfg = _head_dim_or(cfg, mt, 128, "NemotronAttention")  # NemotronConfig's default
    out = _common(cfg, mt)
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False), mlp="gelu",
               norm="layernorm", bias=attention, norm_bias=True)  # fmt: skip
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias"}


def _read_jais2(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Jais 2 (``Jais2ForCausalLM``): Llama's attention with ``attention_bias`` on q, k, v and o, a two-matrix ReLU² MLP
    (``up_proj``, ``down_proj``) with ``mlp_bias``, and ``nn.LayerNorm``s, which keep their bias whatever the
    projections do; the two bias switches (both on by default) must agree (transformers 5.25
    ``modular_jais2.py``)."""
    attention = _agreeing_biases(cfg, mt, default=True)
    out = _common(cfg, mt)
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False), mlp="gelu",
               norm="layernorm", bias=attention, norm_bias=True, gelu_python=cfg.get("hidden_act") in PYTHON_GELUS)  # fmt: skip
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias"}


def _read_helium(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Helium (``HeliumForCausalLM``, Kyutai Helium-1): Llama's layers with ``attention_bias`` on q, k and v (its output
    projection never has one), RMSNorms that multiply their weight in fp32 (``HeliumRMSNorm``, as OLMo 2's) and
    ``head_dim`` 128 when left out (transformers 5.25 ``modular_helium.py``)."""
    cfg = {"head_dim": 128, **cfg}
    out = _llama_like({k: v for k, v in cfg.items() if k != "attention_bias"}, mt)
    if out.get("head_dim", out["hidden"] // out["heads"]) * out["heads"] != out["hidden"]:
        raise ConfigRefused(f"{mt} config head_dim {cfg['head_dim']!r} x {out['heads']} heads must equal hidden_size "
                            f"{out['hidden']}: HeliumAttention's output projection takes hidden_size inputs")  # fmt: skip
    out.update(attention_bias="qkv" if cfg.get("attention_bias") else None, norm_fp32_weight=True)
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias"}


def _read_nanochat(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """nanochat (``NanoChatForCausalLM``, karpathy/nanochat-d20 / d32): Llama's attention with q and k normalised per
    head after the rotary embedding, a two-matrix MLP (``fc1``, ``fc2``, no bias) under ReLU², RMSNorms without a
    weight (``Llama4TextWeightlessRMSNorm``: no parameters; they keep what a frozen Llama norm keeps — measured,
    ``tests/estimate/test_norm_saves.py``) on the block, on q and k, on the embedding's output and before the head, an
    untied head and its logits soft-capped at ``final_logit_softcapping`` (15 when left out); ``attention_bias`` puts
    biases on q, k, v and o (transformers 5.25 ``modular_nanochat.py``)."""
    out = _llama_like(cfg, mt)
    out.update(mlp="gelu", qk_norm="head", norm_weight=False, embedding_norm=True,
               gelu_python=cfg.get("hidden_act") in PYTHON_GELUS)  # fmt: skip
    cap = cfg.get("final_logit_softcapping", 15.0)
    if cap:
        out["final_logit_softcap"] = float(cap)
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "final_logit_softcapping"}


def _read_cohere(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Cohere Command R / R+ (``CohereForCausalLM``) and Command R7B / A (``Cohere2ForCausalLM``): one LayerNorm a block,
    without a bias and written as fp32 Python arithmetic (``CohereLayerNorm``), whose output attention and the gated
    MLP read side by side, both adding to the residual; ``attention_bias`` on q, k, v and o, none on the MLP; the head
    tied by default and its logits multiplied by ``logit_scale`` (no parameters); rotary on interleaved channel pairs.
    ``cohere``'s ``use_qk_norm`` adds a LayerNorm per head of q and k, each head with its own weight (Command R+).
    ``cohere2`` rotates q and k on its sliding layers only — its full-attention layers have no position embedding —
    and builds its heads hidden ÷ heads wide whatever ``head_dim`` says (``Cohere2Config.__post_init__``); its layers
    follow ``layer_types`` or, without it, ``sliding_window_pattern`` (default 4: three sliding layers, then one full).
    transformers 5.25 ``modeling_cohere.py`` / ``modular_cohere2.py``."""
    if "logit_scale" in cfg and cfg["logit_scale"] is None:
        raise ConfigRefused(f"{mt} config logit_scale: null is not built by transformers (the head multiplies its "
                            "logits by it); give a number or leave it out")  # fmt: skip
    out = _llama_like(cfg, mt, tied_default=True)
    out.update(norm="layernorm", norm_python=True, block_norms=1)
    keys = COMMON_KEYS | {"attention_bias", "mlp_bias", "logit_scale", "use_qk_norm", "model_max_length"}
    if mt == "cohere":
        if cfg.get("use_qk_norm"):
            out["qk_norm"] = "each_head"
        return out, keys
    _no(cfg, mt, "use_qk_norm")  # Cohere2Attention builds no q/k norm
    width = out["hidden"] // out["heads"]
    if cfg.get("head_dim") not in (None, width):
        raise ConfigRefused(f"{mt} config head_dim {cfg['head_dim']!r}: Cohere2Config builds heads hidden_size / "
                            f"num_attention_heads = {width} wide; give that or leave head_dim out")  # fmt: skip
    out.pop("head_dim", None)
    pattern = cfg.get("sliding_window_pattern", 4)
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
        raise ConfigRefused(f"{mt} config sliding_window_pattern: {pattern!r} is not modelled; allowed: a positive integer")
    n = out["layers"]
    out.update(_sliding(cfg, mt, n, lambda _: ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                               for i in range(n)]))  # fmt: skip
    rotated = out.get("sliding_layers", 0)  # Cohere2Attention rotates only where it has a window
    if n - rotated:
        out["nope_layers"] = n - rotated
    # keys of Cohere's own format that its released configs carry and transformers does not read: read where they
    # describe what transformers builds, refused otherwise
    _no(cfg, mt, "order_of_interleaved_layers", (None, "local_attn_first"))
    _no(cfg, mt, "position_embedding_type", (None, "rope_gptj"))
    _no(cfg, mt, "rotary_pct", (None, 1, 1.0))
    _no(cfg, mt, "use_gated_activation", (None, True))
    _no(cfg, mt, "use_parallel_block", (None, True))
    _no(cfg, mt, "use_parallel_embedding", (None, True, False))
    _no(cfg, mt, "use_embedding_sharing", (None, out["tied_embeddings"]))
    _no(cfg, mt, "layer_switch", (None, pattern))
    unread = {"order_of_interleaved_layers", "position_embedding_type", "rotary_pct", "use_gated_activation",
              "use_parallel_block", "use_parallel_embedding", "use_embedding_sharing", "layer_switch"}
    return out, keys | unread | {"sliding_window", "layer_types", "sliding_window_pattern"}


PYTHON_GELUS = ("gelu_new", "gelu_fast")


def _read_phi3(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Phi-3 / Phi-4 (``Phi3ForCausalLM``): fused qkv and gate_up projections (the same weights as separate ones)."""
    out = _common(cfg, mt)
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False))
    out.update(_sliding(cfg, mt, out["layers"], None))
    out["dropout"] = float(_first(cfg, "resid_pdrop", "attention_dropout", default=0.0) or 0.0)
    return out, COMMON_KEYS | {"sliding_window", "layer_types", "resid_pdrop", "embd_pdrop"}


# ----------------------------------------------------------------------------- mixture-of-experts families


def _read_mixtral(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Mixtral (``MixtralSparseMoeBlock``): every layer routes over num_local_experts gated experts of
    intermediate_size; no shared expert, no bias (Jiang et al. 2024, arXiv 2401.04088)."""
    out = _common(cfg, mt)
    f = _need(cfg, "intermediate_size", mt)
    out.update(ffn_hidden=f, tied_embeddings=_tied(cfg, False),
               moe=MoE(experts=_need(cfg, "num_local_experts", mt), top_k=_need(cfg, "num_experts_per_tok", mt),
                       expert_ffn_hidden=f))  # fmt: skip
    out.update(_sliding(cfg, mt, out["layers"], None))
    return out, COMMON_KEYS | {"num_local_experts", "num_experts_per_tok", "sliding_window", "layer_types"}


def _experts(cfg: dict[str, Any], mt: str) -> int:
    """num_experts (the Hub's configs), or num_local_experts (what transformers 5 writes: its attribute_map)."""
    n = _first(cfg, "num_experts", "num_local_experts")
    if n is None:
        raise ConfigRefused(f"{mt} config lacks num_experts")
    return n


def _qwen_moe_dense(cfg: dict[str, Any], layers: int) -> tuple[int, ...]:
    """Qwen2-MoE / Qwen3-MoE decoder layer: a sparse block unless listed in mlp_only_layers or off the
    decoder_sparse_step grid (``(i + 1) % step``)."""
    step = int(cfg.get("decoder_sparse_step") or 1)
    only = set(cfg.get("mlp_only_layers") or ())
    return tuple(i for i in range(layers) if i in only or (i + 1) % step)


def _read_qwen2_moe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Qwen1.5-MoE / Qwen2-MoE: routed experts plus one shared expert scaled by a sigmoid gate; q, k, v biases
    unless qkv_bias is false (transformers 5 ``Qwen2MoeAttention``)."""
    out, keys = _read_qwen2(cfg, mt)
    out["attention_bias"] = "qkv" if cfg.get("qkv_bias", True) else None
    out["moe"] = MoE(experts=_experts(cfg, mt), top_k=_need(cfg, "num_experts_per_tok", mt),
                     expert_ffn_hidden=_need(cfg, "moe_intermediate_size", mt),
                     shared_ffn_hidden=int(cfg.get("shared_expert_intermediate_size") or 0),
                     shared_gate=True,  # Qwen2MoeSparseMoeBlock builds shared_expert_gate whatever the size
                     dense_layers=_qwen_moe_dense(cfg, out["layers"]))  # fmt: skip
    return out, keys | {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "qkv_bias"}  # fmt: skip


def _read_qwen3_moe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Qwen3-MoE: Qwen3 attention (q/k norms), routed experts only (Qwen3 report, arXiv 2505.09388, Sec. 2)."""
    out, keys = _read_qwen3(cfg, mt)
    out["moe"] = MoE(experts=_experts(cfg, mt), top_k=_need(cfg, "num_experts_per_tok", mt),
                     expert_ffn_hidden=_need(cfg, "moe_intermediate_size", mt),
                     dense_layers=_qwen_moe_dense(cfg, out["layers"]))  # fmt: skip
    return out, keys | {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
                        "mlp_only_layers"}  # fmt: skip


def _read_mellum(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """JetBrains Mellum 2 (``MellumForCausalLM``): Qwen3-MoE's attention (per-head q/k RMSNorms, ``attention_bias`` on
    q, k, v and o) with a ``sliding_window`` on the layers ``layer_types`` names (none by default), Qwen3-MoE's routed
    experts on the layers ``mlp_layer_types`` marks ``sparse`` (every layer by default) and a gated MLP of
    ``intermediate_size`` on the ``dense`` ones. Its MTP layer (``num_mtp_layers``), which transformers does not build
    (``_keys_to_ignore_on_load_unexpected``) and whose layout is not modelled, is refused: 0 plans the model
    transformers trains. Keys left out take ``MellumConfig``'s defaults: head_dim 128, 4 KV heads, 64 experts
    (transformers 5.25 ``modular_mellum.py``)."""
    cfg = _renamed(cfg, mt, {"num_experts": "num_local_experts", "num_mtp_layers": "num_nextn_predict_layers"})
    cfg = {"head_dim": 128, "num_key_value_heads": 4, "num_local_experts": 64, "sliding_window": 1024, **cfg}
    for key in ("num_nextn_predict_layers", "mtp_layer_types", "mtp_mlp_layer_types"):
        if cfg.get(key):
            raise ConfigRefused(f"{mt} config {key}: Mellum's multi-token-prediction layer is not built by transformers "
                                "and its layout is not modelled; allowed: 0 or null (plans the model transformers trains)")  # fmt: skip
    out = _llama_like({k: v for k, v in cfg.items() if k != "attention_bias"}, mt)
    out["attention_bias"] = "qkvo" if cfg.get("attention_bias") else None
    out["qk_norm"] = "head"
    out.update(_sliding(cfg, mt, out["layers"], lambda n: ["full_attention"] * n))
    n = out["layers"]
    out["moe"] = MoE(experts=cfg["num_local_experts"], top_k=_need(cfg, "num_experts_per_tok", mt),
                     expert_ffn_hidden=_need(cfg, "moe_intermediate_size", mt),
                     dense_layers=_dense_by_type(cfg, mt, n, ["sparse"] * n))  # fmt: skip
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "sliding_window", "layer_types", "mlp_layer_types",
                               "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                               "num_mtp_layers", "num_nextn_predict_layers", "mtp_layer_types",
                               "mtp_mlp_layer_types"}  # fmt: skip


def _read_afmoe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Arcee AFMoE (``AfmoeForCausalLM``, Trinity): an attention whose output is multiplied by
    ``sigmoid(gate_proj(x))`` (``attention_gate``), per-head q/k RMSNorms, four norms a block (before and after
    attention and the MLP), every norm multiplying its weight in fp32 (``Olmo2RMSNorm``), local attention within
    ``sliding_window`` on the layers ``layer_types`` names (by default all but every ``global_attn_every_n_layers``-th)
    and rotary embeddings on those local layers only (the global ones NoPE); a dense MLP of ``intermediate_size`` on
    the first ``num_dense_layers`` layers, then routed experts of ``moe_intermediate_size`` with ``num_shared_experts``
    of them shared, behind a sigmoid router and one fp32 bias per expert held as a parameter the gradient never reaches
    (counted with the router, as ERNIE 4.5's). ``mup_enabled`` and ``route_scale`` multiply by Python scalars (nothing
    kept). Keys left out take ``AfmoeConfig``'s defaults (transformers 5.25 ``modular_afmoe.py``)."""
    cfg = {"head_dim": 128, "num_dense_layers": 1, "num_experts": 64, "num_experts_per_tok": 6, "num_shared_experts": 2,
           "moe_intermediate_size": 1408, "global_attn_every_n_layers": 4, "sliding_window": 1024, **cfg}  # fmt: skip
    _integers(cfg, mt, "num_dense_layers", "num_experts", "num_experts_per_tok", "num_shared_experts",
              "moe_intermediate_size")  # fmt: skip
    _integers(cfg, mt, "global_attn_every_n_layers", minimum=1)
    out = _llama_like({k: v for k, v in cfg.items() if k != "attention_bias"}, mt)
    out.update(attention_bias="qkvo" if cfg.get("attention_bias") else None, attention_gate="proj", qk_norm="head",
               block_norms=4, norm_fp32_weight=True)  # fmt: skip
    n, every = out["layers"], cfg["global_attn_every_n_layers"]
    types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    out.update(_sliding({**cfg, "layer_types": types}, mt, n, None))
    out["nope_layers"] = sum(t == "full_attention" for t in types)
    fe, dense = cfg["moe_intermediate_size"], min(cfg["num_dense_layers"], n)
    if dense == n:
        raise ConfigRefused(f"{mt} config num_dense_layers: every layer dense ({dense}); give at least one MoE layer")
    out["moe"] = MoE(experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"], expert_ffn_hidden=fe,
                     shared_ffn_hidden=cfg["num_shared_experts"] * fe, router_bias=True,  # the fp32 expert_bias
                     dense_layers=tuple(range(dense)))  # fmt: skip
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "num_dense_layers", "num_experts", "num_experts_per_tok",
                               "num_shared_experts", "moe_intermediate_size", "global_attn_every_n_layers",
                               "sliding_window", "layer_types", "route_scale", "mup_enabled"}  # fmt: skip


def _read_minicpm5_moe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """MiniCPM5-MoE (``MiniCPM5MoeForCausalLM``): grouped-query attention without q/k norms whose query projection also
    yields an output gate (``q_gate_proj``: 2 × heads × head_dim outputs, each head's query and gate side by side; the
    attention output multiplied by the gate's sigmoid — ``attention_gate`` fused, the same parameters and saves as a
    separate gate projection), ``attention_bias`` on every projection of the attention, and DeepSeek-V3's MoE —
    routed and ``n_shared_experts`` shared experts of ``moe_intermediate_size`` behind a sigmoid router taking the
    layer input in fp32 — on the layers ``mlp_layer_types`` marks ``sparse`` (by default all but the first
    ``first_k_dense_replace``), a dense MLP of ``intermediate_size`` on the others. ``use_gated_attention: false``,
    which transformers refuses, is refused. Keys left out take ``MiniCPM5MoeConfig``'s defaults: head_dim 128, 2 KV
    heads, 160 experts of 512, 16 a token, one shared (transformers 5.25 ``modular_minicpm5_moe.py``)."""
    cfg = _renamed(cfg, mt, {"num_local_experts": "n_routed_experts"})
    cfg = {"head_dim": 128, "num_key_value_heads": 2, "n_routed_experts": 160, "num_experts_per_tok": 16,
           "n_shared_experts": 1, "moe_intermediate_size": 512, **cfg}  # fmt: skip
    _no(cfg, mt, "use_gated_attention", (None, True))
    out = _llama_like({k: v for k, v in cfg.items() if k != "attention_bias"}, mt)
    out.update(attention_bias="qkvo" if cfg.get("attention_bias") else None, attention_gate="fused")
    cfg = {"first_k_dense_replace": 1, **cfg}
    _integers(cfg, mt, "first_k_dense_replace", minimum=0)
    n, first = out["layers"], cfg["first_k_dense_replace"]
    fe = cfg["moe_intermediate_size"]
    out["moe"] = MoE(experts=cfg["n_routed_experts"], top_k=cfg["num_experts_per_tok"], expert_ffn_hidden=fe,
                     shared_ffn_hidden=int(cfg["n_shared_experts"] or 0) * fe, router_fp32=True,
                     dense_layers=_dense_by_type(cfg, mt, n, ["dense" if i < first else "sparse" for i in range(n)]))  # fmt: skip
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "use_gated_attention", "n_routed_experts", "num_local_experts",
                               "num_experts_per_tok", "n_shared_experts", "moe_intermediate_size", "mlp_layer_types",
                               "first_k_dense_replace"}  # fmt: skip


def _read_kolibri1(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Aleph Alpha Kolibri 1 (``Kolibri1ForCausalLM``): EXAONE 4's attention — per-head q/k RMSNorms, no bias, local
    attention within ``sliding_window`` on the layers ``layer_types`` names (by default all but every fifth) and, with
    a window, the global layers without rotary (NoPE) — in GLM-4-0414's block (a norm before and after attention and
    the MLP: four a block), and on every layer DeepSeek-V3's MoE: routed experts of ``moe_intermediate_size`` beside
    one shared MLP of ``shared_expert_intermediate_size``, behind a sigmoid router taking the layer input in fp32 (its
    score-correction bias a buffer). ``Kolibri1Config`` has no ``intermediate_size``, ``attention_bias``,
    ``decoder_sparse_step``, ``mlp_only_layers`` or ``use_sliding_window`` (a config that sets one is refused); keys
    left out take its defaults — head_dim 128, 384 experts of 512, 6 a token, a 513-token window (transformers 5.25
    ``modular_kolibri1.py``)."""
    cfg = _renamed(cfg, mt, {"num_experts": "num_local_experts"})
    for key in ("intermediate_size", "attention_bias", "decoder_sparse_step", "mlp_only_layers", "use_sliding_window"):
        if key in cfg:
            raise ConfigRefused(f"{mt} config {key}: Kolibri1Config has no such setting (transformers cannot build it)")
    cfg = {"head_dim": 128, "num_local_experts": 384, "num_experts_per_tok": 6, "moe_intermediate_size": 512,
           "shared_expert_intermediate_size": 512, "sliding_window": 513, **cfg}  # fmt: skip
    out = _common(cfg, mt)
    fe = _need(cfg, "moe_intermediate_size", mt)
    out.update(ffn_hidden=fe, tied_embeddings=_tied(cfg, False), qk_norm="head", block_norms=4)
    n, window = out["layers"], cfg.get("sliding_window")
    types = cfg.get("layer_types") or ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n)]
    out.update(_sliding({**cfg, "layer_types": types}, mt, n, None))
    if window and "full_attention" in types:  # Exaone4Attention: rotary where there is no window or the layer slides
        out["nope_layers"] = sum(t == "full_attention" for t in types)
    out["moe"] = MoE(experts=cfg["num_local_experts"], top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=fe,
                     shared_ffn_hidden=int(cfg["shared_expert_intermediate_size"] or 0), router_fp32=True)  # fmt: skip
    return out, COMMON_KEYS | {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                               "shared_expert_intermediate_size", "sliding_window", "layer_types", "attention_bias",
                               "decoder_sparse_step", "mlp_only_layers", "use_sliding_window"}  # fmt: skip


def _read_olmoe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """OLMoE (``OlmoeAttention``): q and k normalised over their full width (Muennighoff et al. 2024, arXiv 2409.02060)."""
    out = _llama_like(cfg, mt)
    out["qk_norm"] = "full"
    f = _need(cfg, "intermediate_size", mt)
    out["moe"] = MoE(experts=_experts(cfg, mt), top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=f)
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "num_experts", "num_local_experts", "num_experts_per_tok"}


def _read_deepseek(cfg: dict[str, Any], mt: str, *, tied_default: bool = False) -> tuple[dict[str, Any], set[str]]:
    """DeepSeek-V2 / V3: multi-head latent attention and DeepSeekMoE (shared + fine-grained routed experts);
    the first first_k_dense_replace layers keep a dense MLP (DeepSeek-V3 report, arXiv 2412.19437, Sec. 2.1)."""
    out = _common(cfg, mt)
    layers = out["layers"]
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, tied_default))
    out.pop("head_dim", None)
    _no(cfg, mt, "attention_bias")
    _no(cfg, mt, "mlp_bias")
    _no(cfg, mt, "moe_layer_freq", (None, 1))
    out["mla"] = MLA(q_lora_rank=cfg.get("q_lora_rank"), kv_lora_rank=_need(cfg, "kv_lora_rank", mt),
                     qk_nope_head_dim=_need(cfg, "qk_nope_head_dim", mt),
                     qk_rope_head_dim=_need(cfg, "qk_rope_head_dim", mt), v_head_dim=_need(cfg, "v_head_dim", mt))
    if cfg.get("qk_head_dim") not in (None, out["mla"].qk_head_dim):
        raise ConfigRefused(f"{mt} config qk_head_dim ({cfg['qk_head_dim']}) must equal qk_nope_head_dim + qk_rope_head_dim")
    if cfg.get("n_routed_experts"):
        fe = _need(cfg, "moe_intermediate_size", mt)
        k = int(cfg.get("first_k_dense_replace") or 0)
        out["moe"] = MoE(experts=cfg["n_routed_experts"], top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=fe,
                         shared_ffn_hidden=int(cfg.get("n_shared_experts") or 0) * fe, router_fp32=True,
                         dense_layers=tuple(range(min(k, layers))))  # fmt: skip
        out["mtp_layers"] = int(cfg.get("num_nextn_predict_layers") or 0)
    elif cfg.get("num_nextn_predict_layers"):
        raise ConfigRefused(f"{mt} config num_nextn_predict_layers: modelled with routed experts only")
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                               "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
                               "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace",
                               "num_nextn_predict_layers", "qk_head_dim"}  # fmt: skip


def _read_sarvam_mla(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Sarvam MLA (``sarvam_mla``, Sarvam-105B): a ``DeepseekV3Config`` subclass that transformers builds as
    ``DeepseekV3ForCausalLM``. Its released configs' own key names (``num_experts``, ``num_shared_experts``,
    ``num_mtp_layers``) are read as DeepSeek-V3's; of their remote-code keys, ``q_head_dim`` must equal
    qk_nope_head_dim + qk_rope_head_dim and ``head_dim`` (the latent width vLLM reads) is dropped, as
    ``SarvamMLAConfig.__post_init__`` drops them. Keys left out take its class's defaults, which differ from
    DeepSeek-V3's: no q compression (``q_lora_rank`` null), 128 routed experts, one dense layer, no MTP layer
    (transformers 5.25 ``modular_sarvam_mla.py``)."""
    cfg = _renamed(cfg, mt, {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
                             "num_mtp_layers": "num_nextn_predict_layers"})  # fmt: skip
    q_head_dim = cfg.pop("q_head_dim", None)
    cfg = {"q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
           "first_k_dense_replace": 1, "num_nextn_predict_layers": 0, **cfg}  # fmt: skip
    if q_head_dim is not None and q_head_dim != cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]:
        raise ConfigRefused(f"{mt} config q_head_dim ({q_head_dim}) must equal qk_nope_head_dim + qk_rope_head_dim")
    out, keys = _read_deepseek(cfg, mt)
    return out, keys | {"num_experts", "num_shared_experts", "num_mtp_layers", "q_head_dim"}


def _read_axk1(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """SK Telecom A.X K1 (``AXK1ForCausalLM``): DeepSeek-V3 with always-compressed queries (``q_a_proj``: a null
    ``q_lora_rank`` refused, transformers cannot build it) and an RMSNorm of each MoE block's output inside its residual
    branch (``post_mlp_layernorm``: ``MoE.output_norm``), its MoE layers those ``mlp_layer_types`` marks ``sparse``
    (by default from ``first_k_dense_replace`` and ``moe_layer_freq``: a layer i is sparse when i ≥ k and i % freq is
    0). ``AXK1Config`` has no MTP layer. Keys left out take its defaults (transformers 5.25 ``modular_axk1.py``)."""
    cfg = _renamed(cfg, mt, {"num_local_experts": "n_routed_experts"})
    cfg = {"num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 192, "kv_lora_rank": 512,
           "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
           "num_experts_per_tok": 8, "moe_intermediate_size": 2048, **cfg}  # fmt: skip
    for key in ("num_mtp_layers", "num_nextn_predict_layers"):
        if cfg.get(key):
            raise ConfigRefused(f"{mt} config {key}: AXK1Config has no multi-token-prediction layer; allowed: 0")
    if not cfg.get("q_lora_rank"):
        raise ConfigRefused(f"{mt} config q_lora_rank: A.X K1's attention always compresses its queries; give the rank")
    cfg = {"first_k_dense_replace": 1, "moe_layer_freq": 1, **cfg}
    _integers(cfg, mt, "first_k_dense_replace", minimum=0)
    _integers(cfg, mt, "moe_layer_freq", minimum=1)
    first, freq = cfg["first_k_dense_replace"], cfg["moe_layer_freq"]
    n = _need(cfg, "num_hidden_layers", mt)
    dense = _dense_by_type(cfg, mt, n, ["sparse" if i >= first and i % freq == 0 else "dense" for i in range(n)])
    base = {k: v for k, v in cfg.items() if k not in ("mlp_layer_types", "first_k_dense_replace", "moe_layer_freq",
                                                      "num_mtp_layers", "num_nextn_predict_layers", "head_dim")}  # fmt: skip
    out, keys = _read_deepseek(base, mt)
    assert out["moe"] is not None
    out["moe"] = out["moe"].model_copy(update={"dense_layers": dense, "output_norm": True})
    return out, keys | {"mlp_layer_types", "first_k_dense_replace", "moe_layer_freq", "num_mtp_layers",
                        "num_nextn_predict_layers", "head_dim", "num_local_experts"}  # fmt: skip


#: the keys DeepSeek-V3.2's and GLM-5's config classes default (transformers 5.25 ``configuration_deepseek_v32.py``,
#: ``configuration_glm_moe_dsa.py``), which a config.json may leave out
_DSA_DEFAULTS = {
    "deepseek_v32": {"vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
                     "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
                     "n_shared_experts": 1, "n_routed_experts": 256, "kv_lora_rank": 512, "q_lora_rank": 1536,
                     "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "num_experts_per_tok": 8,
                     "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64, "first_k_dense_replace": 3},
    "glm_moe_dsa": {"vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048,
                    "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64,
                    "n_shared_experts": 1, "n_routed_experts": 256, "kv_lora_rank": 512, "q_lora_rank": 2048,
                    "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "num_experts_per_tok": 8,
                    "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 32, "first_k_dense_replace": 3},
}  # fmt: skip


def _glm_dsa_indexer_types(cfg: dict[str, Any], mt: str, layers: int) -> list[str]:
    """GLM-5's per-layer indexer modes (``GlmMoeDsaConfig.__post_init__``): ``indexer_types`` as given, else the
    ``index_topk_pattern`` (a string of F / S or a list), else a full indexer every ``index_topk_freq`` layers counted
    from ``index_skip_topk_offset`` (1 and 2 by default: every layer full)."""
    types = cfg.get("indexer_types")
    pattern = cfg.get("index_topk_pattern")
    if types is None and pattern is not None:
        if isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
            types = [{"F": "full", "S": "shared"}[c] for c in pattern]
        elif isinstance(pattern, list):
            types = list(pattern)
        else:
            raise ConfigRefused(f"{mt} config index_topk_pattern: a string of F and S, or a list of full / shared, is modelled")
    if types is None:
        cfg = {"index_topk_freq": 1, "index_skip_topk_offset": 2, **cfg}
        _integers(cfg, mt, "index_topk_freq", "index_skip_topk_offset", minimum=0)
        freq, offset = max(cfg["index_topk_freq"], 1), cfg["index_skip_topk_offset"]
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
    if len(types) != layers or any(t not in ("full", "shared") for t in types):
        raise ConfigRefused(f"{mt} config indexer_types: one of full, shared per layer ({layers}) is modelled")
    if types[0] != "full":
        raise ConfigRefused(f"{mt} config indexer_types: the first layer must run its own indexer (full); a shared layer "
                            "reuses the choice of a full one before it")  # fmt: skip
    return types


def _read_dsa(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """DeepSeek-V3.2 (``deepseek_v32``) and GLM-5 (``glm_moe_dsa``): DeepSeek-V3's multi-head latent attention and MoE
    with DeepSeek Sparse Attention — a lightning indexer in each layer scores every earlier token and the attention
    reads the ``index_topk`` best (DeepSeek-V3.2-Exp report, Sec. 2.1; ``ModelArch.indexer``); GLM-5's layers may
    reuse the previous full layer's choice (``indexer_types`` shared: no indexer of their own). Dense and MoE layers by
    ``mlp_layer_types`` (by default the first ``first_k_dense_replace`` dense); every layer's attention indexed
    (``layer_types``: indexed_attention). Keys left out take the config class's defaults (transformers 5.25); a
    multi-token-prediction layer (``num_nextn_predict_layers``, not built by transformers) is counted as
    DeepSeek-V3's, without an indexer of its own."""
    cfg = _renamed(cfg, mt, {"num_local_experts": "n_routed_experts", "num_experts": "n_routed_experts"})
    cfg = {**_DSA_DEFAULTS[mt], **cfg}
    _integers(cfg, mt, "index_n_heads", "index_head_dim", "index_topk", minimum=1)
    _integers(cfg, mt, "first_k_dense_replace", minimum=0)
    n = _need(cfg, "num_hidden_layers", mt)
    types = cfg.get("layer_types") or ["indexed_attention"] * n
    if len(types) != n or set(types) != {"indexed_attention"}:
        raise ConfigRefused(f"{mt} config layer_types: indexed_attention on every layer ({n}) is modelled")
    first = min(cfg["first_k_dense_replace"], n)
    dense = _dense_by_type(cfg, mt, n, ["dense"] * first + ["sparse"] * (n - first))
    shared = 0
    if mt == "glm_moe_dsa":
        shared = _glm_dsa_indexer_types(cfg, mt, n).count("shared")
    elif cfg.get("indexer_types") is not None:
        raise ConfigRefused(f"{mt} config indexer_types: DeepSeek-V3.2 runs an indexer on every layer; remove the key")
    if not cfg.get("q_lora_rank"):
        raise ConfigRefused(f"{mt} config q_lora_rank: the indexer reads the compressed query; give the rank")
    base = {k: v for k, v in cfg.items() if k not in _DSA_ONLY_KEYS}
    out, keys = _read_deepseek({**base, "first_k_dense_replace": 0}, mt)
    assert out["moe"] is not None
    out["moe"] = out["moe"].model_copy(update={"dense_layers": dense})
    out["indexer"] = Indexer(heads=cfg["index_n_heads"], head_dim=cfg["index_head_dim"], topk=cfg["index_topk"],
                             layers=n - shared if shared else None)  # fmt: skip
    return out, keys | _DSA_ONLY_KEYS | {"num_local_experts", "num_experts"}


_DSA_ONLY_KEYS = {"index_topk", "index_head_dim", "index_n_heads", "mlp_layer_types", "layer_types", "indexer_types",
                  "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset"}


def _read_glm4_moe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """GLM-4.5 / 4.6 / 4.7 and GLM-4.5-Air (``Glm4MoeForCausalLM``): grouped-query attention with q, k, v biases
    (``attention_bias``), an optional per-head q/k RMSNorm (``use_qk_norm``), and DeepSeek-V3's MoE — a dense MLP in
    the first ``first_k_dense_replace`` layers, then routed experts plus ``n_shared_experts`` shared ones of
    ``moe_intermediate_size``, a sigmoid router whose weight is the only routing parameter (the score-correction bias
    is a buffer) — and ``num_nextn_predict_layers`` multi-token-prediction layers, which transformers does not build
    (``_keys_to_ignore_on_load_unexpected``) and trainplan counts as DeepSeek-V3's module (transformers 5.25
    ``modeling_glm4_moe.py``; GLM-4.5 report, arXiv 2508.06471, Sec. 2). head_dim defaults to hidden // heads, as
    ``Glm4MoeAttention`` takes it; the partial rotary factor changes no parameters."""
    out = _common(cfg, mt)
    hidden, heads = out["hidden"], out["heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    if head_dim * heads != hidden:
        out["head_dim"] = head_dim
    out.update(ffn_hidden=_need(cfg, "intermediate_size", mt), tied_embeddings=_tied(cfg, False))
    out["attention_bias"] = "qkv" if cfg.get("attention_bias") else None
    if cfg.get("use_qk_norm"):
        out["qk_norm"] = "head"
    experts = _first(cfg, "n_routed_experts", "num_local_experts")
    if not experts:
        raise ConfigRefused(f"{mt} config lacks n_routed_experts")
    fe = _need(cfg, "moe_intermediate_size", mt)
    # a key left out takes Glm4MoeConfig's default (transformers 5.25): one shared expert, one dense layer, one MTP layer
    k = int(cfg.get("first_k_dense_replace", 1) or 0)
    out["moe"] = MoE(experts=experts, top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=fe,
                     shared_ffn_hidden=int(cfg.get("n_shared_experts", 1) or 0) * fe, router_fp32=True,
                     dense_layers=tuple(range(min(k, out["layers"]))))  # fmt: skip
    out["mtp_layers"] = int(_first(cfg, "num_nextn_predict_layers", "num_mtp_layers", default=1) or 0)
    return out, COMMON_KEYS | {"attention_bias", "use_qk_norm", "n_routed_experts", "num_local_experts",
                               "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                               "first_k_dense_replace", "num_nextn_predict_layers", "num_mtp_layers"}  # fmt: skip


def _read_glm4_moe_family(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Param2 MoE (``param2moe``, BharatGen Param2-17B-A2.4B) and Sarvam MoE (``sarvam_moe``, Sarvam-30B):
    ``Glm4MoeConfig`` subclasses that transformers builds as ``Glm4MoeForCausalLM`` (rotary over the whole head: no
    parameters). Their released configs' own key names (``num_experts``, ``num_shared_experts``, ``use_qkv_bias``,
    ``num_mtp_layers``: the classes' ``attribute_map``) are read as GLM-4.5's, and keys left out take their classes'
    defaults, which differ from GLM-4.5's: per-head q/k norms on, no MTP layer, head_dim 64, Param2's two shared
    experts and tied head (transformers 5.25 ``modular_param2moe.py``, ``modular_sarvam_moe.py``)."""
    cfg = _renamed(cfg, mt, {"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts",
                             "use_qkv_bias": "attention_bias", "num_mtp_layers": "num_nextn_predict_layers"})  # fmt: skip
    defaults = {"param2moe": {"num_key_value_heads": 8, "n_shared_experts": 2, "tie_word_embeddings": True,
                              "n_routed_experts": 64},
                "sarvam_moe": {"num_key_value_heads": 4, "n_routed_experts": 128}}[mt]  # fmt: skip
    cfg = {"use_qk_norm": True, "num_nextn_predict_layers": 0, "head_dim": 64, **defaults, **cfg}
    out, keys = _read_glm4_moe(cfg, mt)
    return out, keys | {"num_experts", "num_shared_experts", "use_qkv_bias"}


def _read_youtu(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Youtu-LLM (``YoutuForCausalLM``): DeepSeek-V3's multi-head latent attention in a dense Llama decoder (a gated
    MLP of ``intermediate_size`` on every layer), the head tied by default; ``YoutuConfig`` drops DeepSeek-V3's MoE
    keys, so a config that still sets experts or an MTP layer is refused (transformers 5.25 ``modular_youtu.py``)."""
    for key in ("n_routed_experts", "num_nextn_predict_layers", "first_k_dense_replace", "moe_intermediate_size",
                "n_shared_experts", "num_experts_per_tok"):  # fmt: skip
        _no(cfg, mt, key)
    out, keys = _read_deepseek(cfg, mt, tied_default=True)
    return out, keys | {"embedding_initializer_range"}


def _read_minicpm3(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """MiniCPM3 (``MiniCPM3ForCausalLM``, MiniCPM3-4B): DeepSeek-V2's multi-head latent attention with the usual rotary
    convention in a dense Llama decoder, the head tied by default, ``v_head_dim`` hidden ÷ heads when left out, and
    scalar multipliers on the embedding (``scale_emb``), the residual branches (``scale_depth``) and the head's input
    (``dim_model_base``), which keep nothing for backward but the embedding's scale buffer (transformers 5.25
    ``modular_minicpm3.py``)."""
    if cfg.get("v_head_dim") is None:  # MiniCPM3Config.__post_init__
        cfg = {**cfg, "v_head_dim": _need(cfg, "hidden_size", mt) // _need(cfg, "num_attention_heads", mt)}
    out, keys = _read_deepseek(cfg, mt, tied_default=True)
    return out, keys | {"scale_emb", "scale_depth", "dim_model_base"}


def _read_glm4_moe_lite(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """GLM-4.x Lite (``Glm4MoeLiteForCausalLM``): DeepSeek-V3's multi-head latent attention with GLM-4.5's MoE — routed
    and shared experts of ``moe_intermediate_size`` behind an fp32-input router — on the layers ``mlp_layer_types``
    marks ``sparse`` (by default every layer but the first), a dense MLP of ``intermediate_size`` on the ``dense`` ones,
    and DeepSeek-V3's multi-token-prediction layer where ``num_nextn_predict_layers`` says so (its checkpoint's layer
    past the last, which transformers does not build: counted as for GLM-4.5). ``head_dim`` is this config's alias of
    ``qk_rope_head_dim`` (its ``attribute_map``); the two must agree. transformers 5.25 ``modular_glm4_moe_lite.py``."""
    n = _need(cfg, "num_hidden_layers", mt)
    dense = _dense_by_type(cfg, mt, n, ["dense"] + ["sparse"] * (n - 1))
    if None not in (cfg.get("head_dim"), cfg.get("qk_rope_head_dim")) and cfg["head_dim"] != cfg["qk_rope_head_dim"]:
        raise ConfigRefused(f"{mt} config head_dim ({cfg['head_dim']!r}) is qk_rope_head_dim's alias and differs from it")
    rope = _first(cfg, "qk_rope_head_dim", "head_dim")
    cfg = {k: v for k, v in cfg.items() if k not in ("mlp_layer_types", "head_dim", "first_k_dense_replace")}
    _need(cfg, "n_routed_experts", mt)
    out, keys = _read_deepseek({**cfg, "qk_rope_head_dim": rope, "n_shared_experts": cfg.get("n_shared_experts", 1)}, mt)
    out["moe"] = out["moe"].model_copy(update={"dense_layers": dense})
    return out, keys | {"mlp_layer_types", "head_dim"}


def _read_solar_open(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Solar Open (``SolarOpenForCausalLM``, Upstage Solar-Open-100B): Llama's attention — ``attention_bias`` on q, k and
    v, never on o — and GLM-4.5's MoE on every layer: ``n_routed_experts`` routed experts and ``n_shared_experts``
    shared ones of ``moe_intermediate_size`` behind a sigmoid router (an fp32 copy of its input, as GLM-4.5's); no
    dense layer, no q/k norm, no multi-token-prediction layer (``SolarOpenConfig`` drops ``intermediate_size``,
    ``first_k_dense_replace``, ``use_qk_norm`` and ``num_mtp_layers``; a config that still sets them to something
    transformers would have to build is refused). transformers 5.25 ``modular_solar_open.py``."""
    # SolarOpenConfig's defaults for the keys left out; a null is refused by name (_need)
    cfg = {"head_dim": 128, "moe_intermediate_size": 1280, "num_experts_per_tok": 8, "n_shared_experts": 1, **cfg}
    if "n_routed_experts" not in cfg and "num_local_experts" not in cfg:
        cfg["n_routed_experts"] = 128
    _no(cfg, mt, "first_k_dense_replace")
    _no(cfg, mt, "use_qk_norm")
    _no(cfg, mt, "num_nextn_predict_layers")
    _no(cfg, mt, "num_mtp_layers")
    out = _common(cfg, mt)
    experts = _first(cfg, "n_routed_experts", "num_local_experts") or _need(cfg, "n_routed_experts", mt)
    fe = _need(cfg, "moe_intermediate_size", mt)
    out.update(ffn_hidden=fe, tied_embeddings=_tied(cfg, False), attention_bias="qkv" if cfg.get("attention_bias") else None,
               moe=MoE(experts=experts, top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=fe,
                       shared_ffn_hidden=int(cfg["n_shared_experts"] or 0) * fe, router_fp32=True))  # fmt: skip
    return out, COMMON_KEYS | {"attention_bias", "n_routed_experts", "num_local_experts", "num_experts_per_tok",
                               "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "use_qk_norm",
                               "num_nextn_predict_layers", "num_mtp_layers"}  # fmt: skip


def _read_granitemoe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """IBM Granite 3.x MoE (``GraniteMoeForCausalLM``) and PowerMoE (``GraniteMoeSharedForCausalLM``): Granite's
    attention and multipliers (:func:`_read_granite`), every layer routing over ``num_local_experts`` gated experts of
    ``intermediate_size`` (no dense MLP); ``granitemoeshared`` adds, when ``shared_intermediate_size`` is above 0, an
    ungated shared gated-MLP of that width beside the experts (transformers 5.25 ``modeling_granitemoe.py`` /
    ``modeling_granitemoeshared.py``)."""
    out = _llama_like(cfg, mt)
    f = out["ffn_hidden"]
    shared = int(cfg.get("shared_intermediate_size") or 0) if mt == "granitemoeshared" else 0
    out["moe"] = MoE(experts=_experts(cfg, mt), top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=f,
                     shared_ffn_hidden=shared)  # fmt: skip
    keys = COMMON_KEYS | {"attention_bias", "mlp_bias", "residual_multiplier", "logits_scaling", "num_local_experts",
                          "num_experts", "num_experts_per_tok"}  # fmt: skip
    return out, keys | ({"shared_intermediate_size"} if mt == "granitemoeshared" else set())


def _per_layer(cfg: dict[str, Any], mt: str, key: str, layers: int) -> Any:
    """A value a config may give once or once per layer (Hunyuan's released configs list them): the one value, or
    refused where the layers differ (trainplan models one value for every layer)."""
    value = cfg.get(key)
    if not isinstance(value, list):
        return value
    if len(value) != layers or len(set(map(json.dumps, value))) != 1:
        raise ConfigRefused(f"{mt} config {key}: one value for every layer ({layers}) is modelled; got {value!r:.80}")
    return value[0]


def _read_hunyuan_moe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """Hunyuan MoE (``HunYuanMoEV1ForCausalLM``, Hunyuan-A13B): Hunyuan dense's attention (per-head RMSNorms on the
    rotated q and k, ``attention_bias`` on q, k, v and o) and on every layer ``num_experts`` routed experts and one
    ungated shared MLP, all of ``intermediate_size``, behind a router whose weight is built in fp32
    (``nn.Linear(..., dtype=torch.float32)``: a model built or loaded in bf16 keeps it fp32, and the router takes an
    fp32 copy of its input). ``moe_topk`` once or once per layer (the same for every layer); ``num_experts`` a number
    (transformers builds no per-layer expert count). The released configs' keys that transformers does not read —
    ``moe_intermediate_size``, ``num_shared_expert``, ``use_mixed_mlp_moe``, ``use_qk_norm``, ``use_cla``,
    ``attention_head_dim``, ``moe_layer_num_skipped`` — are read where they describe what it builds (experts of
    ``intermediate_size``, one shared MLP, q/k norms, no cross-layer attention) and refused otherwise: transformers 5.25
    ``modeling_hunyuan_v1_moe.py``."""
    out, keys = _read_hunyuan_dense(cfg, mt)
    n, f = out["layers"], out["ffn_hidden"]
    experts = _experts(cfg, mt)
    if not isinstance(experts, int) or isinstance(experts, bool):
        raise ConfigRefused(f"{mt} config num_experts: transformers builds one expert count for every layer; got {experts!r:.80}")
    key = next((k for k in ("moe_topk", "num_experts_per_tok") if k in cfg), None)  # the second: its attribute_map alias
    top_k = _need({key: _per_layer(cfg, mt, key, n)}, key, mt) if key else 1  # HunYuanMoEV1Config's default: 1
    out["moe"] = MoE(experts=experts, top_k=top_k, expert_ffn_hidden=f, shared_ffn_hidden=f, router_fp32=True)
    _no({"moe_intermediate_size": _per_layer(cfg, mt, "moe_intermediate_size", n)}, mt, "moe_intermediate_size", (None, f))
    _no({"num_shared_expert": _per_layer(cfg, mt, "num_shared_expert", n)}, mt, "num_shared_expert", (None, 1))
    _no(cfg, mt, "use_mixed_mlp_moe", (None, True, 1))
    _no(cfg, mt, "use_qk_norm", (None, True))
    _no(cfg, mt, "use_cla")
    _no(cfg, mt, "moe_layer_num_skipped")
    _no(cfg, mt, "attention_head_dim", (None, out.get("head_dim", out["hidden"] // out["heads"])))
    unread = {"moe_intermediate_size", "num_shared_expert", "use_mixed_mlp_moe", "use_qk_norm", "use_cla",
              "cla_share_factor", "attention_head_dim", "moe_layer_num_skipped"}
    return out, keys | unread | {"num_experts", "num_local_experts", "moe_topk", "num_experts_per_tok"}


def _read_dots1(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """dots.llm1 (``Dots1ForCausalLM``): Qwen3's attention — per-head q/k RMSNorms, ``attention_bias`` on q, k, v and o —
    with DeepSeek-V3's MoE: a dense MLP in the first ``first_k_dense_replace`` layers, then ``n_routed_experts``
    routed and ``n_shared_experts`` shared experts of ``moe_intermediate_size``, a sigmoid router taking the layer
    input in fp32 (its score-correction bias is a buffer); sliding attention on the layers from ``max_window_layers``
    on when a ``sliding_window`` is set (``Dots1Config``'s defaults: 4096 from layer 62; transformers 5.25
    ``modeling_dots1.py``; dots.llm1 report, arXiv 2506.05767)."""
    out = _llama_like(cfg, mt)
    out["qk_norm"] = "head"
    _no(cfg, mt, "moe_layer_freq", (None, 1))  # the released config's DeepSeek-era key (every layer), unread by transformers
    experts = _first(cfg, "n_routed_experts", "num_local_experts")
    if not experts:
        raise ConfigRefused(f"{mt} config lacks n_routed_experts")
    fe = _need(cfg, "moe_intermediate_size", mt)
    k = int(cfg.get("first_k_dense_replace") or 0)
    out["moe"] = MoE(experts=experts, top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=fe,
                     shared_ffn_hidden=_need(cfg, "n_shared_experts", mt) * fe, router_fp32=True,
                     dense_layers=tuple(range(min(k, out["layers"]))))  # fmt: skip
    first = cfg.get("max_window_layers", 62)
    window_cfg = {"sliding_window": 4096, **cfg}
    if window_cfg["sliding_window"] is not None and first is None and cfg.get("layer_types") is None:
        raise ConfigRefused(f"{mt} config max_window_layers: null with a sliding_window; give the first windowed layer")
    out.update(_sliding(window_cfg, mt, out["layers"], lambda n: [
        "sliding_attention" if window_cfg["sliding_window"] is not None and i >= first else "full_attention"
        for i in range(n)]))  # fmt: skip
    return out, COMMON_KEYS | {"attention_bias", "mlp_bias", "n_routed_experts", "num_local_experts", "num_experts_per_tok",
                               "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace", "sliding_window",
                               "layer_types", "moe_layer_freq"}  # fmt: skip


def _read_minimax_m2(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """MiniMax-M2 / M2.5 (``MiniMaxM2ForCausalLM``): grouped-query attention without biases, q and k each normalised by
    one RMSNorm over their full width before the heads are split (``qk_norm_type: per_layer``), rotary on part of
    each head (``rotary_dim``: no parameters), and on every layer ``num_local_experts`` routed experts of
    ``intermediate_size`` behind a sigmoid router whose score-correction bias is a buffer; no shared expert, no dense
    MLP (transformers 5.25 ``modeling_minimax_m2.py``). The released configs' own keys are read where they describe
    that model (every ``attn_type_list`` entry 1 = softmax attention, ``use_qk_norm`` with ``per_layer``,
    ``shared_intermediate_size`` 0) and refused otherwise; their multi-token-prediction modules (``use_mtp``), which
    transformers does not build and whose layout trainplan does not model, are refused — ``use_mtp: false`` plans the
    model transformers trains."""
    cfg = _head_dim_or(cfg, mt, 128, "MiniMaxM2Attention")  # MiniMaxM2Config's default
    out = _common(cfg, mt)
    f = _need(cfg, "intermediate_size", mt)
    out.update(ffn_hidden=f, tied_embeddings=_tied(cfg, False), qk_norm="full")
    out["moe"] = MoE(experts=_experts(cfg, mt), top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=f)
    if any(t != 1 for t in cfg.get("attn_type_list") or ()):
        raise ConfigRefused(f"{mt} config attn_type_list: only 1 (softmax attention) is modelled; 0 is linear (lightning) attention")
    _no(cfg, mt, "use_qk_norm", (None, True))
    _no(cfg, mt, "qk_norm_type", (None, "per_layer"))
    _no(cfg, mt, "shared_intermediate_size")
    if cfg.get("use_mtp"):
        raise ConfigRefused(f"{mt} config use_mtp: true — its multi-token-prediction modules are not built by transformers "
                            "and not modelled; set use_mtp: false to plan the model transformers trains")  # fmt: skip
    return out, COMMON_KEYS | {"num_local_experts", "num_experts", "num_experts_per_tok", "attn_type_list", "use_qk_norm",
                               "qk_norm_type", "shared_intermediate_size", "use_mtp", "num_mtp_modules",
                               "mtp_transformer_layers", "use_routing_bias"}  # fmt: skip


def _read_ernie4_5_moe(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """ERNIE 4.5 MoE (``Ernie4_5_MoeForCausalLM``, ERNIE-4.5-21B-A3B / 300B-A47B): ERNIE 4.5's attention (no bias; the
    head tied by default) with routed experts of ``moe_intermediate_size`` on every ``moe_layer_interval``-th layer
    from ``moe_layer_start_index`` to ``moe_layer_end_index`` (-1: the last), a dense MLP of ``intermediate_size``
    elsewhere, ``moe_num_shared_experts`` ungated shared experts beside them, a softmax router taking the layer input
    in fp32 and, beside it, one fp32 score-correction value per expert held as a parameter (which the gradient
    never reaches; counted with the router) (transformers 5.25 ``modeling_ernie4_5_moe.py``). Its multi-token-
    prediction layer (``num_nextn_predict_layers``), which transformers does not build, and ``use_bias`` are refused."""
    _no(cfg, mt, "use_bias")
    _head_dim_or(cfg, mt, None, "Ernie4_5_MoeAttention")  # left out: hidden ÷ heads
    if cfg.get("num_nextn_predict_layers") or cfg.get("num_mtp_layers"):
        raise ConfigRefused(f"{mt} config num_nextn_predict_layers: its multi-token-prediction layer is not built by "
                            "transformers and not modelled; set it to 0 to plan the model transformers trains")  # fmt: skip
    d = {"moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
         "moe_layer_end_index": -1, "moe_layer_interval": 1, "moe_intermediate_size": 1536}  # Ernie4_5_MoeConfig's
    cfg = {**d, **cfg}
    # a null: transformers' layer test cannot compare it
    _integers(cfg, mt, "moe_num_experts", "moe_intermediate_size", "moe_k", "moe_layer_start_index", "moe_layer_end_index",
              "moe_num_shared_experts")  # fmt: skip
    _integers(cfg, mt, "moe_layer_interval", minimum=1)
    out = _llama_like(cfg, mt, tied_default=True)
    n = out["layers"]
    end = n - 1 if cfg["moe_layer_end_index"] == -1 else cfg["moe_layer_end_index"]
    start, step = cfg["moe_layer_start_index"], cfg["moe_layer_interval"]
    dense = tuple(i for i in range(n) if not ((i + 1) % step == 0 and start <= i <= end))
    fe = cfg["moe_intermediate_size"]
    out["moe"] = MoE(experts=cfg["moe_num_experts"], top_k=cfg["moe_k"], expert_ffn_hidden=fe,
                     shared_ffn_hidden=cfg["moe_num_shared_experts"] * fe, router_fp32=True, router_bias=True,
                     dense_layers=dense)  # fmt: skip
    return out, COMMON_KEYS | {"use_bias", "moe_k", "moe_num_experts", "moe_num_shared_experts", "moe_layer_start_index",
                               "moe_layer_end_index", "moe_layer_interval", "moe_intermediate_size", "moe_norm_min",
                               "num_nextn_predict_layers", "num_mtp_layers"}  # fmt: skip


def _read_flex_olmo(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """FlexOlmo (``FlexOlmoForCausalLM``): OLMo 2's block — full-width q/k RMSNorms, the two norms after attention
    and the MLP, norms that multiply their weight in fp32 (:func:`_read_olmo2`) — with OLMoE's routed experts of
    ``intermediate_size`` on every layer (transformers 5.25 ``modeling_flex_olmo.py``; FlexOlmo, arXiv 2507.07024)."""
    out, keys = _read_olmo2(cfg, mt)
    out["moe"] = MoE(experts=_experts(cfg, mt), top_k=_need(cfg, "num_experts_per_tok", mt), expert_ffn_hidden=out["ffn_hidden"])
    return out, keys | {"num_experts", "num_local_experts", "num_experts_per_tok"}


def _read_gpt_oss(cfg: dict[str, Any], mt: str) -> tuple[dict[str, Any], set[str]]:
    """gpt-oss (``GptOssForCausalLM``): biases on q, k, v, o, the router and every expert projection; a learned
    sink logit per head; alternating 128-token sliding and full layers (OpenAI gpt-oss model card, 2025, Sec. 2)."""
    out = _common(cfg, mt)
    f = _need(cfg, "intermediate_size", mt)
    out.update(ffn_hidden=f, tied_embeddings=_tied(cfg, False), attention_bias="qkvo", attention_sinks=True,
               norm_fp32_weight=True)  # GptOssRMSNorm: (self.weight * hidden_states).to(input_dtype)
    _no(cfg, mt, "attention_bias", (None, True))
    experts = _first(cfg, "num_local_experts", "num_experts")
    if experts is None:
        raise ConfigRefused(f"{mt} config lacks num_local_experts")
    out["moe"] = MoE(experts=experts, top_k=_first(cfg, "num_experts_per_tok", "experts_per_token", default=4),
                     expert_ffn_hidden=f, router_bias=True, expert_bias=True, clamped_swiglu=True)  # fmt: skip
    out.update(_sliding(cfg, mt, out["layers"], _alternate))
    return out, COMMON_KEYS | {"attention_bias", "num_local_experts", "num_experts", "num_experts_per_tok",
                               "experts_per_token", "sliding_window", "layer_types"}  # fmt: skip


READERS: dict[str, Callable[[dict[str, Any], str], tuple[dict[str, Any], set[str]]]] = {
    "llama": _read_llama,
    "internlm3": _read_llama_subclass,
    "iquestcoder": _read_llama_subclass,
    "exaone": _read_exaone,
    "cwm": _read_cwm,
    "hyperclovax": _read_hyperclovax,
    "granite": _read_granite,
    "mistral": _read_mistral,
    "ministral": _read_ministral,
    "ministral3": _read_ministral,
    "seed_oss": _read_seed_oss,
    "smollm3": _read_smollm3,
    "qwen2": _read_qwen2,
    "qwen3": _read_qwen3,
    "olmo2": _read_olmo2,
    "olmo3": _read_olmo2,
    "exaone4": _read_exaone4,
    "exaone_moe": _read_exaone_moe,
    "gemma": _read_gemma,
    "gemma2": _read_gemma2,
    "gemma3_text": _read_gemma3_text,
    "phi3": _read_phi3,
    "cohere": _read_cohere,
    "nanochat": _read_nanochat,
    "jais2": _read_jais2,
    "stablelm": _read_stablelm,
    "helium": _read_helium,
    "vaultgemma": _read_vaultgemma,
    "cohere2": _read_cohere,
    "glm": _read_glm,
    "glm4": _read_glm,
    "hunyuan_v1_dense": _read_hunyuan_dense,
    "hunyuan_v1_moe": _read_hunyuan_moe,
    "ernie4_5": _read_ernie4_5,
    "starcoder2": _read_starcoder2,
    "gpt_neox": _read_gpt_neox,
    "arcee": _read_arcee,
    "nemotron": _read_nemotron,
    "mixtral": _read_mixtral,
    "qwen2_moe": _read_qwen2_moe,
    "qwen3_moe": _read_qwen3_moe,
    "olmoe": _read_olmoe,
    "mellum": _read_mellum,
    "afmoe": _read_afmoe,
    "minicpm5_moe": _read_minicpm5_moe,
    "kolibri1": _read_kolibri1,
    "flex_olmo": _read_flex_olmo,
    "deepseek_v2": _read_deepseek,
    "deepseek_v3": _read_deepseek,
    "kimi_k2": _read_deepseek,
    "deepseek_v32": _read_dsa,
    "glm_moe_dsa": _read_dsa,
    "gpt_oss": _read_gpt_oss,
    "glm4_moe": _read_glm4_moe,
    "param2moe": _read_glm4_moe_family,
    "sarvam_moe": _read_glm4_moe_family,
    "sarvam_mla": _read_sarvam_mla,
    "axk1": _read_axk1,
    "solar_open": _read_solar_open,
    "glm4_moe_lite": _read_glm4_moe_lite,
    "youtu": _read_youtu,
    "minicpm3": _read_minicpm3,
    "granitemoe": _read_granitemoe,
    "granitemoeshared": _read_granitemoe,
    "dots1": _read_dots1,
    "minimax_m2": _read_minimax_m2,
    "ernie4_5_moe": _read_ernie4_5_moe,
}

# Families read by the generic pre-2024 reader below (GPT-2, OPT, BERT, T5): no strict key check.
LEGACY_TYPES = ("gpt2", "opt", "bert", "t5")

# Multimodal wrappers whose language model is one of the families above.
MULTIMODAL = {"gemma3": "gemma3_text", "mistral3": "mistral' or 'ministral3", "qwen2_5_vl": "qwen2", "llava": "llama",
              "kimi_k25": "kimi_k2"}

# model types whose config.json names a family transformers does not ship, for a model a shipped class builds exactly:
# Moonshot AI's Kimi K2 "reuses DeepSeekV3CausalLM's architecture" and sets model_type kimi_k2 only so that inference
# engines can tell it apart ("you can change model_type in config.json to deepseek_v3": MoonshotAI/Kimi-K2
# docs/deploy_guidance.md, read via the search tool 2026-12-07; its config.json's architectures: DeepseekV3ForCausalLM).
# Read with that family's reader; the cross-check, the trace and `trainplan run` build it as that family.
BUILT_AS = {"kimi_k2": "deepseek_v3"}


def buildable(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` with the model_type transformers builds it as (:data:`BUILT_AS`); unchanged for every other family."""
    mt = str(cfg.get("model_type", "")).lower()
    return {**cfg, "model_type": BUILT_AS[mt]} if mt in BUILT_AS else cfg


SUPPORTED_TYPES = tuple(sorted((*READERS, *LEGACY_TYPES)))


# What transformers' config classes assume for a key a config.json leaves out (GPT2Config, BertConfig, OPTConfig,
# T5Config __init__ defaults; read with AutoConfig.for_model in transformers 5.25): a config written without them still
# builds a model with GPT-2's Python GELU and 0.1 dropout, so it must be read with them.
LEGACY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gpt2": {"activation_function": "gelu_new", "resid_pdrop": 0.1},
    "bert": {"hidden_act": "gelu", "hidden_dropout_prob": 0.1},
    "opt": {"activation_function": "relu", "dropout": 0.1},
    "t5": {"dropout_rate": 0.1, "feed_forward_proj": "relu"},
}


def _read_legacy(cfg: dict[str, Any], mt: str) -> dict[str, Any]:
    cfg = {**LEGACY_DEFAULTS.get(mt, {}), **cfg}
    hidden = _first(cfg, "hidden_size", "n_embd", "d_model")
    heads = _first(cfg, "num_attention_heads", "n_head", "num_heads")
    layers = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
    if hidden is None or heads is None or layers is None:
        raise ConfigRefused(f"{mt} config lacks hidden size, attention heads or layer count")
    out: dict[str, Any] = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": _first(cfg, "num_key_value_heads", default=heads),
        "vocab": _first(cfg, "vocab_size"),
        "tied_embeddings": bool(_first(cfg, "tie_word_embeddings", default=True)),
        "max_seq_len": _first(cfg, "max_position_embeddings", "n_positions", "n_ctx"),
        "name": _first(cfg, "_name_or_path", default=mt or None) or None,
        # BERT hidden_dropout_prob, GPT-2 resid_pdrop, OPT dropout, T5 dropout_rate
        "dropout": float(_first(cfg, "hidden_dropout_prob", "resid_pdrop", "dropout", "dropout_rate", "attention_dropout",
                                default=0.0) or 0.0),  # fmt: skip
        "hf_model_type": mt,
        # transformers' NewGELUActivation / FastGELUActivation are Python expressions (activations.py)
        "gelu_python": _first(cfg, "activation_function", "hidden_act", default="") in PYTHON_GELUS,
    }
    if mt == "gpt2":
        out.update(mlp="gelu", ffn_hidden=_first(cfg, "n_inner", default=4 * hidden), position="learned",
                   norm="layernorm", bias=True)  # fmt: skip
    elif mt == "opt":
        out.update(mlp="gelu", ffn_hidden=cfg["ffn_dim"], position="learned", norm="layernorm", bias=True,
                   extra_embedding_params=2 * hidden)  # fmt: skip
    elif mt == "bert":
        out.update(arch="encoder", mlp="gelu", ffn_hidden=cfg["intermediate_size"], position="learned",
                   norm="layernorm", bias=True)  # fmt: skip
    else:  # t5
        d_kv = cfg.get("d_kv", hidden // heads)
        out.update(arch="encoder-decoder", mlp="swiglu" if "gated" in str(cfg.get("feed_forward_proj", "")) else "gelu",
                   ffn_hidden=cfg["d_ff"], position="relative", norm="rmsnorm", bias=False,
                   decoder_layers=cfg.get("num_decoder_layers") or layers)  # fmt: skip
        if d_kv * heads != hidden:
            out["head_dim"] = d_kv
    return out


def arch_from_hf_config(cfg: dict[str, Any]) -> ModelArch:
    """Read a Hugging Face ``config.json`` mapping as a :class:`ModelArch`, or raise :class:`ConfigRefused`
    (or pydantic's ``ValidationError`` for contradictory values) naming what is not modelled."""
    if not isinstance(cfg, dict):
        raise ConfigRefused("config.json must be a JSON object")
    mt = str(cfg.get("model_type", "")).lower()
    if mt in MULTIMODAL:
        raise ConfigRefused(
            f"model_type {mt!r} is multimodal (a vision tower beside the language model), which is not modelled; "
            f"plan its language model by giving its text_config (model_type '{MULTIMODAL[mt]}') as the config"
        )
    if mt in LEGACY_TYPES:
        return ModelArch(**_read_legacy(cfg, mt))
    reader = READERS.get(mt)
    if reader is None:
        raise ConfigRefused(
            f"model_type {mt or '(missing)'!r} is not modelled; supported: {', '.join(SUPPORTED_TYPES)} "
            "(or give the architecture as a mapping)"
        )
    out, consumed = reader(cfg, mt)
    _refuse_unknown(cfg, mt, consumed)
    build = {k: v for k, v in cfg.items() if k not in ("architectures", "auto_map", "_name_or_path", "transformers_version",
                                                        "torch_dtype", "dtype", "quantization_config")}  # fmt: skip
    return ModelArch(**out, hf_source=json.dumps(build, sort_keys=True))
