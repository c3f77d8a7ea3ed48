"""Step time of a data-parallel training step: compute, exposed communication, optimizer, offload.

Shared by the analytic transformer estimator and the traced estimator, so both
apply the same strategy rules.  Sources of each term are cited in
``compute.py`` (FLOPs), ``comms.py`` (collectives) and below.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.catalog import Catalog
from trainplan.estimate.compute import KernelSplit
from trainplan.estimate.comms import Links, comm_plan, exposed_comm_seconds
from trainplan.estimate.parallel import ModelSplit, bubble_fraction, dp_group, parallel_comm, rank_flops_share
from trainplan.estimate.memory import gradient_bytes_per_param, optimizer_bytes_per_param, weight_bytes_per_param
from trainplan.estimate.result import Hardware
from trainplan.spec import Optimizer, Precision
from trainplan.strategies import Engine, Layout, Strategy
from trainplan.frozen import evolve


@dataclass(frozen=True)
class StepTime:
    seconds: float  # inf when it cannot be computed
    mfu: float | None
    breakdown: dict[str, float]
    reason: str | None  # why the time cannot be computed (missing bandwidth, no peak)


def matmul_efficiency(catalog: Catalog, accelerator_id: str, hidden: int) -> float:
    """Default fraction of dense peak a transformer training step reaches (MFU), by accelerator and width.

    ``mfu_large`` is the asymptote for wide models; narrow models lose to
    kernel-launch and memory-bound work: eff = mfu_large · h / (h + h_half).
    Both constants and their sources are in assumptions.yaml.
    """
    large = _by_accelerator(catalog, "mfu_large", accelerator_id)
    h_half = catalog.assumption("mfu_hidden_half")
    return large * hidden / (hidden + h_half)


def _by_accelerator(catalog: Catalog, key: str, accelerator_id: str) -> float:
    """An assumption's value for ``accelerator_id`` (its ``by_accelerator`` table), else its default."""
    table = catalog.assumptions.get(key, {}).get("by_accelerator", {}) or {}
    return float(table.get(accelerator_id, catalog.assumption(key)))


def gemm_efficiency(catalog: Catalog, accelerator_id: str) -> float:
    """Fraction of dense peak the matmuls of a training step reach (``gemm_efficiency`` in assumptions.yaml)."""
    return _by_accelerator(catalog, "gemm_efficiency", accelerator_id)


def attention_efficiency(catalog: Catalog, accelerator_id: str) -> float:
    """Fraction of dense peak a fused attention kernel reaches, forward + backward, FLOPs counted as FlashAttention
    counts them (causal half, backward 2.5× forward) — ``attention_efficiency`` in assumptions.yaml."""
    return _by_accelerator(catalog, "attention_efficiency", accelerator_id)


def default_efficiency(catalog: Catalog, accelerator_id: str, width: int | None) -> float:
    """The efficiency an estimate uses without a measured run: the transformer curve for a model
    of known width, else the traced default (``mfu_traced_default``, sourced in assumptions.yaml)."""
    if width is not None:
        return matmul_efficiency(catalog, accelerator_id, width)
    return catalog.assumption("mfu_traced_default")


def links_for(hw: Hardware, catalog: Catalog) -> Links:
    """Achievable bandwidths: the catalog's peak link figures × the NCCL bus-bandwidth fraction."""
    eff = catalog.assumption("comm_bw_efficiency")
    return Links(
        intra_gb_s=(hw.intra_node_bw_gb_s or 0.0) * eff or None,
        inter_node_gb_s=(hw.network_gbps or 0.0) / 8 * eff or None,
    )


def optimizer_bytes_touched(trainable_local: float, optimizer: Optimizer, precision: Precision, strategy: Strategy,
                            *, state_elems_per_param: float = 0.0, foreach: bool = False) -> float:  # fmt: skip
    """Bytes an optimizer step reads and writes.

    A fused kernel (``fused=True``, DeepSpeed's FusedAdam) makes one pass: read weights, gradients and state, write
    weights and state.  PyTorch's default Adam / AdamW on CUDA is the *foreach* implementation
    (torch/optim/adam.py ``_multi_tensor_adam``, torch 2.x), a sequence of multi-tensor kernels each of which reads
    and writes whole tensors: ``_foreach_mul_`` of the weights (AdamW's decoupled decay), ``_foreach_lerp_`` of the
    first moment with the gradient, ``_foreach_mul_`` and ``_foreach_addcmul_`` of the second moment, ``_foreach_sqrt``
    into a temporary, ``_foreach_div_`` and ``_foreach_add_`` (eps) of it, ``_foreach_addcdiv_`` into the weights —
    4w + 2g + 14s bytes a parameter (w weight, g gradient, s one state element) against the fused 2w + g + 4s.
    With ``foreach`` that count replaces the single pass for AdamW.
    """
    e = strategy.engine
    w = weight_bytes_per_param(precision, e)
    g = gradient_bytes_per_param(precision, e)
    o = optimizer_bytes_per_param(optimizer, precision, e, state_elems_per_param=state_elems_per_param)
    if foreach and optimizer is Optimizer.ADAMW:
        s = o / 2  # exp_avg and exp_avg_sq
        return trainable_local * (4 * w + 2 * g + 14 * s)
    return trainable_local * (2 * w + g + 2 * o)


