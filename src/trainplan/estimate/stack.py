"""The knobs in force for a job: its stack's defaults (catalog/data/stacks.yaml) overridden by explicit knobs.

A knob is something the training code does that changes what a step allocates
or computes: how the loss treats the vocabulary, ``torch.compile``, the
optimizer stepping inside backward, activations offloaded to the host, a fused
or paged optimizer, how FSDP keeps gradients (unsharded while accumulating;
for frozen weights that share a unit with trainable ones), the dtype a frozen LoRA base is stored in under
mixed precision, whether the loss up-casts 16-bit logits, and Triton kernels (Liger, Unsloth) in place of
eager norms and MLPs.  Both profile producers read the same :class:`Knobs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainplan.catalog import Catalog
from trainplan.errors import SpecError
from trainplan.spec import (Checkpointing, FusedKernels, LossImpl, Method, Optimizer, Precision, RecomputeModule, SelectiveRecompute,
                            Stack, TorchJob, TransformerJob)  # fmt: skip
from trainplan.strategies import Engine

KNOB_NAMES = ("loss", "loss_chunks", "loss_chunk_tokens", "compile", "optimizer_in_backward", "activation_offloading",
              "fused_optimizer", "paged_optimizer", "unsharded_accumulation", "frozen_weight_gradients",
              "frozen_weights_fp32", "loss_upcast", "fused_kernels", "qlora_fp32_params", "tf32_matmul", "fp8_all_gather",
              "selective_recompute", "moe_fp32_combine", "moe_fused_activation", "compile_loss",
              "recompute_modules", "lora_fp32_adapters", "pipeline_first_stage_less_layers", "pipeline_last_stage_less_layers",
              "checkpoint_fraction")  # fmt: skip
_ENUMS = (LossImpl, FusedKernels, SelectiveRecompute)
# whose LoRA layers a stack trains (stacks.yaml lora_implementation): the three measured, or its own (counted as before)
LORA_IMPLEMENTATIONS = ("peft", "torchtune", "litgpt", "own")
# Megatron-Core's default recompute_modules (TransformerConfig: default ["core_attn"])
MEGATRON_DEFAULT_MODULES = frozenset({RecomputeModule.CORE_ATTN})


@dataclass(frozen=True)
class Knobs:
    """The effective settings of one job (stack defaults, explicit knobs winning)."""

    stack: Stack
    loss: LossImpl = LossImpl.FULL
    loss_chunks: int = 1  # chunks the loss is computed in (1 unless chunked)
    compile: bool = False
    optimizer_in_backward: bool = False
    activation_offloading: bool = False
    fused_optimizer: bool = False
    paged_optimizer: bool = False
    unsharded_accumulation: bool = False  # FSDP: gradient accumulation without sync keeps gradients unsharded
    frozen_weight_gradients: bool = False  # FSDP: frozen weights in a unit with trainable ones get gradients too
    frozen_weights_fp32: bool = False  # mixed precision: the frozen base stays fp32, autocast casts it per matmul
    loss_upcast: bool = True  # the loss up-casts 16-bit logits to fp32 (without autocast too)
    qlora_fp32_params: bool = False  # QLoRA: the unquantised parameters are cast to fp32 (PEFT)
    fused_kernels: FusedKernels = FusedKernels.NONE
    tf32_matmul: bool = False  # fp32 matmuls on TF32 tensor cores (off in PyTorch by default)
    fp8_all_gather: bool = False  # precision fp8 under FSDP: the float8 linears' weights all-gathered in FP8
    selective_recompute: SelectiveRecompute = SelectiveRecompute.ATTENTION_CORE  # what `selective` keeps
    moe_fp32_combine: bool = False  # MoE experts' outputs combined over an fp32 copy (torchtitan)
    moe_fused_activation: bool = False  # MoE experts' activation fused or compiled: keeps only its input (AutoModel)
    compile_loss: bool = False  # the loss is compiled with the model (only meaningful with compile)
    # selective checkpointing Megatron-Core's way (attention-core): the submodules each layer recomputes
    recompute_modules: frozenset[RecomputeModule] = MEGATRON_DEFAULT_MODULES
    lora_fp32_adapters: bool = False  # PEFT's fp32 adapters beside a 16-bit base (their input copies)
    lora_layers: str = "own"  # whose LoRA layers: peft, torchtune, litgpt (measured) or own (stacks.yaml)
    expanded_kv: bool = False  # grouped-query K and V copied out to every head before SDPA (stacks.yaml)
    fused_qkv_view: bool = False  # without grouped queries V is a view into the fused QKV output SDPA keeps (stacks.yaml)
    # blocks' worth of a pipeline split the embedding and the output layer take (estimate/parallel.py chunk_layers)
    pipeline_first_stage_less_layers: int = 0
    pipeline_last_stage_less_layers: int = 0
    checkpoint_fraction: float = 1.0  # activation_checkpointing: full — the share of the blocks checkpointed
    engines: tuple[Engine, ...] = (Engine.TORCH, Engine.FSDP, Engine.DEEPSPEED)
    notes: tuple[str, ...] = ()  # which explicit knob overrode which stack default


def _chunks(loss: LossImpl, chunks: int | None, chunk_tokens: int | None, seq_len: int) -> int:
    if loss is not LossImpl.CHUNKED:
        return 1
    if chunk_tokens:
        return max(1, math.ceil(seq_len / chunk_tokens))
    return chunks or 1


def effective_knobs(job: TorchJob | TransformerJob, catalog: Catalog) -> Knobs:
    """The stack's defaults with the job's explicit knobs on top; each override is named in ``notes``.

    Raises :class:`SpecError` for knobs that cannot hold together.
    """
    entry = catalog.stacks.get(job.stack.value)
    if entry is None:
        raise SpecError(f"no defaults for stack {job.stack.value!r} in the catalog's stacks.yaml", field="stack")
    if entry.get("lora_implementation", "own") not in LORA_IMPLEMENTATIONS:
        # an unknown value would be counted as if its LoRA layers had been measured
        raise SpecError(f"stacks.yaml: {job.stack.value}'s lora_implementation {entry['lora_implementation']!r} is not one of "
                        f"{', '.join(LORA_IMPLEMENTATIONS)}", field="stack")  # fmt: skip
    defaults = dict(entry["knobs"])
    explicit = {k: v for k, v in job.knobs.model_dump().items() if v is not None}
    notes = []
    for key, value in explicit.items():
        default = defaults.get(key)
        shown = value.value if isinstance(value, _ENUMS) else value
        if default is not None and str(default).lower() != str(shown).lower():
            notes.append(f"knobs.{key}: {shown} overrides {job.stack.value}'s default ({default})")
    merged = {**defaults, **{k: (v.value if isinstance(v, _ENUMS) else v) for k, v in explicit.items()}}
    if "loss_chunks" in explicit and "loss_chunk_tokens" not in explicit:
        merged.pop("loss_chunk_tokens", None)
    if "loss_chunk_tokens" in explicit and "loss_chunks" not in explicit:
        merged.pop("loss_chunks", None)
    kernels = FusedKernels(merged.get("fused_kernels", "none"))
    if kernels is not FusedKernels.NONE and "loss" not in explicit:
        # the kernels' own loss: Liger's fused linear cross-entropy (the Trainer's use_liger_kernel turns it on),
        # Unsloth's cross-entropy kernel over the 16-bit logits
        merged["loss"] = LossImpl.FUSED_LINEAR.value if kernels is FusedKernels.LIGER else LossImpl.FUSED.value
    loss = LossImpl(merged.get("loss", "full"))
    if isinstance(job, TorchJob) and "loss" in explicit:
        raise SpecError("applies to language-model (kind: transformer) jobs; a torch job's loss is its `loss:` function",
                        field="knobs.loss")  # fmt: skip
    for key in ("frozen_weights_fp32", "loss_upcast", "fused_kernels", "qlora_fp32_params", "selective_recompute",
                "moe_fp32_combine", "moe_fused_activation", "compile_loss", "recompute_modules", "lora_fp32_adapters",
                "pipeline_first_stage_less_layers", "pipeline_last_stage_less_layers", "checkpoint_fraction"):
        if isinstance(job, TorchJob) and key in explicit:
            raise SpecError("applies to language-model (kind: transformer) jobs; a traced model keeps what its own code "
                            "keeps", field=f"knobs.{key}")  # fmt: skip
    modules = merged.get("recompute_modules")
    if modules is not None and isinstance(job, TransformerJob):
        if job.activation_checkpointing is not Checkpointing.SELECTIVE:
            raise SpecError("names the submodules Megatron-Core's selective checkpointing recomputes: it needs "
                            "activation_checkpointing: selective", field="knobs.recompute_modules")  # fmt: skip
        policy = explicit.get("selective_recompute")
        if policy is not None and SelectiveRecompute(policy) is not SelectiveRecompute.ATTENTION_CORE:
            raise SpecError(f"is Megatron-Core's selective granularity (attention-core); it cannot go with "
                            f"knobs.selective_recompute: {SelectiveRecompute(policy).value}",
                            field="knobs.recompute_modules")  # fmt: skip
        if merged.get("selective_recompute") != SelectiveRecompute.ATTENTION_CORE.value:
            notes.append(f"knobs.recompute_modules: Megatron-Core's selective granularity overrides "
                         f"{job.stack.value}'s selective_recompute ({merged.get('selective_recompute')})")
            merged["selective_recompute"] = SelectiveRecompute.ATTENTION_CORE.value
    if "lora_fp32_adapters" in explicit and isinstance(job, TransformerJob):
        if job.lora_spec is None:
            raise SpecError("says what dtype PEFT gives LoRA adapters: it applies to method lora or qlora",
                            field="knobs.lora_fp32_adapters")  # fmt: skip
        if entry.get("lora_implementation") != "peft":
            raise SpecError(f"says what dtype PEFT gives LoRA adapters; {job.stack.value}'s LoRA layers are its own, "
                            "not PEFT's", field="knobs.lora_fp32_adapters")  # fmt: skip
    if (merged.get("checkpoint_fraction") or 1.0) < 1.0 and isinstance(job, TransformerJob):  # 1: every block, the default
        if job.activation_checkpointing is not Checkpointing.FULL:
            raise SpecError("is the share of the blocks full checkpointing recomputes: it needs activation_checkpointing: "
                            "full", field="knobs.checkpoint_fraction")  # fmt: skip
        if job.method is not Method.FULL:
            raise SpecError("checkpoints a share of the blocks in full training (torchtitan, Megatron-Core); LoRA and "
                            "QLoRA checkpoint every block or none", field="knobs.checkpoint_fraction")  # fmt: skip
    if merged.get("fp8_all_gather") and job.precision is not Precision.FP8:
        raise SpecError("all-gathers the float8 linears' weights in FP8: it needs precision: fp8", field="knobs.fp8_all_gather")
    if "compile_loss" in explicit and not merged.get("compile"):
        raise SpecError("says whether the loss is compiled with the model: it needs knobs.compile: true",
                        field="knobs.compile_loss")  # fmt: skip
    if merged.get("paged_optimizer") and job.optimizer is not Optimizer.ADAM8BIT:
        raise SpecError("paged optimizers are bitsandbytes' 8-bit AdamW: set optimizer: adam8bit", field="knobs.paged_optimizer")
    seq_len = job.seq_len if isinstance(job, TransformerJob) else 1
    return Knobs(
        stack=job.stack,
        loss=loss,
        loss_chunks=_chunks(loss, merged.get("loss_chunks"), merged.get("loss_chunk_tokens"), seq_len),
        compile=bool(merged.get("compile", False)),
        optimizer_in_backward=bool(merged.get("optimizer_in_backward", False)),
        activation_offloading=bool(merged.get("activation_offloading", False)),
        fused_optimizer=bool(merged.get("fused_optimizer", False)),
        paged_optimizer=bool(merged.get("paged_optimizer", False)),
        unsharded_accumulation=bool(merged.get("unsharded_accumulation", False)),
        frozen_weight_gradients=bool(merged.get("frozen_weight_gradients", False)),
        frozen_weights_fp32=bool(merged.get("frozen_weights_fp32", False)),
        loss_upcast=bool(merged.get("loss_upcast", True)),
        qlora_fp32_params=bool(merged.get("qlora_fp32_params", False)),
        fused_kernels=kernels,
        tf32_matmul=bool(merged.get("tf32_matmul", False)),
        fp8_all_gather=bool(merged.get("fp8_all_gather", False)),
        selective_recompute=SelectiveRecompute(merged.get("selective_recompute", "attention-core")),
        moe_fp32_combine=bool(merged.get("moe_fp32_combine", False)),
        moe_fused_activation=bool(merged.get("moe_fused_activation", False)),
        # with compile on: the stack's rule (stacks.yaml), else compiled with the model
        compile_loss=bool(merged.get("compile", False)) and bool(merged.get("compile_loss", True)),
        recompute_modules=MEGATRON_DEFAULT_MODULES if modules is None else frozenset(RecomputeModule(m) for m in modules),
        lora_fp32_adapters=bool(merged.get("lora_fp32_adapters", False)),
        lora_layers=str(entry.get("lora_implementation", "own")),
        expanded_kv=bool(entry.get("attention_expands_kv", False)),
        fused_qkv_view=bool(entry.get("attention_keeps_fused_qkv", False)),
        pipeline_first_stage_less_layers=int(merged.get("pipeline_first_stage_less_layers", 0)),
        pipeline_last_stage_less_layers=int(merged.get("pipeline_last_stage_less_layers", 0)),
        checkpoint_fraction=float(merged.get("checkpoint_fraction") or 1.0),
        engines=tuple(Engine(e) for e in entry.get("engines", [e.value for e in Engine])),
        notes=tuple(notes),
    )
