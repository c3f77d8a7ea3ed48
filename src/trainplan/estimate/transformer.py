"""The analytic step profile of a transformer job: formulas over its architecture.

This module only composes the per-quantity functions of ``architecture``,
``memory`` and ``compute`` into a :class:`~trainplan.estimate.profile.StepProfile`;
each of those cites its source.  Hardware and strategy are applied by
``compose.py``, as for a traced profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainplan.catalog import Catalog, get_catalog, resolve_model
from trainplan.estimate import architecture as arch_mod
from trainplan.estimate.compose import compose
from trainplan.estimate.hf_check import CountMismatch, check_model_file
from trainplan.hfconfig import ConfigRefused
from trainplan.estimate.compute import memory_bound_bytes_per_token, training_step_flops
from trainplan.estimate.memory import (
    LoraSaves,
    checkpointed_activation_bytes,
    checkpointed_blocks,
    dequantized_weight_bytes,
    frozen_weight_cast_bytes,
    layer_activation_bytes,
    logits_bytes,
    muon_temporary_bytes,
    norm_is_fused,
    norm_saved_bytes_per_token,
    optimizer_foreach_temporary_bytes,
    selective_saved_bytes_per_token,
)
from trainplan.estimate.parallel import ModelSplit
from trainplan.estimate.profile import Params, ProfileSource, StepMemory, StepProfile
from trainplan.estimate.result import Estimate, Hardware
from trainplan.estimate.stack import Knobs, effective_knobs
from trainplan.estimate.steptime import matmul_efficiency
from trainplan.model import ModelArch
from trainplan.errors import SpecError
from trainplan.spec import (LORA_ATTENTION_TARGETS, LORA_MLP_TARGETS, Checkpointing, FlashAttention, FusedKernels, LoraSpec,
                            Method, Optimizer, Precision, RecomputeModule, SelectiveRecompute, Stack, TransformerJob)  # fmt: skip
from trainplan.strategies import Strategy

__all__ = ["TransformerModel", "activation_bytes", "check_moe_lora_targets", "estimate_transformer", "matmul_efficiency",
           "resolve_transformer", "transformer_profile"]  # fmt: skip


@dataclass(frozen=True)
class TransformerModel:
    """A job's model resolved to counts (computed once per plan, shared by every option)."""

    arch: ModelArch
    counts: arch_mod.ParamCounts
    trainable: int
    frozen_bytes: float  # bytes of frozen (LoRA/QLoRA base) weights, unsharded
    frozen_fp32_bytes: float  # the part of frozen_bytes stored in fp32 under mixed precision (knobs.frozen_weights_fp32)
    adapter_params: int
    trainable_matmul: float
    state_elems_per_param: float  # Adafactor's and Muon's shape-dependent state (Params.shaped_state_elems), else 0
    optimizer_flops: float = 0.0  # Muon's Newton-Schulz FLOPs per optimizer step (Params.optimizer_flops)
    muon_matrices: tuple[tuple[int, int, int], ...] = ()  # (count, rows, columns) Muon steps (arch_mod.muon_matrices)

    @property
    def total(self) -> int:
        return self.counts.total

    @property
    def muon_params(self) -> int:
        """Parameters Muon steps; AdamW steps the rest."""
        return arch_mod.matrix_params(self.muon_matrices)


def resolve_transformer(job: TransformerJob, catalog: Catalog | None = None) -> TransformerModel:
    """Resolve the job's model and its trainable / frozen split."""
    arch = resolve_model(job.model, catalog)
    try:
        check_model_file(job.model)
    except (CountMismatch, ConfigRefused) as exc:  # a count off transformers', or a config transformers cannot build
        raise SpecError(str(exc), field="model") from None
    counts = arch_mod.param_counts(arch, job.seq_len)
    lora = job.lora_spec
    # a *-mixed precision plugin keeps the frozen base in fp32 and autocasts it (stacks.yaml frozen_weights_fp32);
    # PEFT's prepare_model_for_kbit_training casts QLoRA's unquantised parameters to fp32 (qlora_fp32_params)
    k = effective_knobs(job, catalog or get_catalog())
    if job.knobs.moe_fp32_combine and arch.moe is None:
        raise SpecError("combines routed experts' outputs in fp32: it needs a mixture-of-experts model, and this one is "
                        "dense", field="knobs.moe_fp32_combine")  # fmt: skip
    if k.moe_fused_activation:
        _check_fused_activation(job, arch, k)
    _check_recompute_modules(job, arch)
    if arch.indexer is not None:
        _check_indexer(job, k)
    if job.lora_spec is not None and job.lora_spec.dropout > 0 and (k.compile or k.fused_kernels is not FusedKernels.NONE
                                                                    or arch.gelu_python):
        raise SpecError("is modelled for eager PEFT and torchtune LoRA layers; with compile, fused kernels or a Python "
                        "GELU what the dropout keeps has not been measured", field="lora.dropout")  # fmt: skip
    if job.lora_spec is not None and job.lora_spec.dropout > 0 and k.lora_layers in ("own", "litgpt"):
        raise SpecError(f"is modelled for PEFT's LoRA layers (stacks plain, hf-trainer, accelerate, deepspeed, "
                        f"llm-foundry) and torchtune's; {job.stack.value}'s own LoRA layers with dropout have not been "
                        "measured (LitGPT's fused QKV adapter drops its input once for q, k and v)",
                        field="lora.dropout")  # fmt: skip
    fp32_base = _fp32_base(job, k)
    e16 = 4 if job.precision is Precision.FP32 or fp32_base else 2
    fp32_bytes = 0.0
    if lora is None:
        trainable, frozen_bytes, adapters = counts.total, 0.0, 0
        trainable_matmul = float(counts.matmul_per_token)
    else:
        check_moe_lora_targets(arch, lora)
        adapters = arch_mod.lora_params(arch, lora)
        if adapters == 0:
            names = sorted(arch_mod.linear_shapes(arch))
            raise SpecError(f"none of {', '.join(lora.targets)} is a linear layer of this model; its layers: "
                            f"{', '.join(names)} (or all-linear)", field="lora.targets")
        trainable = adapters
        if job.method is Method.QLORA:
            # 4-bit NF4 base weights in the blocks; embeddings, head and norms stay 16-bit (QLoRA paper Sec. 3).
            frozen_bytes = counts.block_linear * arch_mod.QLORA_BITS_PER_PARAM / 8 + (counts.total - counts.block_linear) * e16
            fp32_bytes = (counts.total - counts.block_linear) * 4.0 if fp32_base else 0.0
        else:
            frozen_bytes = counts.total * e16
            fp32_bytes = counts.total * 4.0 if fp32_base else 0.0
        trainable_matmul = 0.0
    state_elems, optimizer_flops, muon_matrices = 0.0, 0.0, ()
    if job.optimizer is Optimizer.ADAFACTOR:
        state_elems = (arch_mod.factored_dims(arch) + counts.block_other) / max(1, counts.total)
    elif job.optimizer is Optimizer.MUON:
        if lora is not None:
            raise SpecError(f"muon is modelled for method: full (Muon on the hidden matrices, AdamW on the rest); with "
                            f"{job.method.value} adapters use adamw, or a kind: torch job, whose trace builds the "
                            "optimizer", field="optimizer")  # fmt: skip
        # one momentum buffer on Muon's matrices, AdamW's two moments on everything else
        muon_matrices = tuple(arch_mod.muon_matrices(arch))
        muon = arch_mod.matrix_params(muon_matrices)
        state_elems = (muon + 2.0 * (counts.total - muon)) / max(1, counts.total)
        optimizer_flops = arch_mod.newton_schulz_flops(list(muon_matrices))
    return TransformerModel(arch, counts, trainable, frozen_bytes, fp32_bytes, adapters, trainable_matmul, state_elems,
                            optimizer_flops, muon_matrices)  # fmt: skip


def _fp32_base(job: TransformerJob, k: Knobs) -> bool:
    """Whether a LoRA / QLoRA job's frozen base weights stay fp32 (knobs.frozen_weights_fp32, knobs.qlora_fp32_params)."""
    return (job.precision.mixed and k.frozen_weights_fp32) or (job.method is Method.QLORA and k.qlora_fp32_params)


# Eager attention code that up-casts its softmax to fp32 whatever the precision, keeping the fp32 output and the 16-bit
# copy the value matmul reads: transformers' eager attention in every decoder family trainplan reads but GPT-2's (v5.25:
# ``softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)``; BLOOM's ``F.softmax(..., dtype=torch.float32)``,
# MPT's ``softmax(attention_scores.float())``), which these stacks train, and LitGPT's (``litgpt/model.py``:
# ``F.softmax(scores, dim=-1, dtype=torch.float).to(dtype=q.dtype)``).  GPT-2's ``softmax(attn_weights, dim=-1)`` keeps
# the input's dtype; llm-foundry's torch attention likewise; torchtune and torchtitan attend through SDPA.
_UPCASTING_STACKS = frozenset({Stack.PLAIN, Stack.HF_TRAINER, Stack.ACCELERATE, Stack.DEEPSPEED, Stack.LIGHTNING,
                               Stack.LITGPT})  # fmt: skip


def _fp32_scores(job: TransformerJob, arch: ModelArch, k: Knobs) -> bool:
    """Whether eager attention keeps its softmax in fp32 (and the 16-bit copy the value matmul reads): under autocast,
    whose float32 list holds softmax, and in a pure 16-bit run where the model's code up-casts it
    (``_UPCASTING_STACKS``; not GPT-2's, whose learned positions and Python GELU identify it).  gpt-oss's sink
    attention runs softmax in the logits' own dtype, which the additive mask and the sinks promote to the weights'
    dtype: fp32 only when the weights are fp32 in the forward — under mixed precision a full fine-tune's (autocast
    over fp32 weights, as the step time also assumes; FSDP2's bf16 ``param_dtype`` and DeepSpeed's bf16 module run
    16-bit weights, so for them this counts 4 bytes a score more than they keep) and a LoRA job's fp32 base."""
    if arch.attention_sinks:
        return job.precision.mixed and (job.lora_spec is None or _fp32_base(job, k))
    if job.precision.mixed:
        return True
    gpt2 = arch.position == "learned" and arch.gelu_python
    return arch.arch == "decoder" and not gpt2 and k.stack in _UPCASTING_STACKS


