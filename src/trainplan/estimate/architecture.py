"""Parameter counts of a transformer, by part.

Counting follows the layer definitions of the reference implementations
(Hugging Face ``modeling_llama.py``, ``modeling_gpt2.py``, ``modeling_opt.py``,
``modeling_bert.py``, ``modeling_t5.py``): attention projections Q, K, V, O;
a gated (SwiGLU, Shazeer 2020) MLP has three matrices, a GELU/ReLU MLP two;
a LayerNorm has a weight and a bias, an RMSNorm a weight only.  The totals are
checked against the published counts of every preset in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.model import ModelArch
from trainplan.spec import LoraSpec

# Bits per parameter of a 4-bit NormalFloat weight with double quantisation:
# 4 bits + 8-bit absmax per 64-block + fp32 constant per 256 such blocks
# (Dettmers et al. 2023, "QLoRA", Sec. 3: 0.127 bits of constants per parameter).
QLORA_BITS_PER_PARAM = 4 + 8 / 64 + 32 / (64 * 256)


@dataclass(frozen=True)
class ParamCounts:
    """Parameters of a model, split the way memory and FLOPs need them."""

    embedding: int  # token (+ learned position, + extra) embeddings
    lm_head: int  # output projection when untied (0 when tied)
    block_linear: int  # weights of every linear layer inside the blocks (matmul weights)
    block_other: int  # biases and norm weights inside the blocks, final norms
    matmul_per_token: int  # weights that take part in a matmul per token (FLOPs: 2 per weight per token)

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.block_linear + self.block_other


def _head_dim(a: ModelArch) -> int:
    return a.head_dim or a.hidden // a.heads


def attention_inner_dim(a: ModelArch) -> int:
    """heads × head_dim: width of Q and of the attention output."""
    return a.heads * _head_dim(a)


def kv_inner_dim(a: ModelArch) -> int:
    """kv_heads × head_dim: width of K and V (smaller with GQA/MQA, Ainslie et al. 2023)."""
    return (a.kv_heads or a.heads) * _head_dim(a)


def linear_shapes(a: ModelArch, *, cross_attention: bool = False) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear layer of one block, by the Hugging Face module names."""
    h, q, kv, f = a.hidden, attention_inner_dim(a), kv_inner_dim(a), a.ffn_hidden
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if cross_attention:  # decoder block of an encoder-decoder: a second attention
        shapes.update({"x_q_proj": (h, q), "x_k_proj": (h, kv), "x_v_proj": (h, kv), "x_o_proj": (q, h)})
    if a.mlp == "swiglu":
        shapes.update({"gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)})
    else:
        shapes.update({"up_proj": (h, f), "down_proj": (f, h)})
    return shapes


def _block_counts(a: ModelArch, *, cross_attention: bool) -> tuple[int, int]:
    """(linear weights, other) of one block."""
    shapes = linear_shapes(a, cross_attention=cross_attention)
    linear = sum(i * o for i, o in shapes.values())
    norm_params = _norm_params(a)
    norms = 3 if cross_attention else 2
    other = norms * norm_params
    if a.bias:
        other += sum(o for _, o in shapes.values())
    return linear, other


def _norm_params(a: ModelArch) -> int:
    """A LayerNorm has a weight and (when the model uses biases) a bias; an RMSNorm a weight only (MPT: no bias)."""
    return a.hidden * (2 if a.norm == "layernorm" and a.bias else 1)


def param_counts(a: ModelArch, seq_len: int | None = None) -> ParamCounts:
    """Parameters by part; ``total`` matches ``sum(p.numel())`` of the model built for ``seq_len``
    (a learned position table covers the job's sequences: ``ModelArch.positions``)."""
    norm_params = _norm_params(a)
    embedding = a.vocab * a.hidden + a.extra_embedding_params
    if a.position == "learned":
        embedding += a.positions(seq_len) * a.hidden
    lm_head = 0 if a.tied_embeddings else a.vocab * a.hidden
    enc_lin, enc_other = _block_counts(a, cross_attention=False)
    if a.arch == "encoder-decoder":
        dec_lin, dec_other = _block_counts(a, cross_attention=True)
        n_dec = a.decoder_layers or a.layers
        block_linear = a.layers * enc_lin + n_dec * dec_lin
        block_other = a.layers * enc_other + n_dec * dec_other + 2 * norm_params
        # per token, averaged over encoder and decoder tokens (same length assumed)
        matmul = (a.layers * enc_lin + n_dec * dec_lin) // 2 + a.vocab * a.hidden
    else:
        block_linear = a.layers * enc_lin
        # a decoder ends in a final norm; an encoder (BERT) has an embedding LayerNorm
        # of the same size instead, and no vocabulary projection.
        final_norm = norm_params
        block_other = a.layers * enc_other + final_norm
        matmul = block_linear + (a.vocab * a.hidden if a.arch == "decoder" else 0)
    return ParamCounts(
        embedding=embedding,
        lm_head=lm_head,
        block_linear=block_linear,
        block_other=block_other,
        matmul_per_token=matmul,
    )


def lora_targets(a: ModelArch, lora: LoraSpec) -> dict[str, tuple[int, int]]:
    """The linear layers of one block that get adapters (names absent in this MLP type are skipped)."""
    shapes = linear_shapes(a)
    if "all-linear" in lora.targets:
        return shapes
    return {k: v for k, v in shapes.items() if k in lora.targets}


def lora_params(a: ModelArch, lora: LoraSpec) -> int:
    """Trainable adapter parameters: rank × (in + out) per targeted matrix per block (Hu et al. 2021, "LoRA", Sec. 4)."""
    per_block = sum(lora.rank * (i + o) for i, o in lora_targets(a, lora).values())
    return a.blocks * per_block


def largest_block_params(a: ModelArch) -> int:
    """Parameters of the largest block (the unit ZeRO-3/FSDP gathers at once)."""
    lin, other = _block_counts(a, cross_attention=a.arch == "encoder-decoder")
    return lin + other
