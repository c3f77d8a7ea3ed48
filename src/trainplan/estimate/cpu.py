"""The CPU as the device of a neural-network training step: its rules, its memory and its step time.

An option without an accelerator (``Hardware.accelerator is None``) trains in one process on every core
(strategy ``single``), as ``trainplan run`` does on a CPU.  The composer (``compose.py``) calls this module
for such options; the GPU path never does.

* **Rules** (:func:`cpu_incompatibility`): one process, so DDP / ZeRO / FSDP across processes are not
  planned; offload moves model states from GPU memory to host RAM, and on a CPU they are there already;
  bitsandbytes (QLoRA, 8-bit Adam) needs CUDA; fp16 needs fp16 arithmetic units (AVX512-FP16); bf16 runs on
  bf16 units (AVX512_BF16, AMX) where the CPU has them, else it is computed via fp32 (:func:`compute_dtype`).
* **Memory** (:func:`cpu_memory`, :func:`cpu_capacity_bytes`): host RAM is the device memory.  The tensors
  of the step are the profile's (weights, gradients, optimizer state, activations, temporaries); there is
  no CUDA context and no caching-allocator reserve.  What a CPU process adds instead is PyTorch's CPU
  runtime (the kernel libraries' code and buffers, faulted in by the first step): ``cpu_runtime_overhead_gib``
  (assumptions.yaml, measured) or the probe's measurement of this machine; and what glibc's heap keeps
  resident beyond the live tensors once its dynamic mmap threshold has risen (``estimate/heap.py``, replayed
  over the traced step repeated; only a trace for a CPU target has that sequence).  The capacity is the
  machine's RAM × ``host_ram_usable_fraction``.
* **Time** (:func:`cpu_step_time`): a roofline sum (Williams, Waterman & Patterson 2009, "Roofline: an
  insightful visual performance model", CACM 52(4)) of the step's matmul work at the cores' matmul rate and
  its memory-bound work at the memory bandwidth, plus, for a traced step, what each operator costs an eager
  step whatever its size (dispatch, autograd's bookkeeping, torch.optim's Python loop)::

      traced:   t = micro-steps × ((FLOPs − conv − rnn) / R + conv / (R × c) + rnn / (R × r) + op bytes / E + ops × o)
                  + optimizer ops × o + optimizer op bytes / B
      analytic: t = micro-steps × (FLOPs / R + saved activations / A) + optimizer bytes / B

  ops, op bytes: the operators the trace dispatched and the bytes the memory-bound ones (no FLOP formula, not
  views) read and write (``trace/flops.py``), forward + backward and in the optimizer step.  o: the per-operator
  overhead the probe measures on tiny steps (``measure/cpu_rate.py: operator_overhead_us``; catalog CPUs:
  ``cpu_operator_overhead_us``).  E: the element-wise rate A in bytes moved (A × ``cpu_operator_bytes_per_saved_byte``,
  the same timing counted in the operators' bytes).  conv, rnn: the FLOPs of convolutions and of oneDNN's fused
  recurrent layers (``trace/flops.py: KERNEL_CLASSES``); c, r: their rates over the GEMM rate, measured by the
  probe on a small CNN's convolutions and an LSTM layer (``measure/cpu_rate.py: conv_efficiency``,
  ``rnn_efficiency``; catalog CPUs: ``cpu_conv_efficiency``, ``cpu_rnn_efficiency``).

  R = cores × FLOPs/cycle/core × all-core clock × ``cpu_matmul_efficiency`` (cpus.csv, vendor ISA
  documents; see ``estimate/hardware.py: cpu_rates_from_spec``), or the matmul rate ``trainplan probe``
  measured here.  A = the rate at which the element-wise layers (norms, nonlinearities) get through the
  activations they save, forward and backward: measured (``measure/cpu_rate.py: activation_rate_gb_s``;
  on a CPU these kernels are compute-bound at a few GB/s per core, far below the DRAM bandwidth), scaled to
  other CPUs by cores, clock and vector width.  B = the DRAM bandwidth share × ``cpu_mem_bw_efficiency``, or
  the measured copy bandwidth: the optimizer step streams its states once per step.
  Terms are added, not overlapped: an eager PyTorch step runs one kernel at a time.
"""