def _flash(job: TransformerJob, arch: ModelArch) -> bool:
    """Whether attention runs a fused kernel (no s² tensor kept).

    "auto": PyTorch's scaled_dot_product_attention picks a fused kernel (flash or memory-efficient) on every CUDA
    GPU — except where the Hugging Face model has no SDPA path: the ALiBi families (BLOOM, MPT) add their bias to
    eagerly computed scores (transformers ``BloomPreTrainedModel`` / ``MptPreTrainedModel``: ``_supports_sdpa =
    False``, v5.25.0).  llm-foundry's MPT runs its own flash / triton attention.  Attention-logit soft-capping
    (Gemma 2) has no SDPA path either: transformers' ``Gemma2PreTrainedModel`` sets ``_supports_sdpa = False  # sdpa
    does not support softcapping`` (v5.25.0), and LitGPT's ``CausalSelfAttention.scaled_dot_product_attention``
    computes the scores eagerly when ``attention_logit_softcapping`` is set ("with softcapping we cannot use SDPA");
    ``flash_attention: true`` is the flash-attn package (``attn_implementation="flash_attention_2"``), which applies
    the cap inside its kernel.  gpt-oss's attention sinks neither: ``GptOssPreTrainedModel._supports_sdpa = False``
    (v5.25.0), so a Hugging Face gpt-oss attends eagerly unless a sink-aware kernel is chosen (the flash-attn 3 hub
    kernel ``kernels-community/vllm-flash-attn3``, flex attention: ``flash_attention: true``); torchtitan's gpt-oss
    runs its own sink-aware flex / varlen attention.
    """
    if job.flash_attention is FlashAttention.AUTO and arch.position == "alibi" and job.stack is not Stack.LLM_FOUNDRY:
        return False
    if job.flash_attention is FlashAttention.AUTO and arch.attention_softcap is not None:
        return False
    if job.flash_attention is FlashAttention.AUTO and arch.attention_sinks and job.stack is not Stack.TORCHTITAN:
        return False
    return job.flash_attention is not FlashAttention.FALSE


def checkpointed_count(arch: ModelArch, k: Knobs) -> tuple[int, int]:
    """(blocks full checkpointing wraps, blocks): every block, or knobs.checkpoint_fraction's share of them
    (memory.checkpointed_blocks); a share that wraps none is refused, not read as no checkpointing."""
    blocks = arch.blocks + arch.mtp_layers
    wrapped = checkpointed_blocks(blocks, k.checkpoint_fraction)
    if wrapped == 0 and blocks:
        raise SpecError(f"{k.checkpoint_fraction:g} of the model's {blocks} blocks checkpoints none of them; allowed: at "
                        f"least 1/{blocks}, or activation_checkpointing: none", field="knobs.checkpoint_fraction")  # fmt: skip
    return wrapped, blocks


def _checkpoint_notes(job: TransformerJob, arch: ModelArch, k: Knobs) -> tuple[str, ...]:
    """Which blocks full checkpointing wraps when knobs.checkpoint_fraction says a share of them."""
    if job.activation_checkpointing is not Checkpointing.FULL or k.checkpoint_fraction >= 1.0:
        return ()
    wrapped, blocks = checkpointed_count(arch, k)
    return (f"full checkpointing on {wrapped} of {blocks} blocks (knobs.checkpoint_fraction "
            f"{k.checkpoint_fraction:g}); the others keep all their activations",)


def _attention_notes(job: TransformerJob, arch: ModelArch) -> tuple[str, ...]:
    """Say so where ``flash_attention: auto`` priced eager attention because of the model (``_flash``)."""
    if job.flash_attention is not FlashAttention.AUTO or _flash(job, arch):
        return ()
    why = ("attention sinks" if arch.attention_sinks else "attention-logit soft-capping"
           if arch.attention_softcap is not None else "ALiBi")  # fmt: skip
    return (f"attention: eager, its s x s scores kept ({why}: transformers has no SDPA path for it); "
            "flash_attention: true prices a fused kernel that supports it",)


def hf_attention(job: TransformerJob, arch: ModelArch) -> str:
    """The ``attn_implementation`` a Hugging Face model attends with, as the estimate prices it (``_flash``): eager
    where the estimate keeps the s × s scores; the flash-attn package for a sink or soft-capped attention asked to be
    fused (transformers has no SDPA path for them — and the flash-attn 2 package drops gpt-oss's sinks, which
    ``trainplan run`` therefore refuses: run/workloads/checks.py); PyTorch SDPA otherwise."""
    if not _flash(job, arch):
        return "eager"
    if arch.attention_sinks or arch.attention_softcap is not None or arch.position == "alibi":
        return "flash_attention_2"
    return "sdpa"


def _attention_output_copy(job: TransformerJob, arch: ModelArch, k: Knobs) -> bool:
    """Whether the output projection keeps a contiguous copy of the fused attention kernel's output.

    PyTorch SDPA (``flash_attention: auto``) returns ``(B, H, S, D)``; Hugging Face (sdpa), torchtune and LitGPT
    transpose it into a contiguous ``(B, S, H·D)`` copy for the output projection.  The FlashAttention package
    (``flash_attention: true``: Hugging Face ``flash_attention_2``, llm-foundry's default) returns ``(B, S, H, D)``,
    which the projection only views.  Compiled, the copy is recomputed from the kernel's saved output (a pointwise
    op: min-cut rematerialisation).  The projection keeps its input only to form its weight's gradient: when it
    trains, when a LoRA adapter on it trains (``lora_A`` keeps the same input), or through bitsandbytes'
    ``MatMul4Bit``, which keeps its input ``A`` whenever either operand needs a gradient
    (``bitsandbytes/autograd/_functions.py``: ``ctx.tensors = (A, B)``) — QLoRA outside torchtune, whose torchao
    ``linear_nf4`` keeps only the weight.
    """
    return _kernel_output_copied(job, k) and _projection_keeps_input(job, arch, k)


def _kernel_output_copied(job: TransformerJob, k: Knobs) -> bool:
    """Whether the fused attention kernel's output is copied into a contiguous tensor for the output projection
    (:func:`_attention_output_copy`): PyTorch SDPA, not compiled, not llm-foundry's own attention."""
    return job.flash_attention is FlashAttention.AUTO and not k.compile and k.stack is not Stack.LLM_FOUNDRY


def _bitsandbytes(job: TransformerJob, k: Knobs) -> bool:
    """Whether the frozen base is bitsandbytes' 4-bit layers, whose ``MatMul4Bit`` keeps its input whenever either
    operand needs a gradient (QLoRA but under torchtune, whose ``linear_nf4`` keeps only the weight)."""
    return job.method is Method.QLORA and k.stack is not Stack.TORCHTUNE


def _projection_keeps_input(job: TransformerJob, arch: ModelArch, k: Knobs) -> bool:
    """Whether the output projection keeps its input (:func:`_attention_output_copy`)."""
    lora = job.lora_spec
    return lora is None or _bitsandbytes(job, k) or "o_proj" in arch_mod.lora_targets(arch, lora)


def _attention_widths(job: TransformerJob, arch: ModelArch, k: Knobs) -> dict[str, Any]:
    """The widths of V and of the attention output that a block keeps, and whether the output projection keeps a
    contiguous copy of that output (``memory.layer_activation_bytes``' ``v_dim``, ``out_dim``, ``copy_dim``,
    ``attention_output_copy``).

    Multi-head latent attention (transformers 5.25 ``DeepseekV3Attention``, which DeepSeek-V2 / V3 and the families
    built on it run): V is split out of ``kv_b_proj``'s output (``expand_kv``: ``torch.split``), and a fused SDPA kernel
    or eager attention keeps that view — its storage is ``kv_b_proj``'s output, counted in
    :func:`mla_latent_bytes_per_token` —, not a V of its own (measured with saved-tensor hooks: the CPU kernel's
    ``_saved_value`` shares the split's storage, ``tests/estimate/test_norm_saves.py``); the output and its copy are
    every head's ``v_head_dim``.  ``flash_attention: true`` (``flash_attention_2``) pads V to the q/k width
    (``integrations/flash_attention.py``: ``F.pad``, a tensor of its own) and crops the output back: the kernel keeps
    the padded V and output, and where the widths differ the output projection a contiguous copy of the crop
    (``reshape`` of a non-contiguous slice)."""
    copy = _attention_output_copy(job, arch, k)
    if arch.mla is None:
        return {"attention_output_copy": copy}
    n, m = arch.heads, arch.mla
    if job.flash_attention is FlashAttention.TRUE:
        cropped = m.qk_head_dim != m.v_head_dim and not k.compile and _projection_keeps_input(job, arch, k)
        return {"v_dim": n * m.qk_head_dim, "out_dim": n * m.qk_head_dim, "copy_dim": n * m.v_head_dim,
                "attention_output_copy": cropped}  # fmt: skip
    return {"v_dim": 0, "out_dim": arch_mod.attention_output_dim(arch), "attention_output_copy": copy}


def _layer_bytes(job: TransformerJob, arch: ModelArch, k: Knobs, ffn_hidden: int) -> float:
    """Activations one block keeps (Korthikanti et al. 2022 term by term, ``memory.layer_activation_bytes``)."""
    return sum(layer_split(job, arch, k, ffn_hidden))


