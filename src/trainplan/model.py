"""The transformer architecture: one typed value, its one Hugging Face mapping, its derived counts.

A leaf module: it imports nothing from trainplan but ``errors``.  The job spec,
the catalog (model presets), the estimators and the run's workload all use
the :class:`ModelArch` defined here, and every translation between trainplan's
fields and a Hugging Face ``config.json`` goes through :func:`arch_from_hf_config`
(reading) and :func:`hf_config` (writing).  Key names follow the transformers
configuration classes (``LlamaConfig``, ``MistralConfig``, ``GPT2Config``,
``OPTConfig``, ``BertConfig``, ``T5Config``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

STRICT = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


def _no_bool(v: Any) -> Any:
    """A count as written in a job file: pydantic turns true/false into 1/0, and a size given as a boolean is a
    mistake; YAML 1.1 (PyYAML) reads ``1e6`` — without a dot — as the string "1e6", which a user means as the whole
    number 10**6 (``tokens: 1e9`` already parses as a float), so a string holding a whole number in that notation is
    that number. Anything else is left for the field's own validation to refuse."""
    if isinstance(v, bool):
        raise ValueError(f"must be a number, got {str(v).lower()}")
    if isinstance(v, str) and any(c in v for c in "eE_"):
        try:
            number = float(v)
        except ValueError:
            return v
        if number.is_integer() and abs(number) < 2**53:
            return int(number)
    return v


# Bounded so that no arithmetic downstream overflows (a 400-digit seq_len, tokens: .inf or 1e308 are typos, not jobs):
# 2**53 is the largest integer a float holds exactly; 1e18 is far above any real count (tokens, prices, hours).
PositiveInt = Annotated[int, BeforeValidator(_no_bool), Field(gt=0, lt=2**53)]
NonNegativeInt = Annotated[int, BeforeValidator(_no_bool), Field(ge=0, lt=2**53)]
PositiveFloat = Annotated[float, Field(gt=0, lt=1e18, allow_inf_nan=False)]

# Position-embedding table length when neither the architecture nor the job gives one
# (GPT-2's n_positions default, transformers GPT2Config).
DEFAULT_LEARNED_POSITIONS = 1024


class MoE(BaseModel):
    """The mixture-of-experts part of a decoder (Shazeer et al. 2017; Fedus et al. 2021; DeepSeekMoE, Dai et al. 2024).

    Every layer not in ``dense_layers`` replaces its MLP by a router over ``experts`` gated experts of width
    ``expert_ffn_hidden``, of which each token uses ``top_k``, plus (DeepSeekMoE, Qwen-MoE) an always-on shared
    MLP of width ``shared_ffn_hidden`` (the shared experts' widths added: DeepSeek's ``n_shared_experts ×
    moe_intermediate_size``).  The dense layers keep the model's ``ffn_hidden``.
    """

    model_config = STRICT

    experts: PositiveInt  # routed experts per MoE layer
    top_k: PositiveInt  # experts each token is routed to
    expert_ffn_hidden: PositiveInt
    shared_ffn_hidden: Annotated[int, BeforeValidator(_no_bool), Field(ge=0)] = 0
    shared_gate: bool = False  # Qwen2-MoE: sigmoid(Linear(h, 1)) scales the shared expert's output
    router_bias: bool = False  # gpt-oss: the router Linear has a bias
    expert_bias: bool = False  # gpt-oss: every expert projection has a bias
    # gpt-oss: the experts' SwiGLU clamps gate and up (swiglu_limit) and gates with sigmoid(alpha·gate) times (up + 1),
    # which keeps more intermediates for backward than SiLU(gate)·up (transformers GptOssExperts._apply_gate)
    clamped_swiglu: bool = False
    # DeepSeek-V2 / V3, GLM-4.5: the router computes its logits in fp32 from an fp32 copy of the layer's input
    # (``F.linear(hidden_states.type(torch.float32), ...)``), which it keeps for its weight's gradient
    router_fp32: bool = False
    # A.X K1: an RMSNorm of the MoE block's output (routed plus shared) inside the residual branch, on MoE layers only
    output_norm: bool = False
    dense_layers: tuple[Annotated[int, Field(ge=0)], ...] = ()  # indices of the layers that keep a dense MLP

    @model_validator(mode="after")
    def _check(self) -> "MoE":
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) must not exceed experts ({self.experts})")
        if len(set(self.dense_layers)) != len(self.dense_layers):
            raise ValueError("dense_layers lists a layer twice")
        return self


