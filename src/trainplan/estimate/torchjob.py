"""Step profiles from a trace of the real model (``kind: torch`` jobs, and ``--trace`` for transformers).

The trace (``estimate/trace/``) gives the numbers of one single-device training
step: parameters, FLOPs, model states and the peak of activations and
temporaries.  They become a :class:`~trainplan.estimate.profile.StepProfile`,
and ``compose.py`` applies hardware and strategy to it exactly as it does to
the analytic profile (ZeRO stages, FSDP, offload, LoRA, step time, cost).
"""

from __future__ import annotations

from typing import Any

from trainplan.catalog import Catalog, get_catalog, resolve_model
from trainplan.estimate import architecture as arch_mod
from trainplan.estimate.compose import compose
from trainplan.estimate.compute import KernelSplit, StepFlops
from trainplan.estimate.memory import GIB, weight_bytes_per_param
from trainplan.estimate.profile import EagerOps, Params, ProfileSource, StepMemory, StepProfile
from trainplan.estimate.result import Estimate, Hardware
from trainplan.estimate.stack import Knobs, effective_knobs
from trainplan.estimate.transformer import check_moe_lora_targets
from trainplan.model import ModelArch, UnsupportedArchitecture, hf_config
from trainplan.spec import LossImpl, Method, Optimizer, Precision, TorchJob, TransformerJob
from trainplan.strategies import Engine, Strategy


def _largest_child_params(module: Any) -> int:
    """Parameters of the largest repeated unit: the biggest leaf-most child holding ≥ 1/64 of the model (FSDP/ZeRO-3 gather unit)."""
    total = sum(p.numel() for p in module.parameters())
    best = 0
    for child in module.modules():
        if child is module:
            continue
        n = sum(p.numel() for p in child.parameters())
        if n <= total // 2:
            best = max(best, n)
    return best or total


def _state_elem_bytes(job: TorchJob | TransformerJob) -> float:
    """Bytes of one optimizer-state element as PyTorch keeps it: the parameter's dtype, 1 for 8-bit states."""
    if job.optimizer is Optimizer.ADAM8BIT:
        return 1.0
    return 2.0 if job.precision is Precision.BF16_PURE else 4.0


# Knobs that are not eager PyTorch: the trace cannot run them, so a traced profile shows eager memory for them.
UNTRACED_KNOBS = ("compile", "activation_offloading")


def _kernel_split(result: Any) -> KernelSplit:
    """What of a traced step runs at the attention kernel's rate or at memory speed on a GPU (a ``kind: torch``
    model has no transformer width for the MFU curve): the fused attention kernels' FLOPs and the bytes the
    memory-bound operators read and write, one kernel each in eager PyTorch (norms, activations, adds, pooling:
    Ivanov et al. 2021, "Data Movement Is All You Need"), as the trace tallied them (trace/flops.py)."""
    return KernelSplit(attention_forward=float(result.attention_flops_forward),
                       attention_backward=float(result.attention_flops_backward),
                       bytes_forward=float(result.memory_bytes_forward),
                       bytes_backward=float(result.memory_bytes_backward))  # fmt: skip


def _conv_dominated(result: Any) -> bool:
    """Convolutions do at least half of the traced step's FLOPs.  cuDNN convolutions reach well under the GEMM
    efficiency the split prices matmuls at (ResNet-50 mixed precision: about 20% of an A100's peak for the whole
    step, NVIDIA DeepLearningExamples — ``mfu_traced_default``), and no published per-convolution efficiency was
    found, so a conv-dominated model keeps that whole-step default (docs/models.md, the validation table)."""
    total = result.flops_forward + result.flops_backward + result.flops_recompute
    return total > 0 and getattr(result, "conv_flops_step", 0) >= 0.5 * total