def layer_split(job: TransformerJob, arch: ModelArch, k: Knobs, ffn_hidden: int) -> tuple[float, float]:
    """One block's activations as (outside, inside) the tensor-parallel regions (``memory.layer_activation_bytes``);
    MLA's latents and Gemma's extra norms are full-width and stay outside.  Under a PyTorch selective-checkpointing
    policy a block keeps its matmul outputs instead (:func:`_selective_split`)."""
    tokens, fp32_weight = job.seq_len * job.micro_batch, norm_fp32_weight(arch, k)
    trainable = job.lora_spec is None and arch.norm_weight  # a weightless norm keeps what a frozen one keeps
    fused_norms = norm_is_fused(arch.norm, compiled=k.compile, fused_kernels=k.fused_kernels)
    frozen_up = job.lora_spec is not None and not _bitsandbytes(job, k)  # a 4-bit up-projection keeps its input
    extra = tokens * (mla_latent_bytes_per_token(arch, job.precision, trainable=trainable, compiled=fused_norms,
                                                 frozen_up=frozen_up)
                      + block_norm_extra_bytes_per_token(arch, job.precision, trainable=trainable, fp32_weight=fp32_weight))
    if _keeps_matmul_outputs(job, k):
        replicated, sharded = _selective_split(job, arch, k, ffn_hidden)
        return replicated + extra, sharded
    qk_norms = tokens * (qk_norm_bytes_per_token(arch, job.precision, trainable=trainable, compiled=fused_norms,
                                                 fp32_weight=fp32_weight) + attention_gate_bytes_per_token(job, arch, k))
    split: list[tuple[float, float]] = []
    layer_activation_bytes(
        seq_len=job.seq_len,
        micro_batch=job.micro_batch,
        hidden=arch.hidden,
        heads=arch.heads,
        q_dim=arch_mod.kv_inner_dim(arch) if arch.mla is not None else arch_mod.attention_inner_dim(arch),
        kv_dim=_saved_kv_dim(arch, k, eager=not _flash(job, arch)),
        ffn_hidden=ffn_hidden,
        mlp=arch.mlp,
        norm=arch.norm,
        precision=job.precision,
        flash_attention=_flash(job, arch),
        checkpointing=_block_checkpointing(job, k),
        compiled=k.compile,
        dropout=arch.dropout > 0,
        frozen_norms=not trainable,
        norm_fp32_weight=fp32_weight,
        norm_python=arch.norm_python,
        shared_norm=arch.block_norms == 1,
        autocast_softmax=_fp32_scores(job, arch, k),
        softcap=arch.attention_softcap is not None,
        sinks=arch.attention_sinks,
        **_attention_widths(job, arch, k),
        fused_kernels=k.fused_kernels,
        gelu_python=arch.gelu_python,
        down_proj_keeps_input=job.lora_spec is None or "down_proj" in arch_mod.lora_targets(arch, job.lora_spec),
        lora=_lora_saves(job, arch, k),
        split=split,
    )
    replicated, sharded = split[0]
    return replicated + extra + tokens * sparse_mask_bytes_per_token(job, arch), sharded + qk_norms


def sparse_mask_bytes_per_token(job: TransformerJob, arch: ModelArch) -> float:
    """What DeepSeek Sparse Attention's mask adds to a block through SDPA: transformers (5.25 ``DeepseekV32Attention``,
    GLM-5's likewise) turns the indexer's top-k choice into a boolean mask of every query against every key
    ([batch, 1, s, s]) and passes it to ``scaled_dot_product_attention``, which converts it to an additive mask of the
    query's dtype and keeps that for backward (the CUDA memory-efficient kernel's ``attn_bias``; the CPU kernel's
    ``attn_mask``: measured with saved-tensor hooks, ``tests/estimate/test_norm_saves.py``) — e·s bytes a token on every
    layer, shared by the heads. Eager attention adds the mask to its scores and keeps nothing of it; 0 without an
    indexer."""
    if arch.indexer is None or not _flash(job, arch):
        return 0.0
    return float(job.precision.compute_bytes * job.seq_len)


def _score_bytes(job: TransformerJob) -> int:
    """Bytes of an element of the indexer's scores: its operands are cast to fp32 (``q.float()``, ``k.float()``) and
    autocast runs the matmul in the 16-bit type again; without autocast (bf16-pure, fp32) the scores are fp32."""
    return 2 if job.precision.mixed else 4


def indexer_transient_bytes(job: TransformerJob, arch: ModelArch) -> float:
    """The forward pass's peak beyond what it keeps, in a layer that runs DeepSeek Sparse Attention's indexer
    (transformers 5.25 ``DeepseekV32Indexer.forward``, under ``torch.no_grad``): the scores of every query head against
    every key, [batch, s, heads, s], then their scaled copy and its ReLU, two of them alive at once; plus the boolean
    causal mask the model builds once for the forward pass (``allow_is_causal_skip=False``, [batch, 1, s, s]). 0
    without an indexer."""
    if arch.indexer is None:
        return 0.0
    pairs = job.micro_batch * job.seq_len * job.seq_len
    return float(2 * _score_bytes(job) * arch.indexer.heads * pairs + pairs)


def indexer_forward_flops(job: TransformerJob, arch: ModelArch) -> tuple[float, float]:
    """(FLOPs, of them on fp32 units) of DeepSeek Sparse Attention's indexers in one micro-batch's forward pass: their
    projections (2 a weight a token) and, per layer, every query head against every key (2·s²·heads·head_dim a sequence:
    the full square, the causal mask is applied after) and the weighted sum over heads (2·s²·heads). Run without
    gradients, so no backward; the scores on the fp32 units where no autocast casts their fp32 operands down (bf16-pure;
    fp32 precision prices everything there already)."""
    if arch.indexer is None:
        return 0.0, 0.0
    x, tokens = arch.indexer, job.seq_len * job.micro_batch
    projections = 2.0 * tokens * arch.indexer_layers * sum(i * o for i, o in arch_mod.indexer_shapes(arch).values())
    scores = 2.0 * tokens * job.seq_len * x.heads * (x.head_dim + 1) * arch.indexer_layers
    return projections + scores, scores if _score_bytes(job) == 4 else 0.0


def _saved_kv_dim(arch: ModelArch, k: Knobs, *, eager: bool = False) -> float:
    """The mean width of the K and V the attention keeps: the key-value heads', or every head's where the stack copies
    grouped-query K and V out before SDPA (torchtune's ``MultiHeadAttention``: ``expand(...).flatten(1, 2)``; LitGPT's
    ``expand`` and ``reshape``) or before eager attention (``eager``: transformers' ``eager_attention_forward`` calls
    ``repeat_kv`` on K and V, and its two matmuls keep the copies — measured with saved-tensor hooks on Gemma 2 and
    gpt-oss, ``tests/estimate/test_norm_saves.py``); where V is a view into a fused QKV output (LitGPT without grouped
    queries), SDPA keeping V keeps that whole output, q + 2kv wide."""
    kv = arch_mod.kv_inner_dim(arch)
    if arch.mla is not None:
        return kv
    q = arch_mod.attention_inner_dim(arch)
    if k.fused_qkv_view and kv == q:
        return (q + (q + 2 * kv)) / 2
    return q if k.expanded_kv or eager else kv


#: the MLP projections' names: on a mixture-of-experts model they name the routed experts' weights too
_MLP_TARGETS = frozenset(LORA_MLP_TARGETS)


def check_moe_lora_targets(arch: ModelArch, lora: LoraSpec) -> None:
    """LoRA on a mixture-of-experts model is planned on the attention only. A target naming the MLP projections (or
    ``all-linear``) adapts every routed expert in the libraries that run it: transformers 4's experts are
    ``experts.{i}.gate_proj`` … modules that PEFT's suffix match takes, and with transformers 5's fused 3-D expert
    weights PEFT (0.21) turns those targets into ``target_parameters`` on ``experts.gate_up_proj`` / ``down_proj`` —
    dropping them from the modules, so the dense and shared MLPs are left frozen — and adds each expert's low-rank
    update to its weight in every forward pass (``ParamWrapper``: ``baddbmm`` of the stacked weights), a copy of all
    the layer's expert weights that the grouped matmul keeps for backward (``peft/utils/transformers_weight_conversion.py``,
    ``peft/tuners/lora/layer.py``; measured on a Qwen3-MoE block: 1.09 MB more per layer, 0.79 MB of them the experts'
    bf16 weights). trainplan does not estimate that, so it refuses rather than plan LoRA on the attention alone."""
    if arch.moe is None:
        return
    named = sorted(_MLP_TARGETS & set(lora.targets)) or (["all-linear"] if "all-linear" in lora.targets else [])
    if named:
        raise SpecError(f"{', '.join(named)} on a mixture-of-experts model adapts every routed expert (PEFT on "
                        "transformers 5 wraps the experts' stacked weights and keeps a merged copy of them per layer "
                        "for backward), which trainplan does not estimate; target the attention: "
                        f"{', '.join(n for n in arch_mod.attention_shapes(arch) if n in LORA_ATTENTION_TARGETS)}",
                        field="lora.targets")  # fmt: skip


def _check_fused_activation(job: TransformerJob, arch: ModelArch, k: Knobs) -> None:
    """knobs.moe_fused_activation holds only where its count was read: routed experts that train, the routing weight
    applied inside the activation (so not with torchtitan's fp32 combine, which applies it after)."""
    field = "knobs.moe_fused_activation"
    if arch.moe is None:
        raise SpecError("fuses the routed experts' activation: it needs a mixture-of-experts model, and this one is "
                        "dense", field=field)  # fmt: skip
    if job.lora_spec is not None:
        raise SpecError("is modelled for experts that train (full training); with frozen experts what the fused "
                        "activation keeps has not been measured", field=field)  # fmt: skip
    if k.moe_fp32_combine:
        raise SpecError("applies the routing weight inside the activation; knobs.moe_fp32_combine (torchtitan's) "
                        "applies it after the experts — set one of them", field=field)  # fmt: skip


