"""Parameter counts of a transformer, by part.

Counting follows the layer definitions of the reference implementations
(Hugging Face ``modeling_llama.py``, ``modeling_gpt2.py``, ``modeling_opt.py``,
``modeling_bert.py``, ``modeling_t5.py``): attention projections Q, K, V, O;
a gated (SwiGLU, Shazeer 2020) MLP has three matrices, a GELU/ReLU MLP two;
a LayerNorm has a weight and a bias, an RMSNorm a weight only.  The totals are
checked against the published counts of every preset in the tests.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    block_linear: int  # weights of every linear layer inside the blocks (matmul weights), every expert included
    block_other: int  # biases, norm weights, attention sinks inside the blocks, final norms
    matmul_per_token: int  # weights that take part in a matmul per token (FLOPs: 2 per weight per token): the active ones
    routed_experts: int = 0  # of block_linear: the routed experts' weights (all of them; a token uses top_k per layer)
    mtp: int = 0  # DeepSeek-V3 / GLM-4.5 multi-token-prediction modules (in block_linear / block_other; transformers omits them)

    @property
    def total(self) -> int:
        return self.embedding + self.lm_head + self.block_linear + self.block_other


def _head_dim(a: ModelArch) -> int:
    return a.head_dim or a.hidden // a.heads


def attention_inner_dim(a: ModelArch) -> int:
    """heads × head_dim: width of Q and of the attention output (MLA: heads × (qk_head_dim + v_head_dim) / 2,
    the width whose 4·s·width per token is the score and value FLOPs)."""
    if a.mla is not None:
        return a.heads * (a.mla.qk_head_dim + a.mla.v_head_dim) // 2
    return a.heads * _head_dim(a)


def attention_output_dim(a: ModelArch) -> int:
    """Width of the attention output, the output projection's input: heads × head_dim (MLA: heads × v_head_dim,
    DeepSeek-V2 paper eq. 18 — narrower than the queries and keys where v_head_dim < qk_head_dim, as DeepSeek-V3's
    128 against 192)."""
    if a.mla is not None:
        return a.heads * a.mla.v_head_dim
    return attention_inner_dim(a)


def kv_inner_dim(a: ModelArch) -> int:
    """kv_heads × head_dim: width of K and V (smaller with GQA/MQA, Ainslie et al. 2023; MLA: the per-head K)."""
    if a.mla is not None:
        return a.heads * a.mla.qk_head_dim
    return (a.kv_heads or a.heads) * _head_dim(a)


def attention_shapes(a: ModelArch) -> dict[str, tuple[int, int]]:
    """(in, out) of the attention's linear layers, by the Hugging Face module names.

    MLA (DeepSeek-V2 paper, arXiv 2405.04434, eqs. 9-13; transformers ``DeepseekV3Attention``): queries through
    the rank-``q_lora_rank`` pair q_a/q_b (or one q_proj), keys and values through the shared latent
    kv_a_proj_with_mqa (rank ``kv_lora_rank`` + the decoupled rotary key) and kv_b_proj, then o_proj.
    """
    h = a.hidden
    if a.mla is not None:
        m, n = a.mla, a.heads
        shapes = {"q_a_proj": (h, m.q_lora_rank), "q_b_proj": (m.q_lora_rank, n * m.qk_head_dim)} if m.q_lora_rank \
            else {"q_proj": (h, n * m.qk_head_dim)}
        shapes.update({"kv_a_proj_with_mqa": (h, m.kv_lora_rank + m.qk_rope_head_dim),
                       "kv_b_proj": (m.kv_lora_rank, n * (m.qk_nope_head_dim + m.v_head_dim)),
                       "o_proj": (n * m.v_head_dim, h)})  # fmt: skip
        return shapes
    q, kv = a.heads * _head_dim(a), kv_inner_dim(a)
    if a.attention_gate == "fused":  # MiniCPM5-MoE: each head's query and gate from one projection
        shapes = {"q_gate_proj": (h, 2 * q), "k_proj": (h, kv), "v_proj": (h, kv)}
    else:
        shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv)}
    if a.attention_gate == "proj":  # AFMoE's self_attn.gate_proj (named apart from the MLP's gate_proj here), run before o
        shapes["attn_gate_proj"] = (h, q)
    shapes["o_proj"] = (q, h)
    return shapes


def dense_mlp_shapes(a: ModelArch, ffn_hidden: int | None = None) -> dict[str, tuple[int, int]]:
    h, f = a.hidden, ffn_hidden or a.ffn_hidden
    if a.mlp == "swiglu":
        return {"gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h)}
    return {"up_proj": (h, f), "down_proj": (f, h)}


def linear_shapes(a: ModelArch, *, cross_attention: bool = False) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear layer of one dense block, by the Hugging Face module names.

    For a mixture-of-experts model: the attention and the dense layers' MLP; the experts are
    :func:`expert_tensor_shapes`.
    """
    shapes = attention_shapes(a)
    if cross_attention:  # decoder block of an encoder-decoder: a second attention
        shapes.update({f"x_{k}": v for k, v in attention_shapes(a).items()})
    shapes.update(dense_mlp_shapes(a))
    return shapes