def step_time(
    *,
    hw: Hardware,
    strategy: Strategy,
    catalog: Catalog,
    precision: Precision,
    optimizer: Optimizer,
    micro_steps: int,
    flops_forward: float,
    flops_backward: float,  # backward + recomputation, executed
    flops_model: float,  # MFU numerator per micro-step
    trainable_params: float,
    total_params: float,
    efficiency: float,
    state_elems_per_param: float = 0.0,
    split: KernelSplit | None = None,
    foreach_optimizer: bool = False,
    tf32_matmul: bool = False,
    fp8_gather_fraction: float = 0.0,
    optimizer_flops: float = 0.0,
) -> StepTime:
    """Seconds per optimizer step on ``hw`` with ``strategy``.

    compute = micro-steps × FLOPs / (dense peak × efficiency); with a
    ``split`` (analytic transformer profiles, no measured efficiency) the
    matmuls run at ``gemm_efficiency``, the fused attention kernel at
    ``attention_efficiency`` and the memory-bound ops take bytes / (HBM
    bandwidth × ``mem_bw_efficiency``) (roofline: Williams et al. 2009;
    Ivanov et al. 2021, "Data Movement Is All You Need"); communication
    after overlap (comms.py); the optimizer step is memory-bound (bytes touched
    / HBM bandwidth × its achievable fraction); offload replaces it with a CPU
    step bound by host memory bandwidth, shared by the node's ranks, plus PCIe
    transfers of gradients down and 16-bit weights up (Ren et al. 2021,
    "ZeRO-Offload", Sec. 4.1); ZeRO-3 offload also streams the parameter shard
    in for every forward and backward (Rajbhandari et al. 2021, "ZeRO-Infinity").
    ``optimizer_flops`` (Muon's Newton-Schulz matmuls, every rank on every matrix under single and DDP) run
    in bf16 (torch.optim.Muon casts the update with ``.bfloat16()``) at ``gemm_efficiency``.
    """
    acc = hw.accelerator
    dtype = precision.half or "fp32"
    peak = ((acc.peak_tflops(dtype) or acc.peak_tflops("fp32") or 0.0) * 1e12) if acc else 0.0
    if acc is None or peak <= 0:
        return StepTime(float("inf"), None, {}, f"{acc.id if acc else 'CPU'} has no published peak for {dtype}")
    layout = hw.layout
    n = layout.world_size
    if split is not None and dtype == "fp32" and acc.peak_fp32_tflops and not tf32_matmul:
        # a transformer's fp32 matmuls run on the plain fp32 units: PyTorch leaves TF32 off for matmuls unless asked
        # (torch.backends.cuda.matmul.allow_tf32 is False by default since 1.12, "TensorFloat-32 (TF32) on Ampere
        # (and later) devices" in PyTorch's CUDA semantics notes); cuDNN convolutions do use it (traced profiles).
        # knobs.tf32_matmul: the job's code asks for it, so they run at the TF32 peak (peak_tflops("fp32"))
        peak = acc.peak_fp32_tflops * 1e12
    if split is None:
        t_fwd = flops_forward / (peak * efficiency)
        t_bwd = flops_backward / (peak * efficiency)
    else:
        e_mm, e_attn = gemm_efficiency(catalog, acc.id), attention_efficiency(catalog, acc.id)
        bw = acc.mem_bandwidth_gb_s * 1e9 * catalog.assumption("mem_bw_efficiency")
        a_f, a_b = split.attention_forward, split.attention_backward
        # precision fp8: the linear layers' GEMMs at the FP8 peak (the same fraction of it: no FP8 GEMM
        # efficiency was measured apart); everything else at the 16-bit peak
        peak8 = (acc.peak_fp8_tflops or 0.0) * 1e12
        f8_f, f8_b = (split.fp8_forward, split.fp8_backward) if peak8 > 0 else (0.0, 0.0)
        # eager PyTorch on a GPU with fp32 weights under autocast (one device, DDP): autocast's casts are kernels of
        # their own. XLA fuses them; DeepSpeed keeps 16-bit working weights; FSDP's mixed precision gathers the
        # parameters in their 16-bit param_dtype (torch.distributed.fsdp MixedPrecision / MixedPrecisionPolicy), so
        # only the local shard is cast, once per gather
        eager = acc.kind == "gpu" and strategy.engine is Engine.TORCH
        # fp32 matmuls outside autocast (the indexer's scores under bf16-pure) on the plain fp32 units, or at the TF32
        # peak where the job turns TF32 on (knobs.tf32_matmul); the same GEMM efficiency
        peak32 = (acc.peak_tflops("fp32") if tf32_matmul else acc.peak_fp32_tflops) or 0.0
        f32_f, f32_b = (split.fp32_forward, split.fp32_backward) if peak32 > 0 and dtype != "fp32" else (0.0, 0.0)
        slow_f = f32_f / (peak32 * 1e12 * e_mm) if f32_f else 0.0
        slow_b = f32_b / (peak32 * 1e12 * e_mm) if f32_b else 0.0
        t_fwd = ((flops_forward - a_f - f8_f - f32_f) / (peak * e_mm) + (f8_f / (peak8 * e_mm) if f8_f else 0.0) + slow_f
                 + a_f / (peak * e_attn) + (split.bytes_forward + (split.amp_forward if eager else 0.0)) / bw)  # fmt: skip
        t_bwd = ((flops_backward - a_b - f8_b - f32_b) / (peak * e_mm) + (f8_b / (peak8 * e_mm) if f8_b else 0.0) + slow_b
                 + a_b / (peak * e_attn) + (split.bytes_backward + (split.amp_backward if eager else 0.0)) / bw)  # fmt: skip
    reason = None
    try:
        plan = comm_plan(strategy, layout=layout, links=links_for(hw, catalog), trainable_params=trainable_params,
                         total_params=total_params, precision=precision, fp8_gather_fraction=fp8_gather_fraction)  # fmt: skip
        t_comm = exposed_comm_seconds(plan, micro_steps=micro_steps, t_forward=t_fwd, t_backward=t_bwd,
                                      overlap=catalog.assumption("comm_overlap"))  # fmt: skip
    except ValueError as exc:
        t_comm, reason = float("inf"), str(exc)
    local = trainable_params / (n if strategy.shards_optimizer else 1)
    touched = optimizer_bytes_touched(local, optimizer, precision, strategy, state_elems_per_param=state_elems_per_param,
                                      # PyTorch's own optimizer on a GPU: DeepSpeed steps with its fused kernel (or its
                                      # CPU Adam when offloading), XLA (TPU) compiles the update into fused kernels
                                      foreach=foreach_optimizer and strategy.engine is not Engine.DEEPSPEED
                                      and not strategy.offloads_optimizer and acc.kind == "gpu")  # fmt: skip
    t_opt = t_offload = 0.0
    if strategy.offloads_optimizer:
        pcie = catalog.assumption("pcie_gb_s") * 1e9
        t_offload = touched * layout.gpus_per_node / (catalog.assumption("host_mem_bw_gb_s") * 1e9)
        if strategy.engine is Engine.FSDP and strategy.offloads_parameters:
            # FSDP's CPU offload keeps the parameter shard (fp32 under mixed precision) on the host and copies it
            # to the device at every unshard — forward and backward (torch/distributed/fsdp/_flat_param.py,
            # _use_low_precision_shard: _local_shard.to(device)) — and copies each sharded gradient to the host
            # after every reduce-scatter (_runtime_utils.py, _offload_grad); the optimizer steps the host shard.
            w = weight_bytes_per_param(precision, strategy.engine)
            g = gradient_bytes_per_param(precision, strategy.engine)
            t_offload += micro_steps * (2 * (total_params / n) * w + local * g) / pcie
        else:
            t_offload += local * (4 + precision.compute_bytes) / pcie
            if strategy.offloads_parameters:
                t_offload += micro_steps * 2 * (total_params / n) * precision.compute_bytes / pcie
    else:
        t_opt = touched / (acc.mem_bandwidth_gb_s * 1e9 * catalog.assumption("mem_bw_efficiency"))
    if optimizer_flops:
        peak16 = (acc.peak_tflops("bf16") or acc.peak_tflops("fp32") or 0.0) * 1e12
        t_opt += optimizer_flops / (peak16 * gemm_efficiency(catalog, acc.id))
    compute = micro_steps * (t_fwd + t_bwd)
    total = compute + t_comm + t_opt + t_offload
    mfu = micro_steps * flops_model / (total * peak) if 0 < total < float("inf") else None
    breakdown = {"compute_s": compute, "comm_exposed_s": t_comm, "optimizer_s": t_opt, "offload_s": t_offload}
    return StepTime(total, mfu, breakdown, reason)


