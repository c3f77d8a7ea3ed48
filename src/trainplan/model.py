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
    # pydantic turns true/false into 1/0; a size given as a boolean is a mistake.
    if isinstance(v, bool):
        raise ValueError(f"must be a number, got {str(v).lower()}")
    return v


PositiveInt = Annotated[int, BeforeValidator(_no_bool), Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]

# Position-embedding table length when neither the architecture nor the job gives one
# (GPT-2's n_positions default, transformers GPT2Config).
DEFAULT_LEARNED_POSITIONS = 1024


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
    params: PositiveInt | None = None  # published count, used as a check
    name: str | None = None

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelArch":
        kv = self.kv_heads or self.heads
        if self.heads % kv:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({kv})")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads}) or head_dim given")
        return self

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


def arch_from_hf_config(cfg: dict[str, Any]) -> ModelArch:
    """Read a Hugging Face ``config.json`` mapping as a :class:`ModelArch`.

    Raises ``ValueError`` (or pydantic's ``ValidationError``) on configs it cannot read.
    """
    mt = str(cfg.get("model_type", "")).lower()

    def first(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        return default

    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head", "num_heads")
    layers = first("num_hidden_layers", "n_layer", "num_layers")
    if hidden is None or heads is None or layers is None:
        raise ValueError("config.json lacks hidden size, attention heads or layer count")
    out: dict[str, Any] = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": first("num_key_value_heads", default=heads),
        "vocab": first("vocab_size"),
        "tied_embeddings": bool(first("tie_word_embeddings", default=mt in ("gpt2", "t5", "opt", "bert"))),
        "max_seq_len": first("max_position_embeddings", "n_positions", "n_ctx"),
        "name": first("_name_or_path", default=mt or None) or None,
        # BERT hidden_dropout_prob, GPT-2 resid_pdrop, OPT dropout, T5 dropout_rate, Llama attention_dropout
        "dropout": float(first("hidden_dropout_prob", "resid_pdrop", "dropout", "dropout_rate", "attention_dropout",
                               default=0.0) or 0.0),  # fmt: skip
    }
    if cfg.get("head_dim") is not None and cfg["head_dim"] * heads != hidden:
        out["head_dim"] = cfg["head_dim"]
    if mt in ("llama", "mistral", "qwen2", "gemma"):
        out.update(mlp="swiglu", ffn_hidden=cfg["intermediate_size"], position="rope", norm="rmsnorm", bias=False)
    elif mt == "gpt2":
        out.update(mlp="gelu", ffn_hidden=first("n_inner", default=4 * hidden), position="learned",
                   norm="layernorm", bias=True)  # fmt: skip
    elif mt == "opt":
        out.update(mlp="gelu", ffn_hidden=cfg["ffn_dim"], position="learned", norm="layernorm", bias=True,
                   extra_embedding_params=2 * hidden)  # fmt: skip
    elif mt == "bert":
        out.update(arch="encoder", mlp="gelu", ffn_hidden=cfg["intermediate_size"], position="learned",
                   norm="layernorm", bias=True)  # fmt: skip
    elif mt == "t5":
        d_kv = cfg.get("d_kv", hidden // heads)
        out.update(arch="encoder-decoder", mlp="swiglu" if "gated" in str(cfg.get("feed_forward_proj", "")) else "gelu",
                   ffn_hidden=cfg["d_ff"], position="relative", norm="rmsnorm", bias=False,
                   decoder_layers=cfg.get("num_decoder_layers") or layers)  # fmt: skip
        if d_kv * heads != hidden:
            out["head_dim"] = d_kv
    else:
        ffn = first("intermediate_size", "ffn_dim", "n_inner", "d_ff")
        if ffn is None:
            raise ValueError(f"unsupported model_type {mt!r}; give the architecture as a mapping")
        out.update(ffn_hidden=ffn, mlp="swiglu" if cfg.get("hidden_act") == "silu" else "gelu")
    return ModelArch(**out)


def hf_model_type(arch: ModelArch) -> str:
    """The Hugging Face class family that builds exactly ``arch``, or raise :class:`UnsupportedArchitecture`.

    Llama (``LlamaForCausalLM``): decoder, rotary positions, RMSNorm, gated SiLU MLP.
    GPT-2 (``GPT2LMHeadModel``): decoder, learned positions, LayerNorm with biases, GELU MLP.
    """
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