class MLA(BaseModel):
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): low-rank queries and a compressed,
    shared key-value latent with a decoupled rotary part."""

    model_config = STRICT

    q_lora_rank: PositiveInt | None = None  # None: queries by one full projection (DeepSeek-V2-Lite)
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


class Indexer(BaseModel):
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2-Exp report, Sec. 2.1; transformers 5.25
    ``DeepseekV32Indexer``): per token, ``heads`` small query heads of ``head_dim`` from MLA's compressed query, one key
    of ``head_dim`` and a weight per head from the block input score every earlier token; the ``topk`` best are the keys
    the layer's attention may read. ``layers``: the layers that run an indexer of their own (GLM-5's ``indexer_types``
    lets a layer reuse the previous one's choice); None: every layer."""

    model_config = STRICT

    heads: PositiveInt
    head_dim: PositiveInt
    topk: PositiveInt
    layers: PositiveInt | None = None


class ModelArch(BaseModel):
    """A transformer architecture, given inline or read from a preset."""

    model_config = STRICT

    arch: Literal["decoder", "encoder", "encoder-decoder"] = "decoder"
    layers: PositiveInt
    decoder_layers: PositiveInt | None = None  # encoder-decoder only; default = layers
    hidden: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = None  # default = heads (no GQA)
    head_dim: PositiveInt | None = None  # default = hidden / heads
    ffn_hidden: PositiveInt
    mlp: Literal["swiglu", "gelu"] = "swiglu"
    vocab: PositiveInt
    tied_embeddings: bool = False
    position: Literal["rope", "learned", "alibi", "relative"] = "rope"
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    bias: bool = False
    max_seq_len: PositiveInt | None = None
    extra_embedding_params: Annotated[int, Field(ge=0)] = 0
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0  # dropout probability in training (attention and residual)
    # the GELU is a Python expression of tanh, pow and products (transformers gelu_new / gelu_fast: GPT-2, GPT-J)
    # rather than one fused op: autograd keeps its intermediates
    gelu_python: bool = False
    # --- attention and block details of the 2024-2026 families (all optional: None / 0 = absent)
    attention_bias: Literal["qkv", "qkvo"] | None = None  # Qwen2: biases on q, k, v; gpt-oss: and on o
    # a norm of q and k: per head with one weight shared by the heads (Qwen3, Gemma 3), per head with each head's own
    # weight (Cohere's ``use_qk_norm``: weights of (heads, head_dim)), or over the full width (OLMoE)
    qk_norm: Literal["head", "each_head", "full"] | None = None
    attention_sinks: bool = False  # gpt-oss: one learned sink logit per head
    # the attention output multiplied element-wise by the sigmoid of a gate of heads x head_dim from the block's normed
    # input: its own bias-free projection (Arcee AFMoE's ``self_attn.gate_proj``: "proj"), or the second half of each
    # head's output of a query projection twice as wide (MiniCPM5-MoE's ``q_gate_proj``: "fused")
    attention_gate: Literal["proj", "fused"] | None = None
    # norms a block: 2 (Llama), 4 (Gemma 2/3: pre- and post-norms around attention and MLP) or 1 (Cohere: attention and
    # the MLP read one norm's output side by side and both add to the residual)
    block_norms: Literal[1, 2, 4] = 2
    # the RMSNorm multiplies its weight in fp32 before casting down (Gemma 1-3 ``x * (1 + w.float())``, gpt-oss, OLMo 2
    # ``(w * x).to(dtype)``), so with 16-bit compute it keeps the fp32 normalised tensor for the weight's gradient
    norm_fp32_weight: bool = False
    # OLMo 2/3, EXAONE 4: the block's two norms follow attention and the MLP instead of preceding them; the same bytes
    # are kept (measured, tests/estimate/test_norm_saves.py), so only a rendering for another framework reads it
    post_norms: bool = False
    # a LayerNorm's bias where it differs from the linear layers' (Nemotron: biased LayerNorms, unbiased projections);
    # None: the norm follows ``bias``
    norm_bias: bool | None = None
    # Cohere: the LayerNorm is fp32 Python arithmetic (``CohereLayerNorm``: centre, variance, rsqrt, weight product),
    # which keeps fp32 intermediates where a fused LayerNorm keeps its input; on q and k too where it normalises them
    norm_python: bool = False
    # nanochat: the RMSNorms (of the block, of q and k, the final one) have no weight — no parameters, and they keep what
    # a norm whose weight does not train keeps
    norm_weight: bool = True
    # nanochat: the embedding's output is normalised (by the final norm's module, weightless) before the first block
    embedding_norm: bool = False
    sliding_window: PositiveInt | None = None
    sliding_layers: Annotated[int, Field(ge=0)] = 0  # how many layers attend within sliding_window
    nope_layers: Annotated[int, Field(ge=0)] = 0  # SmolLM3: layers that apply no rotary embedding (NoPE)
    final_logit_softcap: PositiveFloat | None = None  # Gemma 2: logits = cap · tanh(logits / cap)
    attention_softcap: PositiveFloat | None = None  # Gemma 2: scores = cap · tanh(scores / cap) before the softmax
    moe: MoE | None = None
    mla: MLA | None = None
    indexer: Indexer | None = None  # DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): MLA whose keys a lightning indexer picks
    mtp_layers: Annotated[int, Field(ge=0)] = 0  # DeepSeek-V3 / GLM-4.5 multi-token-prediction modules (not built by transformers)
    hf_model_type: str | None = None  # the Hugging Face family the architecture was read from
    hf_source: str | None = None  # that config.json (JSON text): what trace and run build, for the 2024-2026 families
    params: PositiveInt | None = None  # published count, used as a check
    name: str | None = None

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelArch":
        kv = self.kv_heads or self.heads
        if self.heads % kv:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({kv})")
        if self.head_dim is None and self.hidden % self.heads and self.mla is None:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) or head_dim given")
        if self.norm_bias is not None and self.norm != "layernorm":
            raise ValueError(f"norm_bias applies to a LayerNorm; the model's norm is {self.norm}")
        if self.norm_python and (self.norm != "layernorm" or self.bias or self.norm_bias):
            raise ValueError("norm_python is modelled for a LayerNorm without a bias (Cohere's)")
        if not self.norm_weight and (self.norm != "rmsnorm" or self.norm_fp32_weight or self.qk_norm not in (None, "head")):
            raise ValueError("norm_weight: false is modelled for RMSNorms only (nanochat's), with q/k norms per head if any")
        if self.sliding_layers and self.sliding_window is None:
            raise ValueError("sliding_layers needs sliding_window")
        if self.sliding_layers > self.layers:
            raise ValueError(f"sliding_layers ({self.sliding_layers}) must not exceed layers ({self.layers})")
        if self.nope_layers and (self.position != "rope" or self.nope_layers > self.layers):
            raise ValueError(f"nope_layers ({self.nope_layers}) needs position rope and at most layers ({self.layers})")
        if self.moe is not None:
            if self.arch != "decoder":
                raise ValueError("moe is modelled for decoders only")
            bad = [i for i in self.moe.dense_layers if i >= self.layers]
            if bad:
                raise ValueError(f"moe.dense_layers: layer {bad[0]} does not exist (layers: {self.layers})")
        if self.mtp_layers and self.moe is None:
            raise ValueError("mtp_layers is modelled for mixture-of-experts models only (DeepSeek-V3, GLM-4.5)")
        if self.indexer is not None:
            if self.mla is None or self.mla.q_lora_rank is None:
                raise ValueError("indexer reads MLA's compressed query: it needs mla with a q_lora_rank")
            if self.indexer.head_dim < self.mla.qk_rope_head_dim:
                raise ValueError(f"indexer.head_dim ({self.indexer.head_dim}) must hold the rotary part "
                                 f"(mla.qk_rope_head_dim {self.mla.qk_rope_head_dim})")
            if (self.indexer.layers or 0) > self.layers:
                raise ValueError(f"indexer.layers ({self.indexer.layers}) must not exceed layers ({self.layers})")
        return self

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return 0 if self.moe is None else self.layers - len(self.moe.dense_layers)

    @property
    def dense_mlp_layers(self) -> int:
        return self.layers - self.moe_layers

    @property
    def indexer_layers(self) -> int:
        """Layers that run a lightning indexer of their own (DeepSeek Sparse Attention); 0 without one."""
        return 0 if self.indexer is None else self.indexer.layers or self.layers

    @property
    def features(self) -> list[str]:
        """The fields set beyond the Llama / GPT-2 / BERT / T5 shapes that :func:`hf_config` can write back."""
        names = ("moe", "mla", "indexer", "attention_bias", "qk_norm", "attention_sinks", "attention_gate", "block_norms", "sliding_layers",
                 "norm_fp32_weight", "post_norms", "norm_bias", "norm_python", "norm_weight", "embedding_norm",
                 "final_logit_softcap", "attention_softcap", "mtp_layers", "nope_layers")  # fmt: skip
        fields = type(self).model_fields
        return [n for n in names if getattr(self, n) != fields[n].default]

    @property
    def plain(self) -> bool:
        """No feature beyond the Llama / GPT-2 / BERT / T5 shapes that :func:`hf_config` can write back."""
        return not self.features

    # ------------------------------------------------------------------ derived counts

    @property
    def blocks(self) -> int:
        """Transformer blocks: encoder layers plus, for an encoder-decoder, decoder layers."""
        if self.arch == "encoder-decoder":
            return self.layers + (self.decoder_layers or self.layers)
        return self.layers

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def has_lm_head(self) -> bool:
        """Decoders and encoder-decoders end in a vocabulary projection; encoders (BERT) do not."""
        return self.arch != "encoder"

    def positions(self, seq_len: int | None = None) -> int:
        """Length of the position table the built model has: long enough for the job's sequences.

        The architecture's own limit when it has one and it covers ``seq_len``;
        otherwise ``seq_len`` (a model is built to train on the job's sequences).
        """
        limit = self.max_seq_len or (DEFAULT_LEARNED_POSITIONS if seq_len is None else 0)
        return max(limit, seq_len or 0)