def _check_indexer(job: TransformerJob, k: Knobs) -> None:
    """DeepSeek Sparse Attention is estimated as transformers' modeling code runs it eagerly through SDPA or eager
    attention (:func:`indexer_transient_bytes`, :func:`sparse_mask_bytes_per_token`): ``flash_attention: true`` hands the
    indexer's choice to a sparse kernel (``indices``) whose saves were not read, a compiled step fuses the indexer's
    scores, a selective-checkpointing policy would keep them, and the stacks with model code of their own have no
    indexer."""
    if job.flash_attention is FlashAttention.TRUE:
        raise SpecError("true: transformers hands DeepSeek Sparse Attention's top-k choice to a sparse kernel (indices), "
                        "whose memory trainplan does not estimate; allowed for this model: auto (SDPA with the sparse "
                        "mask), false (eager attention)", field="flash_attention")  # fmt: skip
    if job.activation_checkpointing is Checkpointing.SELECTIVE:
        # torch.utils.checkpoint's selective mode caches the outputs its policy saves whatever the grad mode, so the
        # indexer's matmul outputs (s x s scores a head) would be kept to the backward pass; not measured
        raise SpecError("selective: a selective policy would keep the outputs of DeepSeek Sparse Attention's indexer "
                        "matmuls (its s x s scores a head) to the backward pass, which has not been measured; allowed "
                        "for this model: none, full", field="activation_checkpointing")  # fmt: skip
    if k.compile:
        raise SpecError("true: what a compiled step keeps of DeepSeek Sparse Attention's indexer (its s x s scores a "
                        "head, fused) has not been measured; allowed for this model: false", field="knobs.compile")  # fmt: skip
    if k.stack in _OWN_MODEL_STACKS:
        raise SpecError(f"{job.stack.value} trains its own model code, which has no DeepSeek Sparse Attention indexer; "
                        "allowed for this model: a stack that runs transformers' modeling code (plain, hf-trainer, "
                        "accelerate, deepspeed, lightning)", field="stack")  # fmt: skip


def _check_recompute_modules(job: TransformerJob, arch: ModelArch) -> None:
    """knobs.recompute_modules names only submodules the model has (Megatron-Core skips the others silently)."""
    mods = set(job.knobs.recompute_modules or ())
    moe_only = mods & {RecomputeModule.MOE, RecomputeModule.MOE_ACT, RecomputeModule.SHARED_EXPERTS}
    if moe_only and arch.moe is None:
        raise SpecError(f"{', '.join(sorted(m.value for m in moe_only))}: a mixture-of-experts module, and this model "
                        "is dense", field="knobs.recompute_modules")  # fmt: skip
    if RecomputeModule.SHARED_EXPERTS in mods and arch.moe is not None and not arch.moe.shared_ffn_hidden:
        raise SpecError("shared_experts: this model has no shared experts", field="knobs.recompute_modules")
    if RecomputeModule.MOE_ACT in mods and job.lora_spec is not None:
        raise SpecError("moe_act is modelled for experts that train (full training); with frozen experts what the "
                        "activation keeps has not been measured", field="knobs.recompute_modules")  # fmt: skip


def megatron_modules(job: TransformerJob, k: Knobs) -> frozenset[RecomputeModule]:
    """The submodules a selective layer recomputes the Megatron-Core way (``knobs.recompute_modules``; Megatron's
    default, the attention core alone); empty when the job does not checkpoint that way."""
    if job.activation_checkpointing is not Checkpointing.SELECTIVE or _keeps_matmul_outputs(job, k):
        return frozenset()
    return k.recompute_modules


def _block_checkpointing(job: TransformerJob, k: Knobs) -> Checkpointing:
    """What memory.layer_activation_bytes counts: Megatron's selective without ``core_attn`` keeps the core."""
    megatron = job.activation_checkpointing is Checkpointing.SELECTIVE and not _keeps_matmul_outputs(job, k)
    if megatron and RecomputeModule.CORE_ATTN not in k.recompute_modules:
        return Checkpointing.NONE
    return job.activation_checkpointing


def kept_ffn(job: TransformerJob, arch: ModelArch, k: Knobs, *, moe: bool) -> int:
    """The MLP width whose intermediates a block keeps: 0 when Megatron's ``mlp`` (a dense layer's MLP) or ``moe`` /
    ``shared_experts`` (an MoE layer's shared experts) module is checkpointed — ``tensor_parallel.checkpoint`` keeps
    only the module's input, which memory.layer_activation_bytes counts with the MLP either way (e·h)."""
    mods = megatron_modules(job, k)
    if not moe:
        return 0 if RecomputeModule.MLP in mods else arch.ffn_hidden
    assert arch.moe is not None
    checkpointed = RecomputeModule.MOE in mods or RecomputeModule.SHARED_EXPERTS in mods
    return 0 if checkpointed else arch.moe.shared_ffn_hidden


def module_recompute_working(job: TransformerJob, arch: ModelArch, k: Knobs) -> float:
    """One layer's saves that Megatron's checkpointed modules (``mlp``, ``moe``, ``shared_experts``) rebuild while
    that layer's backward runs — what full checkpointing's one recomputed block is to it (Chen et al. 2016)."""
    mods = megatron_modules(job, k)
    if not mods & {RecomputeModule.MLP, RecomputeModule.MOE, RecomputeModule.SHARED_EXPERTS}:
        return 0.0
    dense = _layer_bytes(job, arch, k, arch.ffn_hidden) - _layer_bytes(job, arch, k, kept_ffn(job, arch, k, moe=False))
    if arch.moe is None:
        return max(0.0, dense)
    shared = (_layer_bytes(job, arch, k, arch.moe.shared_ffn_hidden)
              - _layer_bytes(job, arch, k, kept_ffn(job, arch, k, moe=True)))  # fmt: skip
    routed = routed_expert_bytes(job, arch, fp32_combine=k.moe_fp32_combine, act_recomputed=RecomputeModule.MOE_ACT in mods,
                                 fused_activation=k.moe_fused_activation)  # fmt: skip
    moe = shared + (routed if RecomputeModule.MOE in mods else 0.0)
    return max(0.0, dense if arch.dense_mlp_layers else 0.0, moe)


def module_recomputed_params(job: TransformerJob, arch: ModelArch, k: Knobs) -> float:
    """Weights whose matmuls Megatron's checkpointed modules run again in backward (a forward's 2 FLOPs per weight per
    token): the dense MLPs (``mlp``), the shared experts (``shared_experts`` or ``moe``), and with ``moe`` the router
    and each token's top_k experts.  The output-discarding modules (``layernorm``, ``moe_act``) recompute element-wise
    work only."""
    mods = megatron_modules(job, k)
    total = 0.0
    if RecomputeModule.MLP in mods:
        dense_layers = arch.dense_mlp_layers if arch.moe is not None else arch.blocks + arch.mtp_layers
        total += dense_layers * sum(i * o for i, o in arch_mod.dense_mlp_shapes(arch, arch.ffn_hidden).values())
    if arch.moe is not None and mods & {RecomputeModule.MOE, RecomputeModule.SHARED_EXPERTS}:
        layers = arch.moe_layers + arch.mtp_layers
        if arch.moe.shared_ffn_hidden:
            total += layers * sum(i * o for i, o in arch_mod.dense_mlp_shapes(arch, arch.moe.shared_ffn_hidden).values())
        if RecomputeModule.MOE in mods:
            per_expert = sum(i * o for _, i, o in arch_mod.expert_tensor_shapes(arch).values())
            total += layers * (arch.hidden * arch.moe.experts + arch.moe.top_k * per_expert)
    return float(total)


def _lora_saves(job: TransformerJob, arch: ModelArch, k: Knobs) -> LoraSaves | None:
    """What a LoRA job's frozen block keeps around its adapters (memory.LoraSaves), for PEFT's, torchtune's and LitGPT's
    LoRA layers, whose saves were measured (torchtune's and LitGPT's adapters take the model's dtype: no cast copy,
    ``k.lora_fp32_adapters`` off); None for full training and for a stack's own unmeasured LoRA layers (lightning),
    counted as before."""
    if job.lora_spec is None or k.lora_layers == "own":
        return None
    adapted = arch_mod.lora_targets(arch, job.lora_spec)
    bnb = _bitsandbytes(job, k)
    fp32_adapters = k.lora_fp32_adapters and job.precision is not Precision.FP32
    e = job.precision.compute_bytes
    copy = (4.0 if not job.precision.mixed else e) if fp32_adapters else 0.0
    # LitGPT's fused-QKV adapter (LoRAQKVLinear) keeps lora_B's output, as wide as the adapted q / k / v together, for
    # its zero_pad to the fused width (index_copy_) — which it skips when all three are adapted
    qkv = [o for n, (_, o) in adapted.items() if n in ("q_proj", "k_proj", "v_proj")]
    fused_out = e * sum(qkv) if k.lora_layers == "litgpt" and 0 < len(qkv) < 3 else 0.0
    # multi-head latent attention: q_a_proj and kv_a_proj_with_mqa read the block's normalised input as q, k, v do; the
    # up-projections their own latents (measured with PEFT on a small MiniCPM3: tests/estimate/test_lora_saves.py)
    readers = ("q_proj", "k_proj", "v_proj", "q_a_proj", "kv_a_proj_with_mqa")
    latents = tuple(adapted[n][0] for n in ("q_b_proj", "kv_b_proj") if n in adapted)
    return LoraSaves(qkv=sum(n in adapted for n in readers), o="o_proj" in adapted, latent_widths=latents,
                     gate_up=sum(n in adapted for n in ("gate_proj", "up_proj")), down="down_proj" in adapted,
                     rank=job.lora_spec.rank, input_copy_bytes=copy, adapter_out_bytes=4.0 if fp32_adapters else e,
                     base_keeps_inputs=bnb, dropout=job.lora_spec.dropout > 0, qkv_out_bytes=fused_out)  # fmt: skip