def parallel_step_time(
    *,
    hw: Hardware,
    strategy: Strategy,
    catalog: Catalog,
    precision: Precision,
    optimizer: Optimizer,
    micro_steps: int,
    flops_forward: float,
    flops_backward: float,
    flops_model: float,
    trainable_local: float,
    efficiency: float,
    model_split: ModelSplit,
    state_elems_per_param: float = 0.0,
    split: KernelSplit | None = None,
    foreach_optimizer: bool = False,
    tf32_matmul: bool = False,
    fp8_gather_fraction: float = 0.0,
) -> StepTime:
    """Seconds per optimizer step of a tensor / pipeline / context / expert parallel layout.

    Each rank computes 1/(tp·pp·cp) of every micro-batch's FLOPs (its shard of each layer, its stage, its part of
    the sequence) at the single-device rates of :func:`step_time`; the data-parallel strategy's collectives run over
    the rank's data-parallel group (:func:`~trainplan.estimate.parallel.dp_group`, with its share of the node's
    network) on its shard of the parameters; the model-parallel collectives of each micro-batch
    (:func:`~trainplan.estimate.parallel.parallel_comm`) are added on the critical path — tensor-parallel
    all-reduces, expert all-to-alls and pipeline sends are not overlapped (Megatron-LM without its optional
    communication overlap), context parallelism's ring exchange hides behind compute up to ``comm_overlap``
    (Ring Attention overlaps it with the attention of the chunk in hand) — and the pipeline bubble adds
    (p − 1)/v micro-batch times (Narayanan et al. 2021, Sec. 2.2).
    """
    layout = hw.layout
    shard = rank_flops_share(model_split, layout)
    g, nodes = dp_group(layout)
    per_node = layout.gpus_per_node
    dp_hw = evolve(hw, layout=Layout(gpus_per_node=g, nodes=nodes),
                    network_gbps=(hw.network_gbps or 0.0) * g / per_node or None)  # fmt: skip
    # Under a pipeline schedule the data-parallel collectives run once per step, not per micro-batch: FSDP keeps the
    # stage's parameters gathered across its micro-batches and reduces the gradients after the last one (Llama 3,
    # Dubey et al. 2024, Sec. 3.3.2: "we do not reshard after forward computation"; torchtitan turns
    # reshard_after_forward off under PP), so the step is priced as one micro-step of m times the work.
    once = layout.pp > 1
    scale = (micro_steps if once else 1) / shard
    kernels = None
    if split is not None:
        kernels = KernelSplit(*(getattr(split, f) * scale for f in (
            "attention_forward", "attention_backward", "bytes_forward", "bytes_backward", "fp8_forward", "fp8_backward",
            "amp_forward", "amp_backward", "fp32_forward", "fp32_backward")))
    base = step_time(hw=dp_hw, strategy=strategy, catalog=catalog, precision=precision, optimizer=optimizer,
                     micro_steps=1 if once else micro_steps, flops_forward=scale * flops_forward,
                     flops_backward=scale * flops_backward, flops_model=scale * flops_model,
                     trainable_params=trainable_local, total_params=trainable_local, efficiency=efficiency,
                     state_elems_per_param=state_elems_per_param, split=kernels,
                     foreach_optimizer=foreach_optimizer, tf32_matmul=tf32_matmul,
                     fp8_gather_fraction=fp8_gather_fraction)  # fmt: skip
    if base.reason:
        return base
    try:
        comm = parallel_comm(model_split, layout, links_for(hw, catalog))
    except ValueError as exc:
        return StepTime(float("inf"), None, base.breakdown, str(exc))
    m = micro_steps
    per_micro = base.breakdown["compute_s"] / m
    context = max(0.0, comm.context - catalog.assumption("comm_overlap") * per_micro)
    model_comm = comm.tensor + comm.expert + comm.pipeline + context
    bubble = bubble_fraction(layout, m) * m * (per_micro + model_comm)
    total = base.seconds + m * model_comm + bubble
    breakdown = dict(base.breakdown, tp_comm_s=m * comm.tensor, cp_comm_exposed_s=m * context, ep_comm_s=m * comm.expert,
                     pp_comm_s=m * comm.pipeline, pipeline_bubble_s=bubble)  # fmt: skip
    # the same m micro-batches of model FLOPs as the data-parallel part, over the longer step
    mfu = base.mfu * base.seconds / total if base.mfu is not None else None
    return StepTime(total, mfu, breakdown, None)
