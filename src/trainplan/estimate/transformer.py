"""Estimate a transformer training job on given hardware with a given strategy.

This module only composes the per-quantity functions of ``architecture``,
``memory``, ``compute`` and ``comms``; each of those cites its source.  The
defaults it reads (efficiencies, overheads) come from the catalog's
``assumptions.yaml``, each with its own source.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.catalog import Catalog, resolve_model
from trainplan.estimate import architecture as arch_mod
from trainplan.estimate.compute import StepFlops, training_step_flops
from trainplan.estimate.memory import (
    GIB,
    MemoryBreakdown,
    autocast_weight_copy_bytes,
    checkpointed_activation_bytes,
    framework_overhead_bytes,
    layer_activation_bytes,
    logits_bytes,
    model_state_bytes,
    norm_saved_bytes_per_token,
    optimizer_step_temporary_bytes,
    sharding_buffer_bytes,
    step_peak,
)
from trainplan.estimate.result import Estimate, Hardware, job_timing
from trainplan.estimate.steptime import step_time as step_time_of
from trainplan.spec import Checkpointing, FlashAttention, Method, ModelArch, Optimizer, Precision, TransformerJob
from trainplan.strategies import Engine, Strategy


@dataclass(frozen=True)
class TransformerModel:
    """A job's model resolved to counts (computed once per plan, shared by every option)."""

    arch: ModelArch
    counts: arch_mod.ParamCounts
    trainable: int
    frozen_bytes: float  # bytes of frozen (LoRA/QLoRA base) weights, unsharded
    adapter_params: int
    trainable_matmul: float
    adafactor_elems_per_param: float

    @property
    def total(self) -> int:
        return self.counts.total


def resolve_transformer(job: TransformerJob) -> TransformerModel:
    """Resolve the job's model and its trainable / frozen split."""
    arch = resolve_model(job.model)
    counts = arch_mod.param_counts(arch)
    lora = job.lora_spec
    e16 = 4 if job.precision is Precision.FP32 else 2
    if lora is None:
        trainable, frozen_bytes, adapters = counts.total, 0.0, 0
        trainable_matmul = float(counts.matmul_per_token)
    else:
        adapters = arch_mod.lora_params(arch, lora)
        trainable = adapters
        if job.method is Method.QLORA:
            # 4-bit NF4 base weights in the blocks; embeddings, head and norms stay 16-bit (QLoRA paper Sec. 3).
            frozen_bytes = counts.block_linear * arch_mod.QLORA_BITS_PER_PARAM / 8 + (counts.total - counts.block_linear) * e16
        else:
            frozen_bytes = counts.total * e16
        trainable_matmul = 0.0
    # Adafactor's factored second moment: rows + columns per matrix (Shazeer & Stern 2018, Sec. 3).
    n_blocks = arch.layers + ((arch.decoder_layers or arch.layers) if arch.arch == "encoder-decoder" else 0)
    factored = n_blocks * sum(i + o for i, o in arch_mod.linear_shapes(arch).values()) + 2 * (arch.vocab + arch.hidden)
    vectors = counts.block_other
    ada = (factored + vectors) / max(1, counts.total)
    return TransformerModel(arch, counts, trainable, frozen_bytes, adapters, trainable_matmul, ada)


def matmul_efficiency(catalog: Catalog, accelerator_id: str, hidden: int) -> float:
    """Default fraction of dense peak a training step reaches (MFU), by accelerator and width.

    ``mfu_large`` is the asymptote for wide models; narrow models lose to
    kernel-launch and memory-bound work: eff = mfu_large · h / (h + h_half).
    Both constants and their sources are in assumptions.yaml.
    """
    table = catalog.assumptions.get("mfu_large", {}).get("by_accelerator", {})
    large = float(table.get(accelerator_id, catalog.assumption("mfu_large")))
    h_half = catalog.assumption("mfu_hidden_half")
    return large * hidden / (hidden + h_half)


def _flash(job: TransformerJob) -> bool:
    # "auto": PyTorch's scaled_dot_product_attention picks a fused kernel (flash or
    # memory-efficient) on every CUDA GPU, so no s² tensor is kept.
    return job.flash_attention is not FlashAttention.FALSE