def moe_linear_shapes(a: ModelArch) -> dict[str, tuple[int, int]]:
    """The 2-D linear layers of one MoE block: attention, the router, the shared expert (and its gate)."""
    assert a.moe is not None
    shapes = attention_shapes(a)
    shapes["router"] = (a.hidden, a.moe.experts)
    if a.moe.shared_ffn_hidden:
        shapes.update(dense_mlp_shapes(a, a.moe.shared_ffn_hidden))
        if a.moe.shared_gate:
            shapes["shared_expert_gate"] = (a.hidden, 1)
    return shapes


def expert_tensor_shapes(a: ModelArch) -> dict[str, tuple[int, int, int]]:
    """(experts, in, out) of the routed experts' stacked weights: transformers 5 keeps each as one 3-D tensor
    (``gate_up_proj`` and ``down_proj`` of ``MixtralExperts``, ``Qwen3MoeExperts`` …)."""
    assert a.moe is not None
    e, h, f = a.moe.experts, a.hidden, a.moe.expert_ffn_hidden
    return {"gate_up_proj": (e, h, 2 * f), "down_proj": (e, f, h)}


def _norm_params(a: ModelArch) -> int:
    """A LayerNorm has a weight and (when the model uses biases, or ``norm_bias`` says so) a bias; an RMSNorm a weight
    only (MPT: no bias), or nothing (nanochat: ``norm_weight`` false)."""
    if not a.norm_weight:  # nanochat's weightless RMSNorms
        return 0
    biased = a.bias if a.norm_bias is None else a.norm_bias
    return a.hidden * (2 if a.norm == "layernorm" and biased else 1)


def _attention_other(a: ModelArch, shapes: dict[str, tuple[int, int]]) -> int:
    """Biases, q/k norms, MLA's latent norms and attention sinks of one attention."""
    q_out, kv_out, h = a.heads * _head_dim(a), kv_inner_dim(a), a.hidden
    n = 0
    if a.bias:
        n += sum(o for _, o in shapes.values())
    elif a.attention_bias == "qkv":
        n += q_out + 2 * kv_out
    elif a.attention_bias == "qkvo":
        n += q_out + 2 * kv_out + h
    if a.attention_gate == "fused" and a.attention_bias and not a.bias:  # q_gate_proj's bias covers the gate too
        n += q_out
    if a.qk_norm == "head":
        n += 2 * _head_dim(a) if a.norm_weight else 0
    elif a.qk_norm in ("full", "each_head"):  # one weight per element: over the full width, or each head its own
        n += q_out + kv_out
    if a.attention_sinks:
        n += a.heads
    if a.mla is not None:
        n += (a.mla.q_lora_rank or 0) + a.mla.kv_lora_rank
    return n