def profile_from_trace(job: TorchJob | TransformerJob, result: Any, largest: int, *, mfu_width: int | None,
                       knobs: Knobs | None = None, largest_tensor: int = 0) -> StepProfile:  # fmt: skip
    """The traced single-device step as a :class:`StepProfile` (plain PyTorch conventions, as traced).

    The stack's knobs apply as far as the trace can honour them: a chunked loss is traced as such (above);
    a fused optimizer, or one stepping inside backward, makes no foreach temporaries and (in backward) holds
    no whole gradient; a paged optimizer's state pages out; compile, activation offloading and fused loss
    kernels are not eager PyTorch and are named in the notes as not traced.
    """
    k = knobs or Knobs(stack=job.stack)
    foreach_optimizer = not (k.fused_optimizer or k.optimizer_in_backward)
    untraced = [name for name in UNTRACED_KNOBS if getattr(k, name)]
    if k.loss in (LossImpl.FUSED, LossImpl.FUSED_LINEAR):
        untraced.append(f"loss {k.loss.value}")
    trainable = result.trainable_params
    frozen_bytes = max(0.0, result.state_bytes.parameters - trainable * weight_bytes_per_param(job.precision, Engine.TORCH))
    # The optimizer state the trace allocated, per trainable parameter: exact for shape-dependent
    # optimizers (Adafactor's factored moments, Muon beside AdamW), which have no fixed count.
    factored = 0.0
    if job.optimizer in (Optimizer.ADAFACTOR, Optimizer.MUON) and trainable:
        factored = result.state_bytes.optimizer / (trainable * _state_elem_bytes(job))
    # The traced activations include the 16-bit weight copies AMP's autocast caches over fp32
    # weights; they are split out so that engines holding 16-bit weights (DeepSpeed, FSDP) drop them.
    lora = isinstance(job, TransformerJob) and job.lora_spec is not None
    autocast = 2.0 * trainable if job.precision.mixed and not lora else 0.0
    activations = float(result.activation_peak_bytes)
    tokens = job.seq_len if isinstance(job, TransformerJob) else 1
    summary = {
        "params": result.params,
        "trainable_params": trainable,
        "frozen_params": result.params - trainable,
        "flops_forward": result.flops_forward,
        "flops_backward": result.flops_backward,
        "flops_recompute": result.flops_recompute,
        "single_device_peak_gib": result.peak_bytes / GIB,
        "peak_phase": result.peak_phase,
        "at_peak_gib": {
            "parameters": result.at_peak.parameters / GIB,
            "gradients": result.at_peak.gradients / GIB,
            "optimizer": result.at_peak.optimizer / GIB,
            "activations": result.at_peak.activations / GIB,
            "temporaries": result.at_peak.temporaries / GIB,
        },
        "notes": list(result.notes),
    }
    if getattr(result, "heap_retention_bytes", None) is not None:  # a trace for a CPU target (estimate/heap.py)
        summary["heap_retention_gib"] = result.heap_retention_bytes / GIB
    return StepProfile(
        source=ProfileSource.TRACE,
        params=Params(
            total=result.params,
            trainable=trainable,
            frozen_bytes=frozen_bytes,
            shaped_state_elems=factored,
            optimizer_flops=float(getattr(result, "flops_optimizer", 0.0)),
            largest_block=largest,
            largest_tensor=largest_tensor,
        ),
        flops=StepFlops(forward=result.flops_forward, backward=result.flops_backward, recompute=result.flops_recompute,
                        split=_kernel_split(result) if mfu_width is None and not _conv_dominated(result) else None),
        memory=StepMemory(
            activations=max(0.0, activations - autocast),
            autocast_copies=min(autocast, activations),
            optimizer_temporaries=float(getattr(result, "optimizer_temporary_bytes", 0)) if foreach_optimizer else 0.0,
            transient_gradients=k.optimizer_in_backward,
            pageable_optimizer_state=k.paged_optimizer,
            unsharded_accumulation=k.unsharded_accumulation,  # (frozen_weight_gradients: a trace has no LoRA units)
            reserve_bytes=getattr(result, "reserve_bytes", None),
            expandable_reserve_bytes=getattr(result, "expandable_reserve_bytes", None),
            single_device_peak=float(result.peak_bytes),
            heap_retention_bytes=getattr(result, "heap_retention_bytes", None),
        ),
        items_per_sample=tokens,
        throughput_unit="tokens_per_s" if isinstance(job, TransformerJob) else "samples_per_s",
        mfu_width=mfu_width,
        notes=(f"traced: single-device peak {result.peak_bytes / GIB:.2f} GiB during {result.peak_phase}",)
        + tuple(result.notes) + k.notes
        + ((f"not traced (eager memory shown): {', '.join(untraced)}",) if untraced else ()),
        engines=k.engines,
        stack=k.stack.value,
        foreach_optimizer=foreach_optimizer,
        tf32_matmul=k.tf32_matmul,
        trace=summary,
        eager=EagerOps(ops=float(result.ops_step), memory_bytes=float(result.memory_bytes_step),
                       optimizer_ops=float(result.ops_optimizer),
                       optimizer_memory_bytes=float(result.memory_bytes_optimizer),
                       conv_flops=float(getattr(result, "conv_flops_step", 0)),
                       rnn_flops=float(getattr(result, "rnn_flops_step", 0)))
        if getattr(result, "ops_step", 0) else None,  # fmt: skip
    )