def attention_gate_bytes_per_token(job: TransformerJob, arch: ModelArch, k: Knobs) -> float:
    """What AFMoE's gated attention output keeps beyond an ungated attention (transformers 5.25 ``AfmoeAttention``:
    ``output * torch.sigmoid(gate_states)``, then ``o_proj``): the sigmoid's output, which its backward and the
    product's both keep (one storage, e a gate element); and the attention output once more — the product the output
    projection keeps in its place where the projection keeps its input, or else the attention output the product keeps
    where it is the kernel output's contiguous copy (``flash_attention: auto``), which an ungated block frees. The gate's
    input is the normed block input q, k and v read (already kept). Inside the tensor-parallel region (the gate is
    split by head, as q). Measured against a Llama of one shape with saved-tensor hooks
    (``tests/estimate/test_norm_saves.py``). Compiled, the element-wise product and sigmoid are recomputed in backward
    (min-cut rematerialisation): the gate projection's output is kept instead (e a gate element)."""
    if arch.attention_gate is None:
        return 0.0
    e, gate, out = job.precision.compute_bytes, arch_mod.attention_inner_dim(arch), arch_mod.attention_output_dim(arch)
    if k.compile:
        return e * gate
    return e * gate + (e * out if _projection_keeps_input(job, arch, k) or _kernel_output_copied(job, k) else 0.0)


def mla_latent_bytes_per_token(arch: ModelArch, precision: Precision, *, trainable: bool = True,
                               compiled: bool = False, frozen_up: bool = False) -> float:  # fmt: skip
    """What MLA keeps beyond a standard attention's Q, K, V (transformers ``DeepseekV3Attention``): for the low-rank
    query and key-value latents, what their RMSNorms keep (``q_a_layernorm``, ``kv_a_layernorm``: the fp32 copy of
    the latent, its rstd and, training, the normalised tensor — :func:`memory.norm_saved_bytes_per_token`) and the
    normalised latent the up-projection keeps (e bytes); the rotary key slice before and after rotation (2e); and
    kv_b_proj's output before it is split into the no-rope key and the value (e).  Measured against a Llama of one
    shape with saved-tensor hooks (``tests/estimate/test_norm_saves.py``): until 2026-12-07 the latents were counted
    at 2e (before and after the norm), 4 bytes short of the 8 a bf16 norm and projection keep.  A frozen 16-bit block
    (``frozen_up``: LoRA) keeps neither the normalised latents (its up-projections take no weight gradient) nor the
    rotary key slices: measured with PEFT on a small MiniCPM3 at three sets of ranks, e·(q_lora_rank + kv_lora_rank +
    2·qk_rope_head_dim) a token less (``tests/estimate/test_lora_saves.py``); a 4-bit one (QLoRA through bitsandbytes)
    keeps them, as counted for a trainable block (not measured apart)."""
    if arch.mla is None:
        return 0.0
    m, e = arch.mla, precision.compute_bytes
    kept = 0.0 if frozen_up else e
    normed = sum(norm_saved_bytes_per_token(rank, arch.norm, precision, compiled=compiled, weight_trainable=trainable)
                 + kept * rank for rank in (m.q_lora_rank or 0, m.kv_lora_rank) if rank)  # fmt: skip
    return normed + kept * 2 * m.qk_rope_head_dim + e * arch.heads * (m.qk_nope_head_dim + m.v_head_dim)


#: Stacks that train their own model code rather than transformers' modeling files: what a family's transformers class
#: keeps (its norm style, an fp32 router input) is not theirs.
_OWN_MODEL_STACKS = frozenset({Stack.TORCHTUNE, Stack.TORCHTITAN, Stack.LITGPT, Stack.LLM_FOUNDRY})


def norm_fp32_weight(arch: ModelArch, k: Knobs) -> bool:
    """Whether the job's RMSNorms multiply their weight in fp32 (:func:`memory.norm_saved_bytes_per_token`): the
    norm class of the code that runs the model. LitGPT's own ``RMSNorm`` does for every model
    (``(x_normed * weight.float()).to(dtype=dtype)``, litgpt/model.py); the stacks that run transformers' modeling
    code take the family's class (``ModelArch.norm_fp32_weight``: Gemma, gpt-oss, OLMo 2); torchtune's, torchtitan's
    and llm-foundry's own norms are counted as Llama's, as before this distinction (not read)."""
    if k.stack in _OWN_MODEL_STACKS:
        return k.stack is Stack.LITGPT
    return arch.norm_fp32_weight


def block_norm_extra_bytes_per_token(arch: ModelArch, precision: Precision, *, trainable: bool,
                                     fp32_weight: bool = False) -> float:  # fmt: skip
    """Gemma 2/3's two post-norms (four norms per block: Gemma 2 report Sec. 2) keep what a norm keeps. (Cohere's one
    norm a block is counted where the block's norms are: ``memory.layer_activation_bytes`` ``shared_norm``.)"""
    extra = max(arch.block_norms - 2, 0)
    return extra * norm_saved_bytes_per_token(arch.hidden, arch.norm, precision, weight_trainable=trainable,
                                              fp32_weight=fp32_weight, python=arch.norm_python) if extra else 0.0  # fmt: skip


def qk_norm_bytes_per_token(arch: ModelArch, precision: Precision, *, trainable: bool, compiled: bool = False,
                            fp32_weight: bool | None = None) -> float:  # fmt: skip
    """What the RMSNorms of q and k keep, per token of one block: per head (Qwen3, Gemma 3, GLM-4.5 with
    ``use_qk_norm``: one statistic a head) or over the full width (OLMoE, OLMo 2: one a token), applied to the
    projections' outputs before the rotary embedding (transformers 5.25 ``Qwen3Attention``, ``OlmoeAttention``).
    Eager with 16-bit compute each norm keeps the fp32 copy of its input — the projection's output, which nothing
    else keeps — an fp32 rstd per row and, when its weight trains, the down-cast normalised tensor the weight
    multiplies (its fp32 form where the norm multiplies in fp32: ``fp32_weight``, by default the family's, see
    :func:`norm_fp32_weight`); in fp32 the input itself and the normalised tensor; compiled or fused, the 16-bit
    input and the rstd.  Cohere's per-head LayerNorms (``qk_norm`` each_head, ``norm_python``) keep what its block
    norm keeps (:func:`memory.norm_saved_bytes_per_token`): 8 bytes an element, 4 more with the weights training,
    and an rstd a head; StableLM 2's per-head ``nn.LayerNorm``s (``qk_norm`` each_head on a LayerNorm model) keep
    their input and an fp32 mean and rstd a head.  They sit in the tensor-parallel region (q and k are split by head).  Measured against a
    Llama of one shape with saved-tensor hooks (``tests/estimate/test_norm_saves.py``)."""
    if arch.qk_norm is None:
        return 0.0
    e = precision.compute_bytes
    width = arch_mod.attention_inner_dim(arch) + arch_mod.kv_inner_dim(arch)
    rows = 2 if arch.qk_norm == "full" else arch.heads + (arch.kv_heads or arch.heads)
    if compiled:
        per_element = float(e)
    elif arch.norm_python:  # Cohere's fp32 Python LayerNorm, per head (memory.norm_saved_bytes_per_token)
        per_element = 8.0 + (4.0 if trainable else 0.0)
    elif arch.norm == "layernorm":  # StableLM 2's per-head nn.LayerNorm: its input, and a mean and an rstd a head
        return width * e + 8.0 * rows
    elif e == 2:
        wide = arch.norm_fp32_weight if fp32_weight is None else fp32_weight
        per_element = 4.0 + ((4.0 if wide else e) if trainable else 0.0)
    else:
        per_element = 4.0 + (4.0 if trainable else 0.0)
    return width * per_element + 4.0 * rows