def indexer_shapes(a: ModelArch) -> dict[str, tuple[int, int]]:
    """(in, out) of the lightning indexer's linear layers (transformers 5.25 ``DeepseekV32Indexer``, also GLM-5's):
    ``wq_b`` from MLA's compressed query to heads × head_dim, ``wk`` one key from the block input, ``weights_proj`` a
    weight per head from the block input; empty without DeepSeek Sparse Attention."""
    if a.indexer is None:
        return {}
    assert a.mla is not None and a.mla.q_lora_rank is not None
    x = a.indexer
    return {"wq_b": (a.mla.q_lora_rank, x.heads * x.head_dim), "wk": (a.hidden, x.head_dim),
            "weights_proj": (a.hidden, x.heads)}  # fmt: skip


def indexer_params(a: ModelArch) -> tuple[int, int]:
    """(linear weights, other) of all the model's indexers: its linear layers and the LayerNorm of its key (weight and
    bias, ``nn.LayerNorm(head_dim)``), on every layer that runs one of its own."""
    if a.indexer is None:
        return 0, 0
    linear = sum(i * o for i, o in indexer_shapes(a).values())
    return a.indexer_layers * linear, a.indexer_layers * 2 * a.indexer.head_dim


def _dense_block(a: ModelArch, *, cross_attention: bool = False) -> tuple[int, int]:
    """(linear weights, other) of one block with a dense MLP."""
    attn = attention_shapes(a)
    mlp = dense_mlp_shapes(a)
    linear = sum(i * o for i, o in attn.values()) + sum(i * o for i, o in mlp.values())
    other = a.block_norms * _norm_params(a) + _attention_other(a, attn)
    if cross_attention:
        linear += sum(i * o for i, o in attn.values())
        other += _norm_params(a) + _attention_other(a, attn)
    if a.bias:
        other += sum(o for _, o in mlp.values())
    return linear, other


def _moe_block(a: ModelArch) -> tuple[int, int, int, int]:
    """(linear weights, other, routed-expert weights, active matmul weights per token) of one MoE block."""
    assert a.moe is not None
    m = a.moe
    attn = attention_shapes(a)
    shared = dense_mlp_shapes(a, m.shared_ffn_hidden) if m.shared_ffn_hidden else {}
    attn_w = sum(i * o for i, o in attn.values())
    shared_w = sum(i * o for i, o in shared.values()) + (a.hidden if m.shared_gate else 0)
    router_w = a.hidden * m.experts
    expert_w = sum(e * i * o for e, i, o in expert_tensor_shapes(a).values())
    other = a.block_norms * _norm_params(a) + _attention_other(a, attn)
    if m.router_bias:
        other += m.experts
    if m.output_norm:
        other += _norm_params(a)
    if m.expert_bias:
        other += m.experts * (2 * m.expert_ffn_hidden + a.hidden)
    active = attn_w + shared_w + router_w + expert_w * m.top_k // m.experts
    return attn_w + shared_w + router_w + expert_w, other, expert_w, active


