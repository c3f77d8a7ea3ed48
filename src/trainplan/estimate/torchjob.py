"""Estimates from a trace of the real model (``kind: torch`` jobs, and ``--trace`` for transformers).

The trace (``estimate/trace.py``) gives the per-device numbers of one
single-device training step: parameters, FLOPs, model states and the peak of
activations and temporaries.  The strategy rules of ``memory.py`` and
``comms.py`` are then applied on top, so the traced and the analytic paths
share one sharding model (ZeRO stages, FSDP, offload, LoRA).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from trainplan.catalog import Catalog
from trainplan.estimate.memory import (
    GIB,
    MemoryBreakdown,
    framework_overhead_bytes,
    model_state_bytes,
    sharding_buffer_bytes,
    step_peak,
    weight_bytes_per_param,
)
from trainplan.estimate.result import Estimate, Hardware, job_timing
from trainplan.estimate.steptime import step_time as step_time_of
from trainplan.spec import Method, ModelArch, TorchJob, TransformerJob
from trainplan.strategies import Engine, Strategy


@dataclass(frozen=True)
class Traced:
    """What the planner needs from a trace, independent of hardware and strategy."""

    params: int
    trainable_params: int
    flops_forward: float
    flops_backward: float
    flops_recompute: float
    state_parameters_bytes: int  # as traced on one device (torch conventions)
    activation_peak_bytes: int  # forward + backward
    optimizer_temporary_bytes: int  # foreach buffers of the optimizer step (unsharded)
    largest_block_params: int
    peak_bytes: int
    peak_phase: str
    at_peak: dict[str, int]
    notes: tuple[str, ...] = ()

    @property
    def flops_per_step(self) -> float:
        return self.flops_forward + self.flops_backward + self.flops_recompute

    def summary(self) -> dict[str, Any]:
        """The traced single-device step, for reports and JSON."""
        return {
            "params": self.params,
            "trainable_params": self.trainable_params,
            "frozen_params": self.params - self.trainable_params,
            "flops_forward": self.flops_forward,
            "flops_backward": self.flops_backward,
            "flops_recompute": self.flops_recompute,
            "single_device_peak_gib": self.peak_bytes / GIB,
            "peak_phase": self.peak_phase,
            "at_peak_gib": {k: v / GIB for k, v in self.at_peak.items()},
            "notes": list(self.notes),
        }


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


def _from_trace(result: Any, largest: int) -> Traced:
    return Traced(
        params=result.params,
        trainable_params=result.trainable_params,
        flops_forward=result.flops_forward,
        flops_backward=result.flops_backward,
        flops_recompute=result.flops_recompute,
        state_parameters_bytes=result.state_bytes.parameters,
        activation_peak_bytes=result.activation_peak_bytes,
        optimizer_temporary_bytes=int(getattr(result, "optimizer_temporary_bytes", 0)),
        largest_block_params=largest,
        peak_bytes=result.peak_bytes,
        peak_phase=result.peak_phase,
        at_peak={
            "parameters": result.at_peak.parameters,
            "gradients": result.at_peak.gradients,
            "optimizer": result.at_peak.optimizer,
            "activations": result.at_peak.activations,
            "temporaries": result.at_peak.temporaries,
        },
        notes=tuple(result.notes),
    )


def trace_torch_job(job: TorchJob) -> Traced:
    """Trace the job's model factory with its example inputs (raises TraceError with one clear line)."""
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
    )
    try:
        with torch.device("meta"):
            largest = _largest_child_params(build())
    except Exception:  # the trace succeeded; a factory that cannot build on meta only costs the unit size
        largest = result.params
    return _from_trace(result, largest)


def hf_config_for(arch: ModelArch) -> dict[str, Any]:
    """A Hugging Face config (``model_type`` llama or gpt2) with the architecture's dimensions."""
    from trainplan.estimate.trace import TraceError

    if arch.arch == "decoder" and arch.position == "rope" and arch.norm == "rmsnorm" and arch.mlp == "swiglu":
        return {
            "model_type": "llama",
            "hidden_size": arch.hidden,
            "intermediate_size": arch.ffn_hidden,
            "num_hidden_layers": arch.layers,
            "num_attention_heads": arch.heads,
            "num_key_value_heads": arch.kv_heads or arch.heads,
            "head_dim": arch.head_dim or arch.hidden // arch.heads,
            "vocab_size": arch.vocab,
            "tie_word_embeddings": arch.tied_embeddings,
            "max_position_embeddings": arch.max_seq_len or 4096,
            "attention_bias": arch.bias,
        }
    if arch.arch == "decoder" and arch.position == "learned" and arch.norm == "layernorm" and arch.mlp == "gelu":
        return {
            "model_type": "gpt2",
            "n_embd": arch.hidden,
            "n_inner": arch.ffn_hidden,
            "n_layer": arch.layers,
            "n_head": arch.heads,
            "vocab_size": arch.vocab,
            "n_positions": arch.max_seq_len or 1024,
            "attn_pdrop": 0.0,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
        }
    raise TraceError(
        f"no Hugging Face class is mapped for this architecture ({arch.arch}, {arch.position}, {arch.norm}, {arch.mlp}); "
        "use the analytic estimate (without --trace)"
    )