def trace_torch_job(job: TorchJob, *, device: str = "cuda") -> StepProfile:
    """Trace the job's model factory with its example inputs (raises TraceError with one clear line).

    ``device`` is where the job will run: ``"cpu"`` traces with the CPU kernels' rules (no allocator rounding,
    oneDNN's convolution and LSTM workspaces, torch.optim's per-parameter step; ``trace/target.py``)."""
    import torch

    from trainplan.estimate.trace import load_factory, trace_training_step

    factory = load_factory(job.model)
    kwargs = dict(job.model_args)

    def build() -> Any:
        return factory(**kwargs)

    build.__qualname__ = job.model  # error messages name the user's factory

    result = trace_training_step(
        build,
        list(job.inputs),
        micro_batch=job.micro_batch,
        precision=job.precision,
        optimizer=job.optimizer,
        activation_checkpointing=job.activation_checkpointing,
        loss=job.loss,
        device=device,
    )
    try:
        with torch.device("meta"):
            model = build()
        largest = _largest_child_params(model)
        largest_tensor = max((p.numel() for p in model.parameters()), default=0)
    except Exception:  # the trace succeeded; a factory that cannot build on meta only costs the unit size
        largest = largest_tensor = result.params
    return profile_from_trace(job, result, largest, mfu_width=None, knobs=effective_knobs(job, get_catalog()),
                              largest_tensor=largest_tensor)  # fmt: skip


def hf_config_for(arch: ModelArch, seq_len: int | None = None) -> dict[str, Any]:
    """The Hugging Face config the trace builds for ``arch`` (the one mapping, ``trainplan.model.hf_config``)."""
    from trainplan.estimate.trace import TraceError

    try:
        return hf_config(arch, seq_len)
    except UnsupportedArchitecture as exc:
        raise TraceError(f"{exc}; use the analytic estimate (without --trace)") from None


def trace_transformer_job(job: TransformerJob, catalog: Catalog | None = None) -> StepProfile:
    """Trace a transformer job's model, built from its architecture on the fake device."""
    import torch
    import torch.nn.functional as F

    from trainplan.estimate.trace import build_hf_causal_lm, trace_training_step

    arch = resolve_model(job.model, catalog)
    if job.lora_spec is not None:  # the formulas' refusal holds for the trace too: PEFT adapts every routed expert
        check_moe_lora_targets(arch, job.lora_spec)
    cfg = hf_config_for(arch, job.seq_len)
    vocab = arch.vocab

    def batch(micro_batch: int) -> list[torch.Tensor]:
        return [torch.randint(0, vocab, (micro_batch, job.seq_len))]

    knobs = effective_knobs(job, catalog or get_catalog())
    chunks = knobs.loss_chunks if knobs.loss is LossImpl.CHUNKED else 1

    def loss(output: Any, inputs: Any) -> torch.Tensor:
        """Cross-entropy as the stack computes it in eager PyTorch: over all logits up-cast to fp32, or one
        chunk of the sequence at a time (torchtune CEWithChunkedOutputLoss, LitGPT chunked_cross_entropy)."""
        logits = output.logits if hasattr(output, "logits") else output[0]
        targets = inputs[0]
        total = logits.new_zeros((), dtype=torch.float32)
        for lg, tg in zip(logits.chunk(chunks, dim=1), targets.chunk(chunks, dim=1)):
            total = total + F.cross_entropy(lg.float().reshape(-1, vocab), tg.reshape(-1), reduction="sum")
        return total / targets.numel()

    result = trace_training_step(
        lambda: build_hf_causal_lm(cfg),
        batch,
        micro_batch=job.micro_batch,
        precision=job.precision,
        optimizer=job.optimizer,
        activation_checkpointing=job.activation_checkpointing,
        checkpoint_fraction=knobs.checkpoint_fraction,
        loss=loss,
        lora=job.lora_spec,
        qlora=job.method is Method.QLORA,
    )
    per_layer = result.params // max(1, arch.layers)
    largest = max(max(i * o for i, o in arch_mod.linear_shapes(arch).values()), arch.vocab * arch.hidden)
    return profile_from_trace(job, result, per_layer, mfu_width=arch.hidden, knobs=knobs, largest_tensor=largest)


def estimate_traced(
    job: TorchJob | TransformerJob,
    traced: StepProfile,
    hw: Hardware,
    strategy: Strategy,
    catalog: Catalog,
    *,
    efficiency: float | None = None,
) -> Estimate:
    """Memory, time and cost from a trace, with the strategy's sharding applied (``compose``)."""
    return compose(job, traced, hw, strategy, catalog, efficiency=efficiency)