from __future__ import annotations

from trainplan.catalog import Catalog
from trainplan.estimate.hardware import CpuRates, Hardware
from trainplan.estimate.memory import GIB, MemoryBreakdown
from trainplan.estimate.profile import EagerOps
from trainplan.estimate.result import Rejection, RejectKind
from trainplan.estimate.steptime import StepTime, optimizer_bytes_touched
from trainplan.spec import Method, Optimizer, Precision, TorchJob, TransformerJob
from trainplan.strategies import Strategy

def _cpu_name(hw: Hardware) -> str:
    return hw.cpu_model or "this CPU"


def has_native(rates: CpuRates, dtype: str) -> bool:
    """The cores have units for ``dtype`` at least as fast as their fp32 units.

    A catalog CPU lists a rate only for dtypes it has units for (cpus.csv); a measured machine's bf16 rate
    below its fp32 rate means bf16 is emulated (PyTorch on AVX2 converts element by element).
    """
    rate = rates.rate(dtype)
    fp32 = rates.rate("fp32") or 0.0
    return rate is not None and (not rates.measured or rate >= fp32)


def compute_dtype(precision: Precision, rates: CpuRates) -> str:
    """The dtype whose matmul rate times the step: fp32; bf16 on bf16 units; bf16 without them via fp32."""
    half = precision.half
    if half is None or not has_native(rates, half):
        return "fp32"
    return half


def precision_note(precision: Precision, hw: Hardware) -> str | None:
    """Say how a 16-bit job is computed on these cores (None for fp32, or when it has no rates)."""
    rates = hw.cpu
    half = precision.half
    if half is None or rates is None:
        return None
    if has_native(rates, half):
        return f"{half} on {_cpu_name(hw)}: computed on its {half} units"
    return (f"{half} on {_cpu_name(hw)}: no {half} units, computed via fp32 (matmuls timed at the fp32 rate; "
            f"trainplan run trains in fp32 on CPUs)")  # fmt: skip


def cpu_notes(profile_notes: list[str]) -> list[str]:
    """The profile's notes for a CPU option: a trace's CUDA conventions are replaced by what the CPU estimate uses."""
    cuda = [n for n in profile_notes if n.startswith("traced on the fake CPU device with CUDA")]
    kept = [n for n in profile_notes if n not in cuda]
    if cuda:
        kept.append("on CPUs: the traced tensors, with torch.optim's per-parameter optimizer step and no CUDA allocator")
    return kept


def cpu_incompatibility(job: TorchJob | TransformerJob, hw: Hardware, strategy: Strategy) -> Rejection | None:
    """The first CPU rule ``job`` × ``hw`` × ``strategy`` breaks, or None (see the module docstring)."""
    if strategy.offloads_optimizer or strategy.offloads_parameters:
        return Rejection(RejectKind.PLATFORM, f"{strategy.value} offloads GPU memory to host RAM; on CPUs the states "
                         "are in host RAM already: use single")  # fmt: skip
    if strategy is not Strategy.SINGLE:
        return Rejection(RejectKind.LAYOUT, f"{strategy.value} is not planned on CPUs: one process uses every core "
                         "(single); several processes on one CPU only split the same cores and memory")  # fmt: skip
    qlora = isinstance(job, TransformerJob) and job.method is Method.QLORA
    if qlora or job.optimizer is Optimizer.ADAM8BIT:
        what = "QLoRA" if qlora else "adam8bit"
        return Rejection(RejectKind.PLATFORM, f"bitsandbytes ({what}) needs CUDA GPUs; on CPUs use "
                         f"{'method: lora' if qlora else 'optimizer: adamw'}")  # fmt: skip
    rates = hw.cpu
    if rates is None:
        return Rejection(RejectKind.MISSING_FIGURE, f"no CPU figures for {_cpu_name(hw)}: add its row to cpus.csv, "
                         "or run `trainplan probe` on this machine")  # fmt: skip
    if job.precision is Precision.FP16 and not has_native(rates, "fp16"):
        return Rejection(RejectKind.PRECISION, f"{_cpu_name(hw)} has no fp16 units; use precision: bf16 "
                         "(computed via fp32 where there are no bf16 units) or fp32")  # fmt: skip
    return None


