"""What a trace returns: :class:`TraceResult` and its :class:`MemoryBreakdown`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemoryBreakdown", "TraceResult"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of device memory by what they hold."""

    parameters: int  # parameters and buffers
    gradients: int
    optimizer: int  # optimizer state
    activations: int  # saved for backward, outputs, the batch, recomputed tensors
    temporaries: int  # born in backward or the optimizer step and not kept

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.temporaries


@dataclass(frozen=True)
class TraceResult:
    """What one traced training step needs, for the whole micro-batch on one device."""

    params: int  # all parameters (frozen included), each shared parameter once
    trainable_params: int
    flops_forward: float
    flops_backward: float  # backward kernels, without recomputation
    flops_recompute: float  # forward ops recomputed by activation checkpointing
    peak_bytes: int
    at_peak: MemoryBreakdown
    peak_phase: str  # "forward" | "backward" | "optimizer"
    state_bytes: MemoryBreakdown  # params / grads / optimizer state held after the step; activations 0
    activation_peak_bytes: int  # highest activations + temporaries during forward and backward
    notes: tuple[str, ...] = ()  # approximations applied, in words
    optimizer_temporary_bytes: int = 0  # highest temporaries during optimizer.step() (foreach buffers)
    reserve_fraction: float = 0.0  # the caching allocator's reserved beyond allocated at its peak (simulated)
    expandable_reserve_fraction: float = 0.0  # the same with expandable_segments
    reserve_bytes: int = 0  # reserved beyond allocated at the simulated peaks, in bytes
    expandable_reserve_bytes: int = 0
    # a CPU target: resident beyond live bytes when the step repeats through glibc's malloc (estimate/heap.py);
    # None for a CUDA target
    heap_retention_bytes: int | None = None
    # operators dispatched and bytes the memory-bound ones read and write (trace/flops.py): forward + backward
    # (recomputation included), and the optimizer step
    ops_step: int = 0
    memory_bytes_step: int = 0
    ops_optimizer: int = 0
    memory_bytes_optimizer: int = 0
    # the convolutions' and fused recurrent layers' shares of the step's FLOPs (forward + backward + recompute)
    conv_flops_step: int = 0
    rnn_flops_step: int = 0
    # by phase, for GPU pricing (steptime.step_time with a KernelSplit): the fused attention kernels' FLOPs and the
    # memory-bound operators' bytes in forward and in backward (recomputation included)
    attention_flops_forward: int = 0
    attention_flops_backward: int = 0
    memory_bytes_forward: int = 0
    memory_bytes_backward: int = 0
    # FLOPs of optimizer.step() (Muon's Newton-Schulz matmuls; 0 for optimizers that only stream their state)
    flops_optimizer: float = 0.0

    @property
    def flops_per_step(self) -> float:
        return self.flops_forward + self.flops_backward + self.flops_recompute
