"""Hardware × strategy applied to a step profile: the one composer of neural-network estimates.

Both the analytic and the traced path end here, so sharding (ZeRO stages,
FSDP), offload, communication, step time, job time and cost follow one set of
rules.  Each rule is a pure function elsewhere with its source cited:
model states and temporaries in ``memory.py``, step time in ``steptime.py``
(collectives in ``comms.py``), time and cost in ``result.py``, compatibility
in ``compat.py``.
"""

from __future__ import annotations

from typing import Any

from dataclasses import replace

from trainplan.catalog import Catalog
from trainplan.estimate.compat import global_batch_of, incompatibility, micro_steps_of
from trainplan.estimate.cpu import (
    cpu_capacity_bytes,
    cpu_memory,
    cpu_memory_rejection,
    cpu_notes,
    cpu_optimizer_temporary_bytes,
    cpu_step_time,
    precision_note,
)
from trainplan.estimate.memory import (
    GIB,
    MemoryBreakdown,
    ModelStates,
    ddp_bucket_bytes,
    framework_overhead_bytes,
    fsdp_stream_pool_bytes,
    gradient_bytes_per_param,
    model_state_bytes,
    sharding_buffer_bytes,
    step_peak,
)
from trainplan.estimate.parallel import layout_error, rank_flops_share, stage_loads
from trainplan.estimate.profile import ProfileSource, StepProfile
from trainplan.estimate.result import Estimate, Hardware, Rejection, RejectKind, job_timing
from trainplan.estimate.tpu import xla_device_memory
from trainplan.estimate.steptime import default_efficiency, parallel_step_time, step_time
from trainplan.spec import TorchJob, TransformerJob
from trainplan.strategies import Engine, Strategy
from trainplan.frozen import evolve


# (job, profile, catalog, accelerator kind, layout, strategy, micro-steps) → the breakdown; the value keeps the objects
# whose ids are in the key alive, so an id cannot be reused while its entry exists.  On accelerators the memory of a
# step depends on nothing else — not on the cloud, the price or even the accelerator model: the formulas below read
# only whether it is a GPU (CUDA / ROCm caching allocator, per-stream pools) or a TPU (XLA's buffer assignment), the
# capacity being compared afterwards (:func:`memory_rejection`; tests/estimate/test_compose.py checks it over the
# catalog) — and the same layouts recur across accelerators, clouds and instance types in a plan.
_MEMORY: dict[tuple[object, ...], tuple[object, object, object, MemoryBreakdown]] = {}
_MEMORY_MAX = 65536


def step_memory(job: TorchJob | TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy,
                catalog: Catalog, *, micro_steps: int) -> MemoryBreakdown:  # fmt: skip
    """Per-device memory at the step's peak, with host RAM per node for offload (memoised on accelerators)."""
    acc = hw.accelerator
    if acc is None:
        return _step_memory(job, profile, hw, strategy, catalog, micro_steps=micro_steps)
    key = (id(job), id(profile), id(catalog), acc.kind, hw.layout, strategy, micro_steps)
    hit = _MEMORY.get(key)
    if hit is not None:
        return hit[3]
    mem = _step_memory(job, profile, hw, strategy, catalog, micro_steps=micro_steps)
    if len(_MEMORY) >= _MEMORY_MAX:
        _MEMORY.clear()
    _MEMORY[key] = (job, profile, catalog, mem)
    return mem