def routed_expert_bytes(job: TransformerJob, arch: ModelArch, *, fp32_combine: bool = False,
                        act_recomputed: bool = False, fused_activation: bool = False) -> float:  # fmt: skip
    """Activations of one MoE layer's router and routed experts, for one micro-batch (beyond the layer's input).

    transformers 5 runs the experts as grouped GEMMs over the tokens sorted by expert
    (``integrations/moe.py: grouped_mm_experts_forward``, its default wherever torch's grouped GEMM can dispatch).
    Per routed token, experts that train keep: the gathered input (e·h, for the gate/up weight gradient), the
    gate/up output the activation keeps (2e·f), the activation's output and the product down_proj keeps (2e·f),
    down_proj's output that the routing-weight product keeps (e·h), the fp32 routing weight (4) and three int64
    index vectors (24): 2e·h + 4e·f + 28.  Frozen experts (LoRA) keep what the input gradient needs (autograd
    saves a matmul's input only for its weight's gradient, ``derivatives.yaml``): e·h + 3e·f + 28.  Per token the
    router keeps its fp32 softmax (4 per expert; ``softmax(..., dtype=torch.float)``), the top-k indices and
    values (12 per slot) and their fp32 sum (4).  Both measured exactly with saved-tensor hooks on transformers'
    Mixtral block (``tests/test_hf_families.py``); the eager per-expert loop (older GPUs, where grouped GEMM
    cannot dispatch) keeps one e·h more per routed token.  Without expert parallelism every routed token lives on
    the one device, so the total is exact at top_k × tokens whatever the routing imbalance (dropless routing: no
    capacity factor).

    gpt-oss's clamped SwiGLU (``MoE.clamped_swiglu``; transformers ``GptOssExperts``: gate and up clamped at
    ``swiglu_limit``, ``gate * sigmoid(alpha * gate) * (up + 1)``, biases on both projections) keeps, per routed
    token, 2e·h + 7e·f + 44 bytes with the experts training and e·h + 6e·f + 36 frozen, and its router (a top-k,
    then a softmax over the k chosen logits) nothing per expert: measured to the byte with saved-tensor hooks on
    transformers' ``GptOssMLP`` (``tests/test_hf_families.py``).

    ``fp32_combine`` (``knobs.moe_fp32_combine``, the torchtitan stack's): torchtitan's ``MoE.forward`` combines the
    experts' outputs with ``torch.bmm(top_scores, routed_output_unsorted.float())``, and bmm keeps its operands: an
    fp32 copy of every routed output (4·h) where transformers' routing-weight product keeps the 16-bit one (e·h).

    ``act_recomputed`` (Megatron's ``moe_act`` module, ``knobs.recompute_modules``): the experts' activation function
    runs under output-discarding checkpointing (``CheckpointWithoutOutput``): only its input, the gate/up output
    (2e·f), stays; what the activation keeps beyond it and its output, which down_proj keeps, are rebuilt in
    backward — 2e·f a routed token for SwiGLU (the SiLU output and the product), 5e·f for gpt-oss's clamped SwiGLU.

    ``fused_activation`` (``knobs.moe_fused_activation``): the activation — its clamps and the routing-weight product
    included — is one fused or compiled function that keeps only its input and the fp32 routing weight: Megatron-Core's
    ``WeightedSwiGLUFunction`` (``ctx.save_for_backward(input, weights)``), NeMo AutoModel's ``quick_geglu_deepep`` /
    ``swiglu_oai_deepep`` under ``torch.compile`` (the min-cut partitioner keeps the 16-bit input and the fp32
    weight: measured with saved-tensor hooks, ``tests/estimate/test_moe_fused_activation.py``).  Per routed token the
    experts then keep the gathered input (e·h, gate/up's weight gradient), the gate/up output (2e·f), the
    activation's output that down_proj keeps (e·f) and the weight (4), and — the weight applied before down_proj —
    nothing of down_proj's output (:func:`fused_expert_saved_bytes`).  The router and index vectors are counted as
    for transformers (12 a slot, 24 a routed token, 4 an expert).
    """
    if arch.moe is None:
        return 0.0
    m, e, h = arch.moe, job.precision.compute_bytes, arch.hidden
    tokens = job.seq_len * job.micro_batch
    if fused_activation:
        per_routed = fused_expert_saved_bytes(e, h, m.expert_ffn_hidden, act_recomputed=act_recomputed) + 24
        return tokens * (m.top_k * (per_routed + 12) + 4 * m.experts + 4)
    combine = (4 - e) * h if fp32_combine and job.lora_spec is None else 0.0
    f = m.expert_ffn_hidden
    if m.clamped_swiglu:
        per_routed = (2 * e * h + 7 * e * f + 44) if job.lora_spec is None else (e * h + 6 * e * f + 36)
        return tokens * m.top_k * (per_routed + combine - (5 * e * f if act_recomputed else 0.0))
    if job.lora_spec is None:
        per_routed = 2 * e * h + 4 * e * f + 28 + combine - (2 * e * f if act_recomputed else 0.0)
    else:
        per_routed = e * h + 3 * e * f + 28
    return tokens * (m.top_k * (per_routed + 12) + 4 * m.experts + 4)


def fused_expert_saved_bytes(e: float, h: int, f: int, *, act_recomputed: bool = False) -> float:
    """Bytes one routed token keeps in experts whose activation is fused or compiled and applies the fp32 routing
    weight itself (``knobs.moe_fused_activation``): the gathered input that gate/up's weight gradient needs (e·h),
    the activation's saved input — gate/up's output, 2e·f — and the weight (4), and the activation's output that
    down_proj keeps for its weight gradient (e·f).  Megatron-Core's ``moe_act`` (``CheckpointWithoutOutput``) rebuilds
    that output in backward: e·h + 2e·f + 4.  An expert bias scaled by the weight (AutoModel's ``_apply_bias``,
    ``b * p``) keeps the same weight tensor, no second copy."""
    return e * h + 2 * e * f + (0.0 if act_recomputed else e * f) + 4


def kept_routed_expert_bytes(job: TransformerJob, arch: ModelArch, k: Knobs) -> float:
    """What one MoE layer's router and routed experts keep for backward: all of :func:`routed_expert_bytes`, except
    under a PyTorch selective-checkpointing policy, which saves only the ops on its list — ``mm`` and the attention
    kernels (trainplan's own ``estimate/trace/checkpointing.SELECTIVE_SAVE_OPS``; torchtitan's ``_op_sac_save_list``
    in ``models/*/parallelize.py``) — and not ``torch._grouped_mm``, which runs the experts: they are recomputed from
    the block's input.  The router's gate is an ``mm``: ``matmul-outputs`` keeps its logits (e per expert per token);
    torchtitan force-recomputes it (``per_op_sac_force_recompute_mm_shapes_by_fqns``, default ``["moe.router.gate"]``)."""
    if arch.moe is None:
        return 0.0
    if not _keeps_matmul_outputs(job, k):
        mods = megatron_modules(job, k)
        if RecomputeModule.MOE in mods:  # the whole MoE layer checkpointed: its input (counted with the layer) stays
            return 0.0
        kept = routed_expert_bytes(job, arch, fp32_combine=k.moe_fp32_combine,
                                   act_recomputed=RecomputeModule.MOE_ACT in mods,
                                   fused_activation=k.moe_fused_activation)  # fmt: skip
        tokens = job.seq_len * job.micro_batch
        if arch.moe.shared_gate and arch.moe.shared_ffn_hidden:
            # Qwen2-MoE: sigmoid(shared_expert_gate(x)) * shared_expert(x) keeps the shared expert's output (for the
            # gate's gradient) and the sigmoid (one value a token): measured, tests/estimate/test_norm_saves.py
            kept += tokens * job.precision.compute_bytes * (arch.hidden + 1)
        if (arch.moe.router_fp32 and job.lora_spec is None and job.precision.compute_bytes < 4
                and k.stack not in _OWN_MODEL_STACKS):
            # DeepSeek-V2 / V3, GLM-4.5 in transformers: the router's fp32 copy of the layer input, kept for its
            # weight's gradient (measured on transformers' TopkRouter classes: 4h + 4E..5E + 16..52 bytes a token,
            # where Mixtral's keeps 4E + 28; the E and constant parts are left out — tests/estimate/test_norm_saves.py).
            # torchtitan's router runs its gate in the model's dtype and up-casts the scores (moe.py
            # TokenChoiceTopKRouter); the other stacks with their own models are not read
            kept += tokens * 4 * arch.hidden
        if arch.moe.output_norm:  # A.X K1's norm of the MoE output keeps what a block norm keeps
            kept += tokens * norm_saved_bytes_per_token(arch.hidden, arch.norm, job.precision,
                                                        weight_trainable=job.lora_spec is None and arch.norm_weight,
                                                        fp32_weight=norm_fp32_weight(arch, k))  # fmt: skip
        if RecomputeModule.LAYERNORM in mods:
            # Megatron's TE layer spec fuses input_layernorm into linear_qkv and a dense layer's pre_mlp_layernorm
            # into linear_fc1 (IdentityOp, which `layernorm` skips: transformer_layer.py); an MoE layer's pre-MLP
            # norm stands alone, and its output (e·h a token, outside the tensor-parallel region) is discarded
            kept -= job.seq_len * job.micro_batch * job.precision.compute_bytes * arch.hidden
        return kept
    if k.selective_recompute is SelectiveRecompute.MATMUL_OUTPUTS:
        return job.seq_len * job.micro_batch * job.precision.compute_bytes * arch.moe.experts
    return 0.0


def block_activation_bytes(job: TransformerJob, arch: ModelArch, knobs: Knobs | None = None) -> float:
    """Activations all transformer blocks keep for backward, for one micro-batch."""
    k = knobs or Knobs(stack=job.stack)
    dense = _layer_bytes(job, arch, k, kept_ffn(job, arch, k, moe=False))
    if arch.moe is None:
        per_layer, total = dense, arch.blocks * dense
    else:
        moe = _layer_bytes(job, arch, k, kept_ffn(job, arch, k, moe=True)) + kept_routed_expert_bytes(job, arch, k)
        moe_blocks = arch.moe_layers + arch.mtp_layers
        per_layer = max(moe, dense if arch.dense_mlp_layers else 0.0)
        total = arch.dense_mlp_layers * dense + moe_blocks * moe
    if _keeps_matmul_outputs(job, k):
        # PyTorch selective checkpointing: what each block keeps, plus one block's recomputed rest while its
        # backward runs (as full checkpointing holds one whole block) — an MoE block's with its routed experts
        whole = job.model_copy(update={"activation_checkpointing": Checkpointing.NONE})
        rest = _layer_bytes(whole, arch, k, arch.ffn_hidden) - dense
        if arch.moe is not None and arch.moe_layers:  # `moe` is what such a block keeps
            whole_moe = (_layer_bytes(whole, arch, k, arch.moe.shared_ffn_hidden)
                         + routed_expert_bytes(job, arch, fp32_combine=k.moe_fp32_combine,
                                               fused_activation=k.moe_fused_activation))
            rest = max(rest, whole_moe - moe)
        return total + max(0.0, rest)
    if job.activation_checkpointing is Checkpointing.FULL:
        wrapped, blocks = checkpointed_count(arch, k)
        return checkpointed_activation_bytes(
            layers=blocks,
            layer_bytes=per_layer,
            seq_len=job.seq_len,
            micro_batch=job.micro_batch,
            hidden=arch.hidden,
            precision=job.precision,
            checkpointed=wrapped,
            uncheckpointed_bytes=total,
        )
    return total + module_recompute_working(job, arch, k)