def cpu_runtime_overhead_bytes(hw: Hardware, catalog: Catalog, *, hugging_face: bool = False) -> float:
    """PyTorch's CPU runtime in a training process: measured on this machine, else ``cpu_runtime_overhead_gib``;
    with ``hugging_face`` (a transformer job, trained as a Hugging Face model) also ``cpu_transformers_import_gib``."""
    measured = hw.cpu.runtime_overhead_bytes if hw.cpu is not None else None
    runtime = measured if measured is not None else catalog.assumption("cpu_runtime_overhead_gib") * GIB
    return runtime + (catalog.assumption("cpu_transformers_import_gib") * GIB if hugging_face else 0.0)


def cpu_memory(mem: MemoryBreakdown, hw: Hardware, catalog: Catalog, *, hugging_face: bool = False,
               heap_retention: float | None = None) -> MemoryBreakdown:  # fmt: skip
    """The step's peak on a CPU: the tensors of ``mem`` (the composer's GPU conventions) without the CUDA context
    and the caching allocator's reserve, plus PyTorch's CPU runtime (reported as the context) and what glibc's heap
    keeps beyond the live tensors, where a trace for a CPU target simulated it (``heap_retention``, estimate/heap.py;
    reported as the fragmentation)."""
    runtime = cpu_runtime_overhead_bytes(hw, catalog, hugging_face=hugging_face)
    kept = heap_retention or 0.0
    tensors_overhead = mem.overhead - mem.context - mem.fragmentation
    return MemoryBreakdown(
        weights=mem.weights,
        gradients=mem.gradients,
        optimizer=mem.optimizer,
        activations=mem.activations,
        overhead=tensors_overhead + runtime + kept,
        host=0.0,
        phase=mem.phase,
        context=runtime,
        fragmentation=kept,
        expandable_slack=0.0,
    )


#: Parameter-sized fp32 temporaries alive at once in torch.optim's single-tensor step (the CPU default):
#: AdamW ``denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`` holds the square root and the quotient
#: (torch/optim/adam.py ``_single_tensor_adam``); Lion its update direction (``estimate/trace/optimizers.py``).
LOOP_TEMPORARIES = {Optimizer.ADAMW: 2, Optimizer.LION: 1}


def cpu_optimizer_temporary_bytes(optimizer: Optimizer, foreach_bytes: float, largest_tensor: int) -> float:
    """Temporaries of the optimizer step on a CPU: torch.optim steps one parameter at a time there (``foreach``
    is the default only for CUDA tensors, torch/optim/optimizer.py ``_default_to_fused_or_foreach``), so the
    largest parameter's temporaries, never more than the profile's multi-tensor (``foreach``) figure."""
    per_param = LOOP_TEMPORARIES.get(optimizer, 0)
    if not foreach_bytes or not largest_tensor:
        return foreach_bytes
    return min(foreach_bytes, per_param * 4.0 * largest_tensor)


def cpu_capacity_bytes(hw: Hardware, catalog: Catalog) -> float:
    """Host RAM a training process may use: the machine's RAM × ``host_ram_usable_fraction``."""
    return hw.ram_gib_per_node * catalog.assumption("host_ram_usable_fraction") * GIB


