"""Can this job run on this hardware with this strategy at all?  The compatibility rules, once.

Checked before any memory or time is estimated; each rule returns a typed
:class:`~trainplan.estimate.result.Rejection`.  Memory and host-RAM verdicts
are the composer's (``compose.py``); tabular jobs have their own rules
(``tabular.tabular_reason``).
"""

from __future__ import annotations

from trainplan.catalog import Accelerator
from trainplan.estimate.cpu import cpu_incompatibility
from trainplan.estimate.profile import StepProfile
from trainplan.estimate.result import Hardware, Rejection, RejectKind
from trainplan.spec import Method, Optimizer, Precision, TorchJob, TransformerJob
from trainplan.strategies import Engine, Layout, Strategy


def global_batch_of(job: TorchJob | TransformerJob, hw: Hardware) -> int:
    """The job's global batch, or one micro-batch per data-parallel rank when it names none."""
    return job.global_batch or job.micro_batch * hw.layout.data_parallel


def micro_steps_of(job: TorchJob | TransformerJob, hw: Hardware) -> int:
    """Micro-batches each data-parallel rank runs per optimizer step (gradient accumulation, or the pipeline's m)."""
    return max(1, global_batch_of(job, hw) // (job.micro_batch * hw.layout.data_parallel))


def incompatibility(job: TorchJob | TransformerJob, hw: Hardware, strategy: Strategy,
                    profile: StepProfile | None = None) -> Rejection | None:  # fmt: skip
    """The first rule ``job`` × ``hw`` × ``strategy`` (× the stack's knobs in ``profile``) breaks, or None."""
    acc = hw.accelerator
    layout = hw.layout
    if profile is not None and strategy.engine not in profile.engines:
        runs = ", ".join(e.value for e in profile.engines)
        return Rejection(RejectKind.PLATFORM, f"stack {profile.stack} does not run {strategy.engine.value} ({strategy.value}); it runs {runs}")
    if acc is None:  # CPUs: their own rules (estimate/cpu.py), then the batch rules below
        cpu_rejection = cpu_incompatibility(job, hw, strategy)
        if cpu_rejection is not None:
            return cpu_rejection
    if job.optimizer is Optimizer.MUON:
        muon = _muon_rejection(acc, layout, strategy)
        if muon is not None:
            return muon
    if strategy.multi_device_only and layout.world_size == 1:
        return Rejection(RejectKind.LAYOUT, f"{strategy.value} needs more than one device")
    if strategy is Strategy.SINGLE and layout.world_size > 1:
        return Rejection(RejectKind.LAYOUT, "single uses one device; pick ddp, zero*, or fsdp for several")
    if job.precision is Precision.FP8 and (acc is None or acc.peak_fp8_tflops is None):
        what = acc.id if acc is not None else "a CPU"
        return Rejection(RejectKind.PRECISION, f"{what} has no FP8 tensor cores (they start with Hopper, Ada and "
                                               "MI300: H100, H200, B200, L40S, MI300X …); use precision: bf16")  # fmt: skip
    half = job.precision.half
    if half and acc is not None and acc.peak_tflops(half) is None:
        alt = "fp16" if acc.peak_fp16_tflops else "fp32"
        return Rejection(RejectKind.PRECISION, f"{acc.id} has no {half} tensor cores; use precision: {alt}")
    if acc is not None and acc.kind == "tpu":
        if strategy.engine is Engine.DEEPSPEED:
            return Rejection(RejectKind.PLATFORM, "DeepSpeed does not run on TPUs; use fsdp or ddp (PyTorch/XLA)")
        if strategy is Strategy.FSDP_OFFLOAD:
            # torch_xla.distributed.fsdp.XlaFullyShardedDataParallel takes no CPU-offload argument
            return Rejection(RejectKind.PLATFORM, "PyTorch/XLA's FSDP has no CPU offload; use fsdp on TPUs")
        qlora = isinstance(job, TransformerJob) and job.method is Method.QLORA
        if qlora or job.optimizer is Optimizer.ADAM8BIT:
            return Rejection(RejectKind.PLATFORM, "bitsandbytes (QLoRA, 8-bit Adam) needs CUDA GPUs")
    if layout.world_size > 1 and layout.gpus_per_node > 1 and not hw.intra_node_bw_gb_s:
        return Rejection(RejectKind.MISSING_FIGURE, "no intra-node interconnect figure for this hardware")
    if layout.nodes > 1 and not hw.network_gbps:
        return Rejection(RejectKind.MISSING_FIGURE, "no network bandwidth figure for multi-node use")
    dp = job.micro_batch * layout.data_parallel
    global_batch = global_batch_of(job, hw)
    if global_batch % dp:
        return Rejection(
            RejectKind.BATCH,
            f"global_batch {global_batch} is not a multiple of micro_batch × data-parallel "
            f"({job.micro_batch}×{layout.data_parallel})",
        )
    if profile is not None and profile.memory.transient_gradients:
        if strategy.engine is Engine.DEEPSPEED:
            return Rejection(RejectKind.PLATFORM, "optimizer_in_backward is a PyTorch hook; DeepSpeed steps its own optimizer")
        if global_batch > dp:
            return Rejection(RejectKind.BATCH, f"optimizer_in_backward cannot accumulate gradients: global_batch {global_batch} "
                             f"needs {global_batch // dp} micro-steps of {job.micro_batch}×{layout.data_parallel}")  # fmt: skip
    return None


def _muon_rejection(acc: Accelerator | None, layout: Layout, strategy: Strategy) -> Rejection | None:
    """Muon is planned where torch.optim.Muon steps whole matrices: one device, or DDP (every rank steps every
    matrix).  On sharded parameters (FSDP2's DTensors) it does run and matches the unsharded step up to bf16
    rounding, but through DTensor redistributions — 15 all-gathers and an all-reduce per wide matrix per step, 11
    all-reduces per tall one (``benchmarks/muon_sharded.py``) — whose cost trainplan does not model; ZeRO's flat
    partitions, tensor / pipeline / expert layouts and PyTorch/XLA are not modelled either."""
    if acc is not None and acc.kind == "tpu":
        return Rejection(RejectKind.PLATFORM, "muon is modelled for PyTorch on GPUs and CPUs, not for PyTorch/XLA on TPUs")
    if strategy not in (Strategy.SINGLE, Strategy.DDP) or layout.model_parallel:
        where = f"{strategy.value}" + (f" with {layout.describe()}" if layout.model_parallel else "")
        return Rejection(RejectKind.PLATFORM, f"muon is planned with single and ddp, where torch.optim.Muon steps whole "
                         f"matrices; on {where} its sharded Newton-Schulz step is not modelled")  # fmt: skip
    return None