class UnsupportedArchitecture(ValueError):
    """No Hugging Face class builds this architecture (trace and run need one)."""


def source_config(arch: ModelArch) -> dict[str, Any]:
    """The config ``arch`` was read from, if ``arch`` is still exactly what it says, with the model_type transformers
    builds it as (``hfconfig.BUILT_AS``: Kimi K2's is DeepSeek-V3's); an architecture changed after reading
    (``model_copy(update=...)``) no longer matches its source and is refused."""
    import json

    from trainplan.hfconfig import arch_from_hf_config, buildable

    assert arch.hf_source is not None
    cfg: dict[str, Any] = json.loads(arch.hf_source)
    again = arch_from_hf_config(cfg)
    keep = {"name", "hf_source", "params"}
    if again.model_dump(exclude=keep) != arch.model_dump(exclude=keep):
        raise UnsupportedArchitecture(
            f"this {arch.hf_model_type} architecture was changed after it was read from its config, so that config "
            "no longer builds it; give the changed config.json instead"
        )
    return buildable(cfg)


def hf_model_type(arch: ModelArch) -> str:
    """The Hugging Face class family that builds exactly ``arch``, or raise :class:`UnsupportedArchitecture`.

    Llama (``LlamaForCausalLM``): decoder, rotary positions, RMSNorm, gated SiLU MLP.
    GPT-2 (``GPT2LMHeadModel``): decoder, learned positions, LayerNorm with biases, GELU MLP.
    """
    if arch.hf_source is not None:
        return source_config(arch)["model_type"]
    if not arch.plain:
        raise UnsupportedArchitecture(
            f"{arch.hf_model_type or 'this'} architecture ({', '.join(arch.features)}) is planned, not built: without "
            "its config.json, trace and run build Llama-style and GPT-2-style decoders only"
        )
    if arch.arch == "decoder" and arch.position == "rope" and arch.norm == "rmsnorm" and arch.mlp == "swiglu":
        return "llama"
    if arch.arch == "decoder" and arch.position == "learned" and arch.norm == "layernorm" and arch.mlp == "gelu" and arch.bias:
        return "gpt2"
    raise UnsupportedArchitecture(
        f"no Hugging Face class is mapped for this architecture ({arch.arch}, {arch.position}, {arch.norm}, "
        f"{arch.mlp}{', bias' if arch.bias else ''}); Llama-style (rope, rmsnorm, swiglu) and GPT-2-style "
        "(learned, layernorm, gelu, bias) decoders are"
    )