def _step_memory(job: TorchJob | TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy,
                 catalog: Catalog, *, micro_steps: int) -> MemoryBreakdown:  # fmt: skip
    if hw.layout.model_parallel and profile.split is not None:
        return parallel_step_memory(job, profile, hw, strategy, catalog, micro_steps=micro_steps)
    layout = hw.layout
    n = layout.world_size
    engine = strategy.engine
    p = profile.params
    states = model_state_bytes(
        trainable_params=p.trainable,
        # a DeepSpeed engine casts the module to bf16 / fp16 (deepspeed/runtime/engine.py _configure_distributed_model)
        frozen_bytes=p.frozen_bytes - (p.frozen_fp32_bytes / 2 if engine is Engine.DEEPSPEED else 0.0),
        precision=job.precision,
        optimizer=job.optimizer,
        strategy=strategy,
        world_size=n,
        state_elems_per_param=p.shaped_state_elems,
        # FSDP: the stack's gradients for frozen weights in mixed units, and unsharded gradients while
        # accumulating without sync (memory.model_state_bytes; stacks.yaml says which stacks do either)
        frozen_gradient_bytes=profile.memory.frozen_gradient_bytes,
        # On a TPU slice the SPMD step accumulates into gradients sharded like the parameters (MaxText
        # src/MaxText/gradient_accumulation.py: the accumulator is created with the params' shardings).
        unsharded_gradients=profile.memory.unsharded_accumulation and micro_steps > 1 and n > 1 and not _on_tpu(hw),
    )
    if profile.memory.transient_gradients:
        # the optimizer steps each parameter as its gradient is ready and frees it (torchtune optimizer_in_bwd,
        # PyTorch "How to save memory by fusing the optimizer step into the backward pass" tutorial)
        states = replace(states, gradients=p.largest_tensor * gradient_bytes_per_param(job.precision, engine))
    if profile.memory.pageable_optimizer_state:
        # bitsandbytes paged optimizers keep their state in unified memory that pages out to host RAM under
        # pressure (bitsandbytes docs, "Paged optimizers"): it never forces an OOM; count it on the host.
        states = replace(states, host=states.host + states.optimizer, optimizer=0.0)
    # AMP's cached 16-bit weight copies exist only over fp32 weights (plain PyTorch);
    # DeepSpeed and FSDP hold 16-bit working weights already.
    autocast = profile.memory.autocast_copies if engine is Engine.TORCH else 0.0
    buffers = _sharding_buffers(job, profile, strategy, p.largest_block, n, on_cuda=_on_cuda(hw), on_tpu=_on_tpu(hw))
    forward_temporaries = autocast + profile.memory.forward_temporaries + buffers[0]
    # foreach temporaries scale with the optimizer shard; DeepSpeed's fused and CPU optimizers make none.
    if engine is Engine.DEEPSPEED or strategy.offloads_optimizer:
        optimizer_temporaries = 0.0
    else:
        optimizer_temporaries = profile.memory.optimizer_temporaries / (n if strategy.shards_optimizer else 1)
    if hw.accelerator is None:  # CPUs: torch.optim's per-parameter loop (estimate/cpu.py)
        optimizer_temporaries = cpu_optimizer_temporary_bytes(job.optimizer, optimizer_temporaries, p.largest_tensor)
    # DDP's buckets live from construction on: at both moments of the peak
    buckets = ddp_bucket_bytes(strategy, p.trainable * gradient_bytes_per_param(job.precision, engine), n)
    forward_temporaries += buckets
    optimizer_temporaries += buckets
    # Gradients outlive a micro-step under accumulation; DeepSpeed keeps its gradient buffers allocated.
    mem = _peak(states, profile.memory.activations, forward_temporaries, optimizer_temporaries, catalog, world_size=n,
                grads_live_in_forward=(micro_steps > 1 or engine is Engine.DEEPSPEED) and not profile.memory.transient_gradients,
                stream_pool=buffers[1])  # fmt: skip
    if hw.accelerator is None:  # CPUs: host RAM is the device memory (estimate/cpu.py)
        return cpu_memory(mem, hw, catalog, hugging_face=isinstance(job, TransformerJob),
                          heap_retention=profile.memory.heap_retention_bytes)  # fmt: skip
    if profile.memory.reserve_bytes is not None:
        mem = simulated_reserve(mem, profile, catalog)
    if hw.accelerator.kind == "tpu":  # XLA's static buffer assignment, no CUDA context (estimate/tpu.py)
        mem = xla_device_memory(mem)
    offloaded = states.host + profile.memory.host_activations
    if offloaded:
        # each rank's offloaded states and activations plus the host process itself (Python, pinned buffers)
        per_rank = offloaded + catalog.assumption("host_process_gib") * GIB
        mem = replace(mem, host=per_rank * layout.gpus_per_node)
    return mem