def param_counts(a: ModelArch, seq_len: int | None = None) -> ParamCounts:
    """Parameters by part; ``total`` matches ``sum(p.numel())`` of the model built for ``seq_len``
    (a learned position table covers the job's sequences: ``ModelArch.positions``), plus DeepSeek-V3's
    multi-token-prediction modules, which transformers does not build (``mtp``)."""
    norm_params = _norm_params(a)
    embedding = a.vocab * a.hidden + a.extra_embedding_params
    if a.position == "learned":
        embedding += a.positions(seq_len) * a.hidden
    lm_head = 0 if a.tied_embeddings else a.vocab * a.hidden
    enc_lin, enc_other = _dense_block(a)
    routed = mtp = 0
    if a.arch == "encoder-decoder":
        dec_lin, dec_other = _dense_block(a, cross_attention=True)
        n_dec = a.decoder_layers or a.layers
        block_linear = a.layers * enc_lin + n_dec * dec_lin
        block_other = a.layers * enc_other + n_dec * dec_other + 2 * norm_params
        # per token, averaged over encoder and decoder tokens (same length assumed)
        matmul = (a.layers * enc_lin + n_dec * dec_lin) // 2 + a.vocab * a.hidden
    else:
        dense = a.dense_mlp_layers
        block_linear, block_other, active = dense * enc_lin, dense * enc_other, dense * enc_lin
        if a.moe is not None:
            lin, other, experts, act = _moe_block(a)
            block_linear += a.moe_layers * lin
            block_other += a.moe_layers * other
            routed = a.moe_layers * experts
            active += a.moe_layers * act
            if a.mtp_layers:
                # DeepSeek-V3 report Sec. 2.2: each MTP module is RMSNorms of the hidden state and of the next
                # token's embedding, a projection M ∈ R^{h×2h}, one transformer block and an output norm; the
                # embedding and output head are shared with the main model. GLM-4.5's MTP layer is counted the same
                # (its block is the model's own MoE layer; transformers builds neither).
                mtp_lin, mtp_other = 2 * a.hidden * a.hidden + lin, 3 * norm_params + other
                mtp = a.mtp_layers * (mtp_lin + mtp_other)
                block_linear += a.mtp_layers * mtp_lin
                block_other += a.mtp_layers * mtp_other
                routed += a.mtp_layers * experts
                active += a.mtp_layers * (2 * a.hidden * a.hidden + act + a.vocab * a.hidden)
        # DeepSeek Sparse Attention's indexers (transformers runs them without gradients: forward FLOPs only, counted
        # by transformer.indexer_forward_flops, not among the matmul weights a token's training step multiplies)
        idx_linear, idx_other = indexer_params(a)
        block_linear += idx_linear
        block_other += idx_other
        # a decoder ends in a final norm; an encoder (BERT) has an embedding LayerNorm
        # of the same size instead, and no vocabulary projection.
        block_other += norm_params
        matmul = active + (a.vocab * a.hidden if a.arch == "decoder" else 0)
    return ParamCounts(
        embedding=embedding,
        lm_head=lm_head,
        block_linear=block_linear,
        block_other=block_other,
        matmul_per_token=matmul,
        routed_experts=routed,
        mtp=mtp,
    )


def lora_targets(a: ModelArch, lora: LoraSpec) -> dict[str, tuple[int, int]]:
    """The linear layers of one dense block that get adapters (names absent in this model are skipped)."""
    return _targeted(linear_shapes(a), lora)


def _targeted(shapes: dict[str, tuple[int, int]], lora: LoraSpec) -> dict[str, tuple[int, int]]:
    """The layers of ``shapes`` that ``lora.targets`` names."""
    if "all-linear" in lora.targets:
        return shapes
    return {k: v for k, v in shapes.items() if k in lora.targets}


def moe_lora_targets(a: ModelArch, lora: LoraSpec) -> dict[str, tuple[int, int]]:
    """The linear layers of one MoE block that get adapters: the attention (targets naming the MLP, which adapt every
    routed expert in PEFT, are refused before this: ``transformer.check_moe_lora_targets``)."""
    return _targeted({k: v for k, v in moe_linear_shapes(a).items() if k not in ("router", "shared_expert_gate")}, lora)


def lora_params(a: ModelArch, lora: LoraSpec) -> int:
    """Trainable adapter parameters: rank × (in + out) per targeted matrix per block (Hu et al. 2021, "LoRA", Sec. 4)."""
    dense = sum(lora.rank * (i + o) for i, o in lora_targets(a, lora).values())
    if a.moe is None:
        return a.blocks * dense
    moe = sum(lora.rank * (i + o) for i, o in moe_lora_targets(a, lora).values())
    return a.dense_mlp_layers * dense + a.moe_layers * moe


def factored_dims(a: ModelArch) -> int:
    """Rows + columns of every weight matrix (Adafactor's factored second moment, Shazeer & Stern 2018, Sec. 3);
    each routed expert's matrices count apart."""
    dense = sum(i + o for i, o in linear_shapes(a).values())
    total = a.dense_mlp_layers * dense if a.arch == "decoder" else a.blocks * dense
    if a.moe is not None:
        per = sum(i + o for i, o in moe_linear_shapes(a).values())
        per += sum(e * (i + o) for e, i, o in expert_tensor_shapes(a).values())
        total += (a.moe_layers + a.mtp_layers) * per
    return total + 2 * (a.vocab + a.hidden)