def _block_matmuls(job: TransformerJob, arch: ModelArch, ffn_hidden: int) -> list[tuple[str, int, int, bool]]:
    """The block's matmuls in the order they run: (layer, input width, output width, replicated under TP); a LoRA
    adapter's A and B follow the layer they adapt (PEFT ``lora.Linear.forward``: the base layer, then lora_B(lora_A(x)))."""
    attention = list(arch_mod.attention_shapes(arch).items())
    mlp = list(arch_mod.dense_mlp_shapes(arch, ffn_hidden).items()) if ffn_hidden else []
    adapted = arch_mod.lora_targets(arch, job.lora_spec) if job.lora_spec is not None else {}
    out: list[tuple[str, int, int, bool]] = []
    for group in (attention, mlp):
        for i, (name, (fan_in, fan_out)) in enumerate(group):
            last = i == len(group) - 1
            out.append((name, fan_in, fan_out, last))
            if name in adapted:
                rank = job.lora_spec.rank  # type: ignore[union-attr]
                out += [(f"{name}.lora_A", fan_in, rank, False), (f"{name}.lora_B", rank, fan_out, last)]
    return out


def _selective_split(job: TransformerJob, arch: ModelArch, k: Knobs, ffn_hidden: int) -> tuple[float, float]:
    """(replicated, sharded) bytes of one block under a PyTorch selective-checkpointing policy."""
    tokens = job.seq_len * job.micro_batch
    replicated, sharded = selective_saved_bytes_per_token(
        linears=[(w, full) for _, _, w, full in _block_matmuls(job, arch, ffn_hidden)], hidden=arch.hidden,
        heads=arch.heads, q_dim=arch_mod.attention_output_dim(arch), seq_len=job.seq_len,
        e=job.precision.compute_bytes, flash_attention=_flash(job, arch), selective=k.selective_recompute)  # fmt: skip
    return tokens * replicated, tokens * sharded


def selective_recomputed_params(job: TransformerJob, arch: ModelArch, k: Knobs) -> float | None:
    """Weights of the block matmuls a PyTorch selective-checkpointing policy recomputes (None: not such a policy).

    ``alternate-matmuls`` recomputes the 2nd, 4th, 6th … matmul of each block (memory.selective_saved_bytes_per_token):
    k, the output projection and up in a SwiGLU Llama block.  An MoE block's routed experts are grouped GEMMs, which
    neither policy saves (:func:`kept_routed_expert_bytes`): every token's top-k experts run again, the weights of
    top_k experts per routed layer."""
    if not _keeps_matmul_outputs(job, k):
        return None
    experts = 0.0
    if arch.moe is not None:
        per_expert = sum(i * o for _, i, o in arch_mod.expert_tensor_shapes(arch).values())
        experts = float(arch.moe.top_k * per_expert * (arch.moe_layers + arch.mtp_layers))
    if k.selective_recompute is SelectiveRecompute.MATMUL_OUTPUTS:
        return experts
    f = arch.moe.shared_ffn_hidden if arch.moe is not None else arch.ffn_hidden
    per_block = sum(fan_in * fan_out for _, fan_in, fan_out, _ in _block_matmuls(job, arch, f)[1::2])
    return float(per_block * (arch.blocks + arch.mtp_layers)) + experts


def _keeps_matmul_outputs(job: TransformerJob, k: Knobs) -> bool:
    """Selective checkpointing by a PyTorch policy (matmul outputs kept), not Korthikanti's attention core."""
    return (job.activation_checkpointing is Checkpointing.SELECTIVE
            and k.selective_recompute is not SelectiveRecompute.ATTENTION_CORE)


def final_norm_bytes_per_token(job: TransformerJob, arch: ModelArch, k: Knobs) -> float:
    """What the final norm keeps a token (:func:`memory.norm_saved_bytes_per_token`), in the model's norm style."""
    return norm_saved_bytes_per_token(arch.hidden, arch.norm, job.precision, compiled=k.compile,
                                      weight_trainable=job.lora_spec is None and arch.norm_weight,
                                      fp32_weight=norm_fp32_weight(arch, k), python=arch.norm_python)  # fmt: skip


def head_activation_bytes(job: TransformerJob, arch: ModelArch, knobs: Knobs | None = None) -> float:
    """The final norm, the output projection's input, and the logits and loss as the loss is computed; and nanochat's
    norm of the embedding output (``embedding_norm``: what a frozen norm keeps, once a micro-batch)."""
    k = knobs or Knobs(stack=job.stack)
    tokens = job.seq_len * job.micro_batch
    final_norm = final_norm_bytes_per_token(job, arch, k)
    head = tokens * (final_norm * (2 if arch.embedding_norm else 1) + arch.hidden * job.precision.compute_bytes)
    if arch.has_lm_head:
        head += logits_bytes(seq_len=job.seq_len, micro_batch=job.micro_batch, vocab=arch.vocab, precision=job.precision,
                             hidden=arch.hidden, loss=k.loss, chunks=k.loss_chunks, compiled=k.compile_loss,
                             upcast=k.loss_upcast)  # fmt: skip
        if arch.final_logit_softcap and not k.compile_loss:
            # Gemma 2: logits = cap · tanh(logits / cap); tanh keeps its output for backward (derivatives.yaml)
            head += tokens * arch.vocab * job.precision.compute_bytes
    return head


def activation_bytes(job: TransformerJob, arch: ModelArch, knobs: Knobs | None = None) -> float:
    """Activations of all blocks plus the head, for one micro-batch (before any offloading)."""
    return block_activation_bytes(job, arch, knobs) + head_activation_bytes(job, arch, knobs)


def device_and_host_activation_bytes(job: TransformerJob, arch: ModelArch, knobs: Knobs) -> tuple[float, float]:
    """(on the device, on the host), with activation offloading when the knobs say so.

    Offloading (torchtune ``OffloadActivations``): saved tensors move to pinned host memory as they are
    saved and return as backward needs them, on a side stream; the device keeps the head (logits and loss
    are needed at once) and about two blocks in flight — the one computed and the one being copied.
    """
    blocks = block_activation_bytes(job, arch, knobs)
    head = head_activation_bytes(job, arch, knobs)
    if not knobs.activation_offloading:
        return blocks + head, 0.0
    in_flight = min(blocks, 2 * blocks / max(1, arch.blocks))
    return head + in_flight, blocks - in_flight


def attention_flops_width(arch: ModelArch, seq_len: int) -> float:
    """The width w in the 4·s·w per token per layer of score and value FLOPs (PaLM App. B), averaged over layers.

    A sliding-window layer (Mistral; Gemma 2/3 local layers; gpt-oss) attends to min(s, window) keys, so its
    share is scaled by min(s, window) / s (Beltagy et al. 2020, "Longformer", Sec. 3: O(n·w)); the causal
    halving of a fused kernel is then applied to every layer alike.
    """
    width = arch_mod.attention_inner_dim(arch)
    if not arch.sliding_layers or arch.sliding_window is None:
        return float(width)
    full = arch.layers - arch.sliding_layers
    local = arch.sliding_layers * min(seq_len, arch.sliding_window) / seq_len
    return width * (full + local) / arch.layers


def autocast_cast_bytes(job: TransformerJob, m: TransformerModel) -> tuple[float, float]:
    """HBM bytes (forward, backward) of autocast's weight casts in one micro-batch.

    Under bf16 / fp16 mixed precision the matmul weights are fp32 and autocast casts each to 16 bits at its first use
    in the autocast region (torch.amp docs: the cast is cached until the region exits): read 4, write 2 bytes per
    weight in forward; a full-checkpointing recompute runs in a new region and casts again (priced with the backward
    by ``training_step_flops``).  Backward turns each 16-bit weight gradient into the fp32 ``.grad`` through the
    cast's backward (``_to_copy``: read 2, write 4).  A frozen base kept in fp32 (knob ``frozen_weights_fp32``) is cast
    the same way in forward and gets no gradient.
    """
    if not job.precision.mixed or job.precision is Precision.FP8:
        return 0.0, 0.0
    arch = m.arch
    frozen_fp32 = m.frozen_fp32_bytes / 4.0  # weights
    if job.method is Method.FULL:
        weights = m.counts.block_linear + (arch.vocab * arch.hidden if arch.has_lm_head else 0)
        return 6.0 * weights, 6.0 * weights
    return 6.0 * frozen_fp32, 0.0


def fp8_gemm_terms(job: TransformerJob, arch: ModelArch) -> tuple[float, tuple[float, float]]:
    """Precision fp8: the block linear weights whose GEMMs run in FP8, and the bytes (forward, backward) of the
    casts that feed them, for one micro-batch.

    torchao's ``Float8Linear`` (torchtitan's float8 converter; dynamic tensor-wise scaling) casts each GEMM operand
    in two passes — an amax reduction over the 16-bit tensor, then scale-and-cast to 1 byte (``hp_tensor_to_float8_dynamic``:
    ``tensor_to_scale`` then ``hp_tensor_and_scale_to_float8``) — so 2e + 1 bytes per element: forward, each linear's
    input and weight; backward, the output gradient twice (for the input and the weight gradient) and the input and
    weight again (``matmul_with_hp_or_float8_args.backward`` re-casts the saved 16-bit tensors).  It saves its 16-bit
    input and weight for backward (``ctx.save_for_backward(input_hp, weight_hp_t)``), so activation memory is bf16's.
    Dense decoders only: MoE experts (grouped GEMMs) and encoder models are refused.
    """
    if job.precision is not Precision.FP8:
        return 0.0, (0.0, 0.0)
    if arch.moe is not None or arch.arch != "decoder":
        raise SpecError("precision fp8 is planned for dense decoder models (their nn.Linear GEMMs); mixture-of-experts "
                        "and encoder models train in bf16 here", field="precision")  # fmt: skip
    shapes = arch_mod.linear_shapes(arch).values()
    ins, outs = sum(i for i, _ in shapes), sum(o for _, o in shapes)
    weights = sum(i * o for i, o in shapes) * arch.blocks
    tokens, per = job.seq_len * job.micro_batch, 2 * job.precision.compute_bytes + 1
    forward = per * (tokens * ins * arch.blocks + weights)
    backward = per * (tokens * (2 * outs + ins) * arch.blocks + weights)
    return float(weights), (forward, backward)