def trace_transformer_job(job: TransformerJob) -> Traced:
    """Trace a transformer job's model, built from its architecture on the fake device."""
    import torch
    import torch.nn.functional as F

    from trainplan.catalog import resolve_model
    from trainplan.estimate.trace import build_hf_causal_lm, trace_training_step

    arch = resolve_model(job.model)
    cfg = hf_config_for(arch)
    vocab = arch.vocab

    def batch(micro_batch: int) -> list[torch.Tensor]:
        return [torch.randint(0, vocab, (micro_batch, job.seq_len))]

    def loss(output: Any, inputs: Any) -> torch.Tensor:
        logits = output.logits if hasattr(output, "logits") else output[0]
        return F.cross_entropy(logits.float().reshape(-1, vocab), inputs[0].reshape(-1))

    result = trace_training_step(
        lambda: build_hf_causal_lm(cfg),
        batch,
        micro_batch=job.micro_batch,
        precision=job.precision,
        optimizer=job.optimizer,
        activation_checkpointing=job.activation_checkpointing,
        loss=loss,
        lora=job.lora_spec,
        qlora=job.method is Method.QLORA,
    )
    per_layer = result.params // max(1, arch.layers)
    return _from_trace(result, per_layer)


def estimate_traced(
    job: TorchJob | TransformerJob,
    traced: Traced,
    hw: Hardware,
    strategy: Strategy,
    catalog: Catalog,
    *,
    efficiency: float | None = None,
) -> Estimate:
    """Memory, time and cost from a trace, with the strategy's sharding applied."""
    layout = hw.layout
    n = layout.world_size
    acc = hw.accelerator
    reason: str | None = None
    if acc is None:
        reason = "training a neural network here needs an accelerator; this option has CPUs only"
    elif strategy.multi_device_only and n == 1:
        reason = f"{strategy.value} needs more than one device"
    elif strategy is Strategy.SINGLE and n > 1:
        reason = "single uses one device; pick ddp, zero*, or fsdp for several"
    elif acc.kind == "tpu" and strategy.engine is Engine.DEEPSPEED:
        reason = "DeepSpeed does not run on TPUs; use fsdp or ddp (PyTorch/XLA)"
    elif job.precision.half and acc.peak_tflops(job.precision.half) is None:
        reason = f"{acc.id} has no {job.precision.half} tensor cores"
    elif layout.gpus_per_node > 1 and not hw.intra_node_bw_gb_s:
        reason = "no intra-node interconnect figure for this hardware"
    elif layout.nodes > 1 and not hw.network_gbps:
        reason = "no network bandwidth figure for multi-node use"
    global_batch = job.global_batch or job.micro_batch * layout.data_parallel
    if reason is None and global_batch % (job.micro_batch * layout.data_parallel):
        reason = f"global_batch {global_batch} is not a multiple of micro_batch × data-parallel ({job.micro_batch}×{n})"
    micro_steps = max(1, global_batch // (job.micro_batch * layout.data_parallel))
    steps = job.total_steps(global_batch)

    trainable = traced.trainable_params
    frozen_bytes = max(0.0, traced.state_parameters_bytes - trainable * weight_bytes_per_param(job.precision, Engine.TORCH))
    states = model_state_bytes(
        trainable_params=trainable,
        frozen_bytes=frozen_bytes,
        precision=job.precision,
        optimizer=job.optimizer,
        strategy=strategy,
        world_size=n,
    )
    fwd_temps = sharding_buffer_bytes(strategy, largest_block_params=traced.largest_block_params, world_size=n)
    activations = float(traced.activation_peak_bytes)
    if strategy.engine is not Engine.TORCH and job.precision.mixed and not getattr(job, "lora_spec", None):
        # The trace runs PyTorch AMP over fp32 weights, whose autocast keeps a 16-bit copy of every
        # matmul weight for backward; DeepSpeed and FSDP hold 16-bit working weights and make none.
        activations = max(0.0, activations - 2.0 * trainable)
    mem = step_peak(
        states=states,
        activations=activations,
        forward_temporaries=fwd_temps,
        # foreach buffers scale with the optimizer shard; DeepSpeed's fused and CPU optimizers make none
        optimizer_temporaries=0.0
        if strategy.engine is Engine.DEEPSPEED or strategy.offloads_optimizer
        else traced.optimizer_temporary_bytes / (n if strategy.shards_optimizer else 1),
        fixed_overhead=framework_overhead_bytes(
            cuda_context_gib=catalog.assumption("cuda_context_gib"),
            comm_buffers_gib=catalog.assumption("nccl_buffers_gib"),
            world_size=n,
        ),
        fragmentation=catalog.assumption("allocator_fragmentation"),
        grads_live_in_forward=micro_steps > 1 or strategy.engine is Engine.DEEPSPEED,
    )
    if states.host:
        mem = MemoryBreakdown(**{**mem.__dict__, "host": states.host * layout.gpus_per_node})
    capacity = acc.memory_gib if acc else 0.0
    if reason is None and mem.peak > capacity * GIB:
        reason = f"needs {mem.peak / GIB:.1f} GiB per {acc.id if acc else 'device'} > {capacity:.0f} GiB (traced step)"

    step_time = float("inf")
    mfu = None
    breakdown: dict[str, float] = {}
    if acc is not None:
        st = step_time_of(
            hw=hw, strategy=strategy, catalog=catalog, precision=job.precision, optimizer=job.optimizer,
            micro_steps=micro_steps, flops_forward=traced.flops_forward,
            flops_backward=traced.flops_backward + traced.flops_recompute,
            flops_model=traced.flops_forward + traced.flops_backward, trainable_params=trainable,
            total_params=traced.params,
            efficiency=efficiency if efficiency is not None else catalog.assumption("mfu_traced_default"),
        )  # fmt: skip
        step_time, mfu, breakdown = st.seconds, st.mfu, st.breakdown
        reason = reason or st.reason
    timing = job_timing(hw, train_s=steps * step_time)
    samples = global_batch * (job.seq_len if isinstance(job, TransformerJob) else 1)
    return Estimate(
        kind=job.kind.value,
        strategy=strategy.value,
        hardware=hw,
        fits=reason is None,
        reason=reason,
        memory=mem,
        capacity_gib=capacity,
        step_time_s=step_time,
        steps=steps,
        train_s=timing.train_s,
        startup_s=timing.startup_s,
        cost_usd=timing.cost_usd,
        throughput=samples / step_time if step_time not in (0.0, float("inf")) else 0.0,
        throughput_unit="tokens_per_s" if isinstance(job, TransformerJob) else "samples_per_s",
        mfu=mfu,
        params=traced.params,
        trainable_params=trainable,
        flops_per_step=micro_steps * traced.flops_per_step,
        time_breakdown=breakdown,
        calibrated=efficiency is not None,
        notes=(f"traced: single-device peak {traced.peak_bytes / GIB:.2f} GiB during {traced.peak_phase}",) + traced.notes,
        trace=traced.summary(),
    )


_TRACES: dict[str, Traced] = {}


def _cached_trace(job: TorchJob) -> Traced:
    """One trace per job (the job is frozen; its JSON is the key)."""
    key = job.model_dump_json()
    if key not in _TRACES:
        _TRACES[key] = trace_torch_job(job)
    return _TRACES[key]


def make_traced_transformer_estimator(job: TransformerJob, catalog: Catalog, *, efficiency_for: Callable[[Hardware], float | None] | None = None):
    """(hardware, strategy) → Estimate for a transformer job, from a trace of its Hugging Face model.

    Memory and FLOPs come from the trace; the efficiency is the transformer default
    (``matmul_efficiency``), as for the analytic path.
    """
    from trainplan.catalog import resolve_model
    from trainplan.estimate.transformer import matmul_efficiency

    traced = trace_transformer_job(job)
    hidden = resolve_model(job.model).hidden

    def est(hw: Hardware, strategy: Strategy | None) -> Estimate:
        eff = efficiency_for(hw) if efficiency_for else None
        if eff is None and hw.accelerator is not None:
            eff = matmul_efficiency(catalog, hw.accelerator.id, hidden)
        e = estimate_traced(job, traced, hw, strategy or Strategy.SINGLE, catalog, efficiency=eff)
        return replace(e, calibrated=efficiency_for is not None and efficiency_for(hw) is not None)

    return est


def make_torch_estimator(job: TorchJob, catalog: Catalog, *, efficiency_for: Callable[[Hardware], float | None] | None = None):
    """(hardware, strategy) → Estimate for a ``kind: torch`` job; the model is traced once."""
    traced = _cached_trace(job)

    def est(hw: Hardware, strategy: Strategy | None) -> Estimate:
        eff = efficiency_for(hw) if efficiency_for else None
        return estimate_traced(job, traced, hw, strategy or Strategy.SINGLE, catalog, efficiency=eff)

    return est