def activation_bytes(job: TransformerJob, arch: ModelArch) -> float:
    """Activations of all blocks plus the head, for one micro-batch."""
    layers = arch.layers + ((arch.decoder_layers or arch.layers) if arch.arch == "encoder-decoder" else 0)
    per_layer = layer_activation_bytes(
        seq_len=job.seq_len,
        micro_batch=job.micro_batch,
        hidden=arch.hidden,
        heads=arch.heads,
        q_dim=arch_mod.attention_inner_dim(arch),
        kv_dim=arch_mod.kv_inner_dim(arch),
        ffn_hidden=arch.ffn_hidden,
        mlp=arch.mlp,
        norm=arch.norm,
        precision=job.precision,
        flash_attention=_flash(job),
        checkpointing=job.activation_checkpointing,
    )
    if job.activation_checkpointing is Checkpointing.FULL:
        blocks = checkpointed_activation_bytes(
            layers=layers,
            layer_bytes=per_layer,
            seq_len=job.seq_len,
            micro_batch=job.micro_batch,
            hidden=arch.hidden,
            precision=job.precision,
        )
    else:
        blocks = layers * per_layer
    tokens = job.seq_len * job.micro_batch
    head = tokens * (norm_saved_bytes_per_token(arch.hidden, arch.norm, job.precision) + arch.hidden * job.precision.compute_bytes)
    if arch.arch != "encoder":
        head += logits_bytes(seq_len=job.seq_len, micro_batch=job.micro_batch, vocab=arch.vocab, precision=job.precision)
    return blocks + head


def _compat_reason(job: TransformerJob, hw: Hardware, strategy: Strategy) -> str | None:
    acc = hw.accelerator
    if acc is None:
        return "transformer training needs an accelerator; this option has CPUs only"
    if strategy.multi_device_only and hw.layout.world_size == 1:
        return f"{strategy.value} needs more than one device"
    if strategy is Strategy.SINGLE and hw.layout.world_size > 1:
        return "single uses one device; pick ddp, zero*, or fsdp for several"
    half = job.precision.half
    if half and acc.peak_tflops(half) is None:
        alt = "fp16" if acc.peak_fp16_tflops else "fp32"
        return f"{acc.id} has no {half} tensor cores; use precision: {alt}"
    if acc.kind == "tpu":
        if strategy.engine is Engine.DEEPSPEED:
            return "DeepSpeed does not run on TPUs; use fsdp or ddp (PyTorch/XLA)"
        if job.method is Method.QLORA or job.optimizer is Optimizer.ADAM8BIT:
            return "bitsandbytes (QLoRA, 8-bit Adam) needs CUDA GPUs"
    if hw.layout.world_size > 1 and hw.layout.gpus_per_node > 1 and not hw.intra_node_bw_gb_s:
        return "no intra-node interconnect figure for this hardware"
    if hw.layout.nodes > 1 and not hw.network_gbps:
        return "no network bandwidth figure for multi-node use"
    dp = job.micro_batch * hw.layout.data_parallel
    if job.global_batch is not None and job.global_batch % dp:
        return f"global_batch {job.global_batch} is not a multiple of micro_batch × data-parallel ({job.micro_batch}×{hw.layout.data_parallel})"
    return None