def hf_config(arch: ModelArch, seq_len: int | None = None) -> dict[str, Any]:
    """The Hugging Face ``config.json`` mapping (with ``model_type``) of the model that has ``arch``'s shape.

    The same mapping builds the model that ``--trace`` traces and the one
    ``trainplan run`` trains: its position table covers ``seq_len``
    (:meth:`ModelArch.positions`), biases follow ``arch.bias`` on every linear
    layer, dropout is ``arch.dropout`` and no special tokens are set.
    """
    if arch.hf_source is not None:
        cfg = source_config(arch)
        cfg["use_cache"] = False
        if seq_len and (cfg.get("max_position_embeddings") or 0) < seq_len:
            cfg["max_position_embeddings"] = seq_len
        return cfg
    positions = arch.positions(seq_len)
    if hf_model_type(arch) == "llama":
        return {
            "model_type": "llama",
            "vocab_size": arch.vocab,
            "hidden_size": arch.hidden,
            "intermediate_size": arch.ffn_hidden,
            "num_hidden_layers": arch.layers,
            "num_attention_heads": arch.heads,
            "num_key_value_heads": arch.kv_heads or arch.heads,
            "head_dim": arch.head_size,
            "max_position_embeddings": positions,
            "tie_word_embeddings": arch.tied_embeddings,
            "attention_bias": arch.bias,
            "mlp_bias": arch.bias,
            "attention_dropout": arch.dropout,
            "hidden_act": "silu",
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
        }
    return {
        "model_type": "gpt2",
        "vocab_size": arch.vocab,
        "n_embd": arch.hidden,
        "n_inner": arch.ffn_hidden,
        "n_layer": arch.layers,
        "n_head": arch.heads,
        "n_positions": positions,
        "activation_function": "gelu_new",
        "tie_word_embeddings": arch.tied_embeddings,
        "attn_pdrop": arch.dropout,
        "resid_pdrop": arch.dropout,
        "embd_pdrop": arch.dropout,
        "bos_token_id": None,
        "eos_token_id": None,
    }