def muon_matrices(a: ModelArch) -> list[tuple[int, int, int]]:
    """(how many, in, out) of the 2-D weight matrices inside the blocks: what Muon orthogonalises.

    torch.optim.Muon takes 2-D parameters only and its documentation sends "bias, and embedding" to a standard
    optimizer such as AdamW (torch/optim/_muon.py; Jordan 2024, "Muon: An optimizer for hidden layers in neural
    networks"; Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv 2502.16982 — embeddings and the
    output head with AdamW).  So: attention, dense MLP, router, shared expert and DeepSeek-V3's MTP projection go to
    Muon; embeddings, the output head, norms and biases to AdamW, and so do routed experts, which transformers 5
    keeps as one 3-D tensor each (:func:`expert_tensor_shapes`).
    """
    h = a.hidden
    out: list[tuple[int, int, int]] = []
    if a.arch == "encoder-decoder":
        out += [(a.layers, i, o) for i, o in linear_shapes(a).values()]
        out += [(a.decoder_layers or a.layers, i, o) for i, o in linear_shapes(a, cross_attention=True).values()]
        return out
    out += [(a.dense_mlp_layers, i, o) for i, o in linear_shapes(a).values()] if a.dense_mlp_layers else []
    if a.moe is not None:
        moe_blocks = a.moe_layers + a.mtp_layers
        out += [(moe_blocks, i, o) for i, o in moe_linear_shapes(a).values()]
        if a.mtp_layers:
            out.append((a.mtp_layers, 2 * h, h))  # the MTP module's projection M (DeepSeek-V3 report Sec. 2.2)
    return out


def muon_params(a: ModelArch) -> int:
    """Parameters Muon steps (:func:`muon_matrices`); AdamW steps the rest."""
    return matrix_params(muon_matrices(a))


def matrix_params(matrices: Iterable[tuple[int, int, int]]) -> int:
    """Parameters in ``matrices`` ((how many, in, out))."""
    return sum(n * i * o for n, i, o in matrices)


def newton_schulz_flops(matrices: list[tuple[int, int, int]], steps: int = 5) -> float:
    """FLOPs of Muon's orthogonalisation over ``matrices`` ((how many, in, out)), once per optimizer step.

    torch.optim.Muon (torch/optim/_muon.py ``_zeropower_via_newtonschulz``, 5 steps by default) transposes an
    r × c matrix to its wide side (m = min(r, c) rows, n = max(r, c) columns) and each step computes the Gram matrix
    X·Xᵀ (2m²n), ``addmm(A, A, A)`` (2m³) and ``addmm(X, B, X)`` (2m²n): 4m²n + 2m³ a step (the multiply-adds
    ×2, the convention of PyTorch's FLOP counter; tests/estimate/test_muon.py checks it against that counter).
    """
    total = 0.0
    for count, r, c in matrices:
        m, n = min(r, c), max(r, c)
        total += count * steps * (4.0 * m * m * n + 2.0 * m**3)
    return total


def largest_linear_params(a: ModelArch) -> int:
    """Elements of the largest weight tensor inside the blocks (a stacked expert tensor is one tensor)."""
    largest = max(i * o for i, o in linear_shapes(a).values())
    if a.moe is not None:
        largest = max(largest, max(e * i * o for e, i, o in expert_tensor_shapes(a).values()))
    return largest


def largest_block_params(a: ModelArch) -> int:
    """Parameters of the largest block (the unit ZeRO-3/FSDP gathers at once)."""
    lin, other = _dense_block(a, cross_attention=a.arch == "encoder-decoder")
    if a.moe is None:
        return lin + other
    moe_lin, moe_other, _, _ = _moe_block(a)
    return max(lin + other if a.dense_mlp_layers else 0, moe_lin + moe_other)