def recompute_share(job: TransformerJob, arch: ModelArch, k: Knobs) -> float:
    """The share of the blocks full checkpointing recomputes (1 unless knobs.checkpoint_fraction says fewer)."""
    if job.activation_checkpointing is not Checkpointing.FULL:
        return 1.0
    wrapped, blocks = checkpointed_count(arch, k)
    return wrapped / blocks if blocks else 1.0


def model_split(job: TransformerJob, m: TransformerModel, knobs: Knobs) -> ModelSplit | None:
    """What tensor / pipeline / context / expert parallelism divides (estimate/parallel.py), for full training of
    a decoder-only model; None otherwise (encoder-decoder stacks and adapters are planned data parallel only)."""
    arch = m.arch
    if arch.arch != "decoder" or job.method is not Method.FULL or knobs.activation_offloading:
        return None
    replicated, sharded = layer_split(job, arch, knobs, kept_ffn(job, arch, knobs, moe=False))
    moe_sharded, expert = sharded, 0.0
    if arch.moe is not None:
        _, moe_sharded = layer_split(job, arch, knobs, kept_ffn(job, arch, knobs, moe=True))
        expert = kept_routed_expert_bytes(job, arch, knobs)
    tokens, e = job.seq_len * job.micro_batch, job.precision.compute_bytes
    head = head_activation_bytes(job, arch, knobs)
    # the final norm (and nanochat's embedding norm) and the head's input stay whole under tensor parallelism
    norms = final_norm_bytes_per_token(job, arch, knobs) * (2 if arch.embedding_norm else 1)  # full method: no LoRA
    head_replicated = tokens * (norms + arch.hidden * e)
    c = m.counts
    vocab_params = arch.vocab * arch.hidden
    return ModelSplit(
        layers=arch.blocks,
        extra_last_layers=arch.mtp_layers,
        moe_layers=arch.moe_layers if arch.moe is not None else 0,
        heads=arch.heads,
        kv_heads=arch.kv_heads or arch.heads,
        seq_len=job.seq_len,
        tokens=tokens,
        hidden=arch.hidden,
        kv_dim=arch_mod.kv_inner_dim(arch),
        compute_bytes=e,
        experts=arch.moe.experts if arch.moe is not None else 0,
        top_k=arch.moe.top_k if arch.moe is not None else 0,
        block_params=float(c.block_linear + c.block_other - c.routed_experts),
        expert_params=float(c.routed_experts),
        embedding_params=float(c.embedding),
        head_params=float(c.lm_head or (vocab_params if arch.has_lm_head else 0)),
        tied=c.lm_head == 0,
        replicated=replicated,
        sharded=sharded,
        moe_sharded=moe_sharded,
        expert_activations=expert,
        block_input=tokens * arch.hidden * e,
        full_recompute=job.activation_checkpointing is Checkpointing.FULL,
        recompute_share=recompute_share(job, arch, knobs),
        head_replicated=min(head, head_replicated),
        head_sharded=max(0.0, head - head_replicated),
        # Megatron's first stage also keeps the int64 input ids and, with dropout, the embedding's 1-byte mask
        # (theoretical_memory_usage.py compute_activation_memory: 8·s·b and s·b·h per micro-batch in flight)
        embedding_activations=tokens * (8 + (arch.hidden if arch.dropout > 0 else 0)),
        recompute_working=module_recompute_working(job, arch, knobs),
        first_stage_less=knobs.pipeline_first_stage_less_layers,
        last_stage_less=knobs.pipeline_last_stage_less_layers,
    )


def transformer_profile(job: TransformerJob, catalog: Catalog | None = None, *, model: TransformerModel | None = None) -> StepProfile:
    """One micro-batch step of ``job`` from the formulas: parameters, FLOPs, memory by category."""
    cat = catalog or get_catalog()
    m = model or resolve_transformer(job, cat)
    arch = m.arch
    knobs = effective_knobs(job, cat)
    fp8_params, fp8_casts = fp8_gemm_terms(job, arch)
    amp_f, amp_b = autocast_cast_bytes(job, m)
    flops = training_step_flops(
        tokens=job.seq_len * job.micro_batch,
        matmul_params=m.counts.matmul_per_token,
        trainable_matmul_params=m.trainable_matmul,
        adapter_params=m.adapter_params,
        layers=arch.blocks + arch.mtp_layers,
        seq_len=job.seq_len,
        attn_dim=attention_flops_width(arch, job.seq_len),
        checkpointing=job.activation_checkpointing,
        recompute_share=recompute_share(job, arch, knobs),
        lm_head_params=arch.vocab * arch.hidden if arch.has_lm_head else 0,
        # a mask in hand (DeepSeek Sparse Attention's) leaves SDPA's fused kernel no causal blocks to skip
        causal_fused_attention=_flash(job, arch) and arch.arch == "decoder" and arch.indexer is None,
        fused_attention=_flash(job, arch) and arch.arch == "decoder",
        block_bytes_per_token=memory_bound_bytes_per_token(arch, job.precision, seq_len=job.seq_len,
                                                           eager_attention=not _flash(job, arch),
                                                           fp32_softmax=_fp32_scores(job, arch, knobs)),  # fmt: skip
        fp8_matmul_params=fp8_params,
        fp8_cast_bytes=fp8_casts,
        amp_cast_bytes=(amp_f, amp_b),
        selective_matmul_params=selective_recomputed_params(job, arch, knobs),
        core_recomputed=RecomputeModule.CORE_ATTN in knobs.recompute_modules,
        module_recompute_params=module_recomputed_params(job, arch, knobs),
        forward_only=indexer_forward_flops(job, arch),
    )
    # AMP autocast caches a 16-bit copy of every fp32 matmul weight it casts (torch.amp docs); frozen
    # LoRA/QLoRA bases are stored in 16 (or 4) bits already, so only full training makes them.
    matmul_weights = m.counts.block_linear + arch.vocab * arch.hidden
    autocast = 2.0 * matmul_weights if job.precision.mixed and job.method is Method.FULL else 0.0
    if m.frozen_fp32_bytes and job.precision.mixed:
        # a frozen fp32 base is cast at each use and the matmul keeps the cast (memory.frozen_weight_cast_bytes);
        # bitsandbytes' 4-bit layers dequantise instead (forward_temporaries); the adapters' casts are cached
        frozen_matmul = m.counts.block_linear if job.method is Method.LORA else 0.0
        autocast = frozen_weight_cast_bytes(frozen_matmul, blocks=arch.blocks, checkpointing=job.activation_checkpointing,
                                            head_params=arch.vocab * arch.hidden if arch.has_lm_head else 0.0)
        autocast += 2.0 * m.adapter_params
    device_acts, host_acts = device_and_host_activation_bytes(job, arch, knobs)
    largest_linear = arch_mod.largest_linear_params(arch)
    # a fused optimizer steps tensor by tensor in place, and so does one that steps inside backward
    foreach_optimizer = not (knobs.fused_optimizer or knobs.optimizer_in_backward)
    foreach = optimizer_foreach_temporary_bytes(m.trainable, job.optimizer, job.precision) if foreach_optimizer else 0.0
    if job.optimizer is Optimizer.MUON:
        foreach = muon_temporary_bytes(list(m.muon_matrices), m.trainable - m.muon_params, job.precision,
                                       foreach=foreach_optimizer)  # fmt: skip
    return StepProfile(
        source=ProfileSource.ANALYTIC,
        params=Params(
            total=m.total,
            trainable=m.trainable,
            frozen_bytes=m.frozen_bytes,
            shaped_state_elems=m.state_elems_per_param,
            optimizer_flops=m.optimizer_flops,
            largest_block=arch_mod.largest_block_params(arch),
            largest_tensor=max(largest_linear, arch.vocab * arch.hidden) if job.method is Method.FULL else largest_linear,
            frozen_fp32_bytes=m.frozen_fp32_bytes,
        ),
        flops=flops,
        memory=StepMemory(
            activations=device_acts,
            autocast_copies=autocast,
            optimizer_temporaries=foreach,
            forward_temporaries=(dequantized_weight_bytes(largest_linear) if job.method is Method.QLORA else 0.0)
            + indexer_transient_bytes(job, arch),
            host_activations=host_acts,
            transient_gradients=knobs.optimizer_in_backward,
            pageable_optimizer_state=knobs.paged_optimizer,
            # LoRA's frozen base weights share each block's FSDP unit with the adapters (16-bit storage; a
            # 4-bit QLoRA base cannot take gradients); the composer applies it to fsdp only (memory.model_state_bytes)
            frozen_gradient_bytes=(m.counts.block_linear + m.counts.block_other) * m.frozen_bytes / m.counts.total
            if job.method is Method.LORA and knobs.frozen_weight_gradients else 0.0,
            unsharded_accumulation=knobs.unsharded_accumulation,
        ),
        items_per_sample=job.seq_len,
        throughput_unit="tokens_per_s",
        mfu_width=arch.hidden,
        notes=knobs.notes + _attention_notes(job, arch) + _checkpoint_notes(job, arch, knobs),
        engines=knobs.engines,
        stack=job.stack.value,
        split=model_split(job, m, knobs),
        foreach_optimizer=foreach_optimizer,
        tf32_matmul=knobs.tf32_matmul,
        fp8_gather_fraction=fp8_params / m.counts.total if knobs.fp8_all_gather and m.counts.total else 0.0,
    )


def estimate_transformer(
    job: TransformerJob,
    hw: Hardware,
    strategy: Strategy,
    catalog: Catalog,
    *,
    model: TransformerModel | None = None,
    efficiency: float | None = None,
) -> Estimate:
    """Memory, time and cost of ``job`` on ``hw`` with ``strategy``, from the formulas.

    ``efficiency`` overrides the default MFU (a calibration from a measured run).
    """
    return compose(job, transformer_profile(job, catalog, model=model), hw, strategy, catalog, efficiency=efficiency)