def cpu_memory_rejection(mem: MemoryBreakdown, hw: Hardware, catalog: Catalog) -> Rejection | None:
    """Does the step fit in host RAM?"""
    usable = cpu_capacity_bytes(hw, catalog)
    if mem.peak <= usable:
        return None
    states = mem.weights + mem.gradients + mem.optimizer
    return Rejection(
        RejectKind.HOST_MEMORY,
        f"needs {mem.peak / GIB:.1f} GiB of host RAM > {usable / GIB:.1f} GiB usable "
        f"({hw.ram_gib_per_node:g} GiB × {catalog.assumption('host_ram_usable_fraction'):g}) (at the {mem.phase} peak: "
        f"model states {states / GIB:.1f}, activations {mem.activations / GIB:.1f}, overhead {mem.overhead / GIB:.1f})",
        needed=mem.peak,
        available=usable,
        unit="bytes",
    )


def cpu_step_time(
    *,
    hw: Hardware,
    strategy: Strategy,
    precision: Precision,
    optimizer: Optimizer,
    micro_steps: int,
    flops_executed: float,  # forward + backward + recompute, one micro-step
    flops_model: float,  # MFU numerator, one micro-step
    activations: float,  # saved activations of one micro-step, bytes
    trainable_params: float,
    state_elems_per_param: float = 0.0,
    eager: EagerOps | None = None,
    optimizer_flops: float = 0.0,
) -> StepTime:
    """Seconds per optimizer step on ``hw``'s cores (formula and sources in the module docstring).

    The breakdown names each term: ``compute_s`` (matmul FLOPs / R; a traced step's convolution and fused recurrent
    FLOPs / (R × their efficiency)), ``memory_s`` (the element-wise work),
    ``optimizer_s`` (the optimizer step's bytes / B) and, for a traced step (``eager``), ``dispatch_s``
    (operators × the per-operator overhead).  With ``eager`` the element-wise work is the bytes the step's
    memory-bound operators read and write at their byte rate, and the optimizer's bytes are the ones its
    traced operators move (torch.optim's per-parameter loop); without it, saved activations / A and
    ``steptime.optimizer_bytes_touched``.
    """
    rates = hw.cpu
    if rates is None:
        return StepTime(float("inf"), None, {}, f"no CPU figures for {_cpu_name(hw)}")
    dtype = compute_dtype(precision, rates)
    rate = rates.rate(dtype) or 0.0
    bw, act = rates.mem_bw_bytes_s, rates.activation_bytes_s
    if rate <= 0 or bw <= 0 or act <= 0:
        return StepTime(float("inf"), None, {}, f"no {dtype} matmul rate or memory bandwidth for {_cpu_name(hw)}")
    conv, rnn = (eager.conv_flops, eager.rnn_flops) if eager is not None else (0.0, 0.0)
    terms = {"compute_s": micro_steps * ((flops_executed - conv - rnn) / rate + conv / (rate * rates.conv_efficiency)
                                         + rnn / (rate * rates.rnn_efficiency))}  # fmt: skip
    if eager is not None and rates.operator_bytes_s > 0:
        terms["memory_s"] = micro_steps * eager.memory_bytes / rates.operator_bytes_s
        terms["dispatch_s"] = (micro_steps * eager.ops + eager.optimizer_ops) * rates.operator_overhead_s
        terms["optimizer_s"] = eager.optimizer_memory_bytes / bw
    else:
        terms["memory_s"] = micro_steps * activations / act
        terms["optimizer_s"] = optimizer_bytes_touched(trainable_params, optimizer, precision, strategy,
                                                       state_elems_per_param=state_elems_per_param) / bw  # fmt: skip
    if optimizer_flops:  # Muon's Newton-Schulz matmuls, in bf16 (torch.optim.Muon), at this CPU's bf16 matmul rate
        terms["optimizer_s"] += optimizer_flops / (rates.rate(compute_dtype(Precision.BF16, rates)) or rate)
    total = sum(terms.values())
    peak = rates.peak_rate(dtype) or rate
    mfu = micro_steps * flops_model / (total * peak) if total > 0 else None
    return StepTime(total, mfu, terms, None)