def parallel_step_memory(job: TorchJob | TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy,
                         catalog: Catalog, *, micro_steps: int) -> MemoryBreakdown:  # fmt: skip
    """The most loaded rank of a tensor / pipeline / context / expert parallel layout (estimate/parallel.py): its
    parameters (its stage, its tensor-parallel shard, its experts) with the strategy's sharding over the
    data-parallel × context-parallel ranks (Megatron's distributed optimizer and torchtitan's FSDP shard over
    both), its activations with the micro-batches its stage holds in flight; the same moments of the peak and
    overheads as one device (:func:`step_memory`)."""
    assert profile.split is not None
    layout = hw.layout
    engine = strategy.engine
    p = profile.params
    shard_over = layout.data_parallel * layout.cp
    gathered_block = local_block_params(p.largest_block, profile.split, layout)
    # Under a pipeline schedule FSDP keeps a stage's parameters gathered and its gradients unsharded until the step's
    # last backward: torch.distributed.pipelining's stage turns an FSDP module's reshard_after_backward and
    # requires_gradient_sync off for every backward but the last (stage.py backward_maybe_with_nosync), and
    # torchtitan's default policy does not reshard after forward under PP either (parallelize.py:
    # reshard_after_forward = not pp_enabled; Dubey et al. 2024, Sec. 3.3.2, likewise for Llama 3) — SHARD_GRAD_OP's
    # parameters with no_sync's gradients, whatever the strategy's own resharding.
    pipelined_fsdp = layout.pp > 1 and engine is Engine.FSDP
    held = Strategy.FSDP_GRAD_OP if pipelined_fsdp else strategy
    peaks = []
    common = dict(frozen_bytes=0.0, precision=job.precision, optimizer=job.optimizer, strategy=held,
                  state_elems_per_param=p.shaped_state_elems, unsharded_gradients=pipelined_fsdp)  # fmt: skip
    # the same for every stage: the gathered block and the sharding buffers
    buffers = _sharding_buffers(job, profile, held, gathered_block, shard_over, on_cuda=_on_cuda(hw))
    for load in stage_loads(profile.split, layout, micro_steps):
        if layout.ep == 1:  # the experts shard like every other parameter
            states = model_state_bytes(trainable_params=load.dense_params + load.expert_params, world_size=shard_over, **common)  # type: ignore[arg-type]
        else:
            dense = model_state_bytes(trainable_params=load.dense_params, world_size=shard_over, **common)  # type: ignore[arg-type]
            # the expert layers' own data-parallel degree: a stage's tp × cp × dp ranks over ep (the folding
            # strategies.Layout describes), each holding and sharding 1/ep of the experts
            experts = model_state_bytes(trainable_params=load.expert_params, world_size=layout.tp * shard_over // layout.ep, **common)  # type: ignore[arg-type]
            states = replace(dense, weights=dense.weights + experts.weights, gradients=dense.gradients + experts.gradients,
                             optimizer=dense.optimizer + experts.optimizer,
                             unsharded_until_backward_end=dense.unsharded_until_backward_end + experts.unsharded_until_backward_end)  # fmt: skip
        local = load.dense_params + load.expert_params
        share = local / max(1, p.total)
        autocast = profile.memory.autocast_copies * share if engine is Engine.TORCH else 0.0
        # the profile's own forward temporaries (DeepSeek Sparse Attention's indexer scores: each rank's queries, s / cp
        # of them, against every key)
        forward_temporaries = autocast + buffers[0] + profile.memory.forward_temporaries / layout.cp
        optimizer_temporaries = 0.0 if engine is Engine.DEEPSPEED else (
            profile.memory.optimizer_temporaries * share / (shard_over if strategy.shards_optimizer else 1))
        buckets = ddp_bucket_bytes(strategy, local * gradient_bytes_per_param(job.precision, engine), layout.data_parallel)
        peaks.append(_peak(states, load.activations, forward_temporaries + buckets, optimizer_temporaries + buckets,
                           catalog, world_size=layout.world_size,
                           grads_live_in_forward=micro_steps > 1 or engine is Engine.DEEPSPEED, stream_pool=buffers[1]))  # fmt: skip
    return max(peaks, key=lambda m: m.peak)


def local_block_params(largest_block: float, split: Any, layout: Any) -> float:
    """Parameters of the largest block one rank gathers under FSDP / ZeRO-3 in a model-parallel layout: its
    tensor-parallel shard, and of an MoE block's routed experts only the 1/ep this rank holds — torchtitan and NeMo
    AutoModel shard the experts with FSDP over their own (expert) data-parallel ranks, so the all-gather of an MoE
    block brings the local experts, not all of them (torchtitan ``parallelize.py`` ``apply_fsdp``: the experts are
    wrapped apart, over the ``dp_shard_mod_ep`` mesh; Liu et al. 2025, arXiv 2504.14960, MoE parallel folding)."""
    if layout.ep > 1 and split.moe_layers:
        # the routed experts of every MoE block, DeepSeek-V3's multi-token-prediction block (an MoE block) included
        per_layer_experts = split.expert_params / (split.moe_layers + split.extra_last_layers)
        largest_block = max(largest_block - per_layer_experts * (1 - 1 / layout.ep), split.block_params / split.layers)
    return largest_block / layout.tp


def _sharding_buffers(job: TorchJob | TransformerJob, profile: StepProfile, strategy: Strategy, block: float,
                      world_size: int, *, on_cuda: bool, on_tpu: bool = False) -> tuple[float, tuple[float, float]]:  # fmt: skip
    """Bytes of the strategy's gathered blocks and gradient buffers: (allocated, another stream's pool as (its size,
    its part idle at the forward-side peak)) — memory.sharding_buffer_bytes, memory.fsdp_stream_pool_bytes.  A block's trainable share is the model's (LoRA:
    the adapters' gradients are the only ones reduced); FSDP reduces mixed-precision gradients in fp32, as
    torchtitan's default ``mixed_precision_reduce = "float32"`` and trainplan's own run (run/runtime/wrapping.py)
    set the MixedPrecisionPolicy, else in the parameters' dtype."""
    p = profile.params
    compute = job.precision.compute_bytes
    kwargs = dict(largest_block_params=block, world_size=world_size, compute_bytes=compute,
                  trainable_fraction=p.trainable / max(1, p.total),
                  reduce_bytes=4.0 if job.precision.mixed else float(compute))  # fmt: skip
    allocated = sharding_buffer_bytes(strategy, **kwargs, xla=on_tpu)  # type: ignore[arg-type]
    return allocated, fsdp_stream_pool_bytes(strategy, **kwargs) if on_cuda else (0.0, 0.0)  # type: ignore[arg-type]


def _on_cuda(hw: Hardware) -> bool:
    """A GPU's CUDA (or ROCm) caching allocator, with its per-stream pools."""
    return hw.accelerator is not None and hw.accelerator.kind == "gpu"


def _peak(states: ModelStates, activations: float, forward_temporaries: float, optimizer_temporaries: float,
          catalog: Catalog, *, world_size: int, grads_live_in_forward: bool,
          stream_pool: tuple[float, float] = (0.0, 0.0)) -> MemoryBreakdown:  # fmt: skip
    """:func:`memory.step_peak` with the catalog's fixed overhead (CUDA context, communicator buffers) and the
    allocator's reserve fractions."""
    return step_peak(
        states=states,
        activations=activations,
        forward_temporaries=forward_temporaries,
        optimizer_temporaries=optimizer_temporaries,
        fixed_overhead=framework_overhead_bytes(cuda_context_gib=catalog.assumption("cuda_context_gib"),
                                                comm_buffers_gib=catalog.assumption("nccl_buffers_gib"),
                                                world_size=world_size),
        fragmentation=catalog.assumption("allocator_fragmentation"),
        expandable_fraction=catalog.assumption("allocator_fragmentation_expandable"),
        grads_live_in_forward=grads_live_in_forward,
        stream_pool=stream_pool,
    )


def parallel_rejection(job: TorchJob | TransformerJob, profile: StepProfile, hw: Hardware, strategy: Strategy) -> Rejection | None:
    """Why a model-parallel layout cannot be estimated for this job on this hardware (None: it can)."""
    if not hw.layout.model_parallel:
        return None
    if hw.accelerator is None or hw.accelerator.kind != "gpu":
        return Rejection(RejectKind.LAYOUT, "tensor / pipeline / context / expert parallel layouts are planned on GPUs")
    if profile.split is None:
        return Rejection(RejectKind.LAYOUT, "tensor / pipeline / context / expert parallel layouts are planned from the "
                         "formulas for full training of decoder models (not a trace, LoRA / QLoRA, encoder models or "
                         "activation offloading); use a data-parallel strategy")  # fmt: skip
    err = layout_error(profile.split, hw.layout, strategy)
    return Rejection(RejectKind.LAYOUT, err[1]) if err else None


def simulated_reserve(mem: MemoryBreakdown, profile: StepProfile, catalog: Catalog) -> MemoryBreakdown:
    """A traced step's reserve: the bytes the allocator simulation found beyond the traced peak, plus the default
    fraction of whatever the strategy allocates beyond that peak (sharding buffers, gathered blocks)."""
    beyond = max(0.0, mem.allocated - (profile.memory.single_device_peak or 0.0))
    reserve = (profile.memory.reserve_bytes or 0.0) + catalog.assumption("allocator_fragmentation") * beyond + mem.stream_pool
    slack = ((profile.memory.expandable_reserve_bytes or 0.0) + catalog.assumption("allocator_fragmentation_expandable") * beyond
             + mem.stream_pool)  # fmt: skip
    return replace(mem, overhead=mem.overhead - mem.fragmentation + reserve, fragmentation=reserve,
                   expandable_slack=min(reserve, slack))  # fmt: skip


def memory_rejection(mem: MemoryBreakdown, hw: Hardware, catalog: Catalog, source: ProfileSource) -> Rejection | None:
    """Device memory, then host RAM for offload: does the step fit?"""
    acc = hw.accelerator
    if acc is None:  # CPUs: the step lives in host RAM (estimate/cpu.py)
        return cpu_memory_rejection(mem, hw, catalog)
    capacity = (acc.memory_gib if acc else 0.0) * GIB
    if mem.peak > capacity:
        states = mem.weights + mem.gradients + mem.optimizer
        traced = "; traced step" if source is ProfileSource.TRACE else ""
        return Rejection(
            RejectKind.DEVICE_MEMORY,
            f"needs {mem.peak / GIB:.1f} GiB per {acc.id if acc else 'device'} > {capacity / GIB:.0f} GiB "
            f"(at the {mem.phase} peak: model states {states / GIB:.1f} = weights {mem.weights / GIB:.1f} + grads "
            f"{mem.gradients / GIB:.1f} + optimizer {mem.optimizer / GIB:.1f}; activations {mem.activations / GIB:.1f}; "
            f"overhead {mem.overhead / GIB:.1f}{traced})",
            needed=mem.peak,
            available=capacity,
            unit="bytes",
        )
    if mem.host:
        usable = hw.ram_gib_per_node * catalog.assumption("host_ram_usable_fraction") * GIB
        if mem.host > usable:
            return Rejection(
                RejectKind.HOST_MEMORY,
                f"offload needs {mem.host / GIB:.0f} GiB host RAM per node > {usable / GIB:.0f} GiB usable",
                needed=mem.host,
                available=usable,
                unit="bytes",
            )
    return None


def compose(
    job: TorchJob | TransformerJob,
    profile: StepProfile,
    hw: Hardware,
    strategy: Strategy,
    catalog: Catalog,
    *,
    efficiency: float | None = None,
    time_rejected: bool = True,
) -> Estimate:
    """Memory, time and cost of ``job`` (described by ``profile``) on ``hw`` with ``strategy``.

    ``efficiency`` is a measured fraction of peak (a calibration); without it the
    catalog's default for the accelerator and the model's width applies.  Without ``time_rejected`` an option
    rejected for its layout or its memory gets no step time (infinite): a plan over thousands of layouts times
    only what can run.
    """
    layout = hw.layout
    acc = hw.accelerator
    rejection = incompatibility(job, hw, strategy, profile) or parallel_rejection(job, profile, hw, strategy)
    global_batch = global_batch_of(job, hw)
    micro_steps = micro_steps_of(job, hw)
    steps = job.total_steps(global_batch)

    parallel = layout.model_parallel and profile.split is not None and rejection is None
    # a layout that cannot be estimated still shows the data-parallel figure of its devices
    mem_hw = hw if parallel or not layout.model_parallel else evolve(hw, layout=layout.split())
    mem = step_memory(job, profile, mem_hw, strategy, catalog, micro_steps=micro_steps)
    rejection = rejection or memory_rejection(mem, hw, catalog, profile.source)

    seconds, mfu, breakdown = float("inf"), None, {}
    notes = list(profile.notes)
    timed = rejection is None or time_rejected
    if timed and acc is not None:
        eff = efficiency if efficiency is not None else default_efficiency(catalog, acc.id, profile.mfu_width)
        if parallel:
            assert profile.split is not None
            loads = stage_loads(profile.split, layout, micro_steps)
            st = parallel_step_time(
                hw=hw, strategy=strategy, catalog=catalog, precision=job.precision, optimizer=job.optimizer,
                micro_steps=micro_steps, flops_forward=profile.flops.forward,
                flops_backward=profile.flops.backward + profile.flops.recompute, flops_model=profile.flops.model,
                trainable_local=max(ld.dense_params + ld.expert_params for ld in loads), efficiency=eff,
                model_split=profile.split, state_elems_per_param=profile.params.shaped_state_elems,
                split=profile.flops.split if efficiency is None else None, foreach_optimizer=profile.foreach_optimizer,
                tf32_matmul=profile.tf32_matmul, fp8_gather_fraction=profile.fp8_gather_fraction,
            )  # fmt: skip
        else:
            st = step_time(
                hw=hw, strategy=strategy, catalog=catalog, precision=job.precision, optimizer=job.optimizer,
                micro_steps=micro_steps, flops_forward=profile.flops.forward,
                flops_backward=profile.flops.backward + profile.flops.recompute, flops_model=profile.flops.model,
                trainable_params=profile.params.trainable, total_params=profile.params.total, efficiency=eff,
                state_elems_per_param=profile.params.shaped_state_elems,
                split=profile.flops.split if efficiency is None else None,  # a measured efficiency covers the whole step
                foreach_optimizer=profile.foreach_optimizer, tf32_matmul=profile.tf32_matmul,
                fp8_gather_fraction=profile.fp8_gather_fraction, optimizer_flops=profile.params.optimizer_flops,
            )  # fmt: skip
        seconds, mfu, breakdown = st.seconds, st.mfu, st.breakdown
        if st.reason and rejection is None:
            rejection = Rejection(RejectKind.MISSING_FIGURE, st.reason)
        if efficiency is not None:
            notes.append(f"efficiency {eff:.2f} from a measured run")
    elif timed:  # CPUs: the CPU time model (estimate/cpu.py)
        st = cpu_step_time(
            hw=hw, strategy=strategy, precision=job.precision, optimizer=job.optimizer, micro_steps=micro_steps,
            flops_executed=profile.flops.forward + profile.flops.backward + profile.flops.recompute,
            flops_model=profile.flops.model, activations=profile.memory.activations,
            trainable_params=profile.params.trainable, state_elems_per_param=profile.params.shaped_state_elems,
            eager=profile.eager, optimizer_flops=profile.params.optimizer_flops,
        )  # fmt: skip
        seconds, mfu, breakdown = st.seconds, st.mfu, st.breakdown
        if st.reason and rejection is None:
            rejection = Rejection(RejectKind.MISSING_FIGURE, st.reason)
        notes = cpu_notes(notes) + [n for n in (precision_note(job.precision, hw), hw.cpu.source if hw.cpu else None) if n]

    timing = job_timing(hw, train_s=steps * seconds)
    finite = seconds not in (0.0, float("inf"))
    band = "cpu" if acc is None else profile.source.value  # host RAM against trainplan run's peak RSS on CPUs
    return Estimate(
        kind=job.kind.value,
        strategy=strategy.value,
        hardware=hw,
        rejection=rejection,
        memory=mem,
        capacity_gib=acc.memory_gib if acc else cpu_capacity_bytes(hw, catalog) / GIB,
        step_time_s=seconds,
        steps=steps,
        train_s=timing.train_s,
        startup_s=timing.startup_s,
        cost_usd=timing.cost_usd,
        throughput=global_batch * profile.items_per_sample / seconds if finite else 0.0,
        throughput_unit=profile.throughput_unit,
        mfu=mfu,
        params=profile.params.total,
        trainable_params=profile.params.trainable,
        # the slowest rank's share, as the step time counts it (uneven stages: the fullest one)
        flops_per_step=micro_steps * profile.flops.hardware / (rank_flops_share(profile.split, layout) if parallel else 1),
        time_breakdown=breakdown,
        calibrated=efficiency is not None,
        notes=tuple(notes),
        trace=profile.trace,
        # the band measured for this kind of estimate (assumptions.yaml: memory_error_band_*)
        memory_band=catalog.assumption(f"memory_error_band_{band}"),
        memory_band_below=catalog.assumption(f"memory_error_band_{band}_below"),
    )


def _on_tpu(hw: Hardware) -> bool:
    return hw.accelerator is not None and hw.accelerator.kind == "tpu"