def estimate_transformer(
    job: TransformerJob,
    hw: Hardware,
    strategy: Strategy,
    catalog: Catalog,
    *,
    model: TransformerModel | None = None,
    efficiency: float | None = None,
) -> Estimate:
    """Memory, time and cost of ``job`` on ``hw`` with ``strategy``.

    ``efficiency`` overrides the default MFU (a calibration from a measured run).
    """
    m = model or resolve_transformer(job)
    arch = m.arch
    layout = hw.layout
    n = layout.world_size
    reason = _compat_reason(job, hw, strategy)
    acc = hw.accelerator
    global_batch = job.global_batch or job.micro_batch * layout.data_parallel
    micro_steps = max(1, global_batch // (job.micro_batch * layout.data_parallel))
    steps = job.total_steps(global_batch)
    engine = strategy.engine

    # ---------------------------------------------------------------- memory
    states = model_state_bytes(
        trainable_params=m.trainable,
        frozen_bytes=m.frozen_bytes,
        precision=job.precision,
        optimizer=job.optimizer,
        strategy=strategy,
        world_size=n,
        adafactor_elems_per_param=m.adafactor_elems_per_param,
    )
    acts = activation_bytes(job, arch)
    matmul_weights = m.counts.block_linear + arch.vocab * arch.hidden
    fwd_temps = autocast_weight_copy_bytes(
        matmul_weights, job.precision, strategy, trainable_fp32=job.method is Method.FULL
    ) + sharding_buffer_bytes(strategy, largest_block_params=arch_mod.largest_block_params(arch), world_size=n)
    local_trainable = m.trainable / (n if strategy.shards_optimizer else 1)
    opt_temps = optimizer_step_temporary_bytes(local_trainable, job.optimizer, strategy)
    fixed = framework_overhead_bytes(
        cuda_context_gib=catalog.assumption("cuda_context_gib"),
        comm_buffers_gib=catalog.assumption("nccl_buffers_gib"),
        world_size=n,
    )
    # Gradients outlive a micro-step under accumulation; DeepSpeed keeps its gradient buffers allocated.
    grads_persist = micro_steps > 1 or engine is Engine.DEEPSPEED
    mem = step_peak(
        states=states,
        activations=acts,
        forward_temporaries=fwd_temps,
        optimizer_temporaries=opt_temps,
        fixed_overhead=fixed,
        fragmentation=catalog.assumption("allocator_fragmentation"),
        grads_live_in_forward=grads_persist,
    )
    if states.host:
        host_total = states.host * layout.gpus_per_node + catalog.assumption("host_process_gib") * GIB * layout.gpus_per_node
        mem = MemoryBreakdown(**{**mem.__dict__, "host": host_total})
    capacity = acc.memory_gib if acc else 0.0
    notes: list[str] = []
    if reason is None and mem.peak > capacity * GIB:
        states_gib = (mem.weights + mem.gradients + mem.optimizer) / GIB
        reason = (
            f"needs {mem.peak / GIB:.1f} GiB per {acc.id if acc else 'device'} > {capacity:.0f} GiB "
            f"(at the {mem.phase} peak: model states {states_gib:.1f} = weights {mem.weights / GIB:.1f} + grads "
            f"{mem.gradients / GIB:.1f} + optimizer {mem.optimizer / GIB:.1f}; activations {mem.activations / GIB:.1f}; "
            f"overhead {mem.overhead / GIB:.1f})"
        )
    if reason is None and mem.host:
        usable = hw.ram_gib_per_node * catalog.assumption("host_ram_usable_fraction")
        if mem.host > usable * GIB:
            reason = f"offload needs {mem.host / GIB:.0f} GiB host RAM per node > {usable:.0f} GiB usable"

    # ---------------------------------------------------------------- time
    tokens = job.seq_len * job.micro_batch
    attn_layers = arch.layers + ((arch.decoder_layers or arch.layers) if arch.arch == "encoder-decoder" else 0)
    flops: StepFlops = training_step_flops(
        tokens=tokens,
        matmul_params=m.counts.matmul_per_token,
        trainable_matmul_params=m.trainable_matmul,
        adapter_params=m.adapter_params,
        layers=attn_layers,
        seq_len=job.seq_len,
        attn_dim=arch_mod.attention_inner_dim(arch),
        checkpointing=job.activation_checkpointing,
        lm_head_params=arch.vocab * arch.hidden if arch.arch != "encoder" else 0,
        causal_fused_attention=_flash(job) and arch.arch == "decoder",
    )
    calibrated = efficiency is not None
    step_time = float("inf")
    mfu = None
    breakdown: dict[str, float] = {}
    if acc is not None:
        eff = efficiency if efficiency is not None else matmul_efficiency(catalog, acc.id, arch.hidden)
        st = step_time_of(
            hw=hw, strategy=strategy, catalog=catalog, precision=job.precision, optimizer=job.optimizer,
            micro_steps=micro_steps, flops_forward=flops.forward, flops_backward=flops.backward + flops.recompute,
            flops_model=flops.model, trainable_params=m.trainable, total_params=m.total, efficiency=eff,
            adafactor_elems_per_param=m.adafactor_elems_per_param,
        )  # fmt: skip
        step_time, mfu, breakdown = st.seconds, st.mfu, st.breakdown
        reason = reason or st.reason
        if calibrated:
            notes.append(f"efficiency {eff:.2f} from a measured run")

    timing = job_timing(hw, train_s=steps * step_time)
    tokens_per_s = global_batch * job.seq_len / step_time if step_time not in (0.0, float("inf")) else 0.0
    return Estimate(
        kind="transformer",
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
        throughput=tokens_per_s,
        throughput_unit="tokens_per_s",
        mfu=mfu,
        params=m.total,
        trainable_params=m.trainable,
        flops_per_step=micro_steps * flops.hardware,
        time_breakdown=breakdown,
        calibrated=calibrated,
        notes=tuple(notes),
    )
