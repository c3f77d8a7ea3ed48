"""XLA SPMD rules for TPU slices: FSDP-like sharding over the slice, per-chip HBM, ICI traffic, MFU.

Pure functions, each with its source.  On a TPU slice, XLA's SPMD partitioner
(GSPMD: Xu et al. 2021, "GSPMD: General and Scalable Parallelization for ML
Computation Graphs") shards the weights, gradients and optimizer state over the
chips of the slice ("FSDP-like": MaxText's default ``ici_fsdp_parallelism`` =
all chips); each step all-gathers weights for forward and backward and
reduce-scatters gradients over the inter-chip interconnect (ICI).

These functions are the arithmetic; they are checked against published TPU
training figures in tests/estimate/test_tpu.py.  The composer's FSDP sharding
and ring traffic are these rules (model states / chips, 3Ψ over the
interconnect); what differs on a TPU is the device memory, which
:func:`xla_device_memory` applies.
"""

from __future__ import annotations

from dataclasses import replace

from trainplan.estimate.memory import MemoryBreakdown


def xla_device_memory(mem: MemoryBreakdown) -> MemoryBreakdown:
    """HBM of a TPU chip at the step's peak: XLA compiles the step into one static buffer assignment
    (XLA docs, "Buffer assignment"; the TPU runtime has no caching allocator, so reserved = allocated), and
    there is no CUDA context or NCCL communicator (collectives run inside the compiled program over ICI)."""
    return replace(mem, overhead=mem.overhead - mem.context - mem.fragmentation, context=0.0, fragmentation=0.0,
                   expandable_slack=0.0)  # fmt: skip


def fsdp_state_bytes_per_chip(params: float, bytes_per_param: float, chips: int) -> float:
    """Weights + gradients + optimizer state sharded evenly over the slice (GSPMD FSDP sharding):
    params × bytes per parameter / chips."""
    if chips < 1:
        raise ValueError(f"chips must be >= 1, got {chips}")
    return params * bytes_per_param / chips


def fsdp_ici_bytes_per_chip(params: float, bytes_per_param_compute: float, chips: int) -> float:
    """Bytes each chip sends per step for FSDP over a ring: two all-gathers of the weights (forward, backward)
    and one reduce-scatter of the gradients, each moving (n − 1)/n of the tensor per chip (Rajbhandari et al.
    2020, "ZeRO", Sec. 7.2.2: 3 × Ψ for stage 3, ring collectives as in Patarasuk & Yuan 2009)."""
    return 3.0 * params * bytes_per_param_compute * (chips - 1) / chips


def ici_seconds(bytes_per_chip: float, ici_gb_s_per_chip: float, efficiency: float = 1.0) -> float:
    """Time to move ``bytes_per_chip`` over a chip's ICI links at ``ici_gb_s_per_chip`` (one direction) ×
    the achieved fraction."""
    if ici_gb_s_per_chip <= 0:
        raise ValueError("no ICI bandwidth for this TPU")
    return bytes_per_chip / (ici_gb_s_per_chip * 1e9 * efficiency)


def model_flops_per_token(params: float, layers: int = 0, seq_len: int = 0, d_attn: int = 0) -> float:
    """6N + 12·L·H·Q·T training FLOPs per token (Chowdhery et al. 2022, "PaLM", Appendix B; H·Q = d_attn)."""
    return 6.0 * params + 12.0 * layers * d_attn * seq_len


def mfu(tokens_per_s: float, flops_per_token: float, chips: int, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the slice's peak (PaLM Appendix B)."""
    return tokens_per_s * flops_per_token / (chips * peak_tflops * 1e12)


def step_seconds(flops_per_step: float, chips: int, peak_tflops: float, efficiency: float) -> float:
    """Compute time of one step on the slice at ``efficiency`` (fraction of peak): FLOPs / (chips × peak × eff)."""
    return flops_per_step / (chips * peak_tflops * 1e12 * efficiency)


def price_per_chip_hour(instance_price_usd_per_h: float, chips: int) -> float:
    """TPU VMs are priced per chip-hour, the host included: the slice's price / its chips."""
    return instance_price_usd_per_h / chips
