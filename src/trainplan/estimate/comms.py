"""Time of the collectives a data-parallel strategy issues.

Ring collectives (NVIDIA nccl-tests, ``doc/PERFORMANCE.md``): with n ranks and
M bytes, all-reduce moves 2(n-1)/n·M over each rank's link, all-gather and
reduce-scatter (n-1)/n·M each; so time = factor · M / bus bandwidth.

Across nodes trainplan assumes the hierarchical scheme NCCL uses on multi-NIC
nodes: a reduce-scatter inside the node, the inter-node step on 1/g of the
data per GPU with all g GPUs' NICs in parallel, an all-gather inside the node
(Sergeev & Del Balso 2018, "Horovod", hierarchical all-reduce).  The
inter-node term is therefore factor·(N-1)/N·M over the node's total network
bandwidth.

Volumes per strategy (Rajbhandari et al. 2020, "ZeRO", Sec. 7): DDP and
ZeRO-1/2 move 2Ψ per step (reduce-scatter + all-gather ≡ all-reduce); ZeRO-3
and FSDP 3Ψ (an all-gather in forward, one in backward, a reduce-scatter).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainplan.spec import Precision
from trainplan.strategies import Engine, Layout, Strategy, ZeroStage


@dataclass(frozen=True)
class Links:
    """Bandwidths a collective can use, already multiplied by the achievable fraction."""

    intra_gb_s: float | None  # per GPU, one direction, inside a node
    inter_node_gb_s: float | None  # per node, network (GB/s, not Gb/s)


def collective_seconds(bytes_: float, factor: float, layout: Layout, links: Links) -> float:
    """Seconds for a ring collective of ``bytes_`` with volume ``factor`` (2 all-reduce, 1 all-gather/reduce-scatter)."""
    if bytes_ <= 0 or layout.world_size <= 1:
        return 0.0
    g, n = layout.gpus_per_node, layout.nodes
    t = 0.0
    if g > 1:
        if not links.intra_gb_s:
            raise ValueError("no intra-node bandwidth for a multi-GPU node")
        t += factor * (g - 1) / g * bytes_ / (links.intra_gb_s * 1e9)
    if n > 1:
        if not links.inter_node_gb_s:
            raise ValueError("no network bandwidth for a multi-node layout")
        t += factor * (n - 1) / n * bytes_ / (links.inter_node_gb_s * 1e9)
    return t


@dataclass(frozen=True)
class CommPlan:
    """Seconds of communication per optimizer step, split by what it can hide behind."""

    per_micro_forward: float  # parameter all-gathers during each forward (ZeRO-3 / FSDP)
    per_micro_backward: float  # gathers + gradient reductions during each backward
    per_step: float  # once per optimizer step, overlappable with the last backward
    after_step: float  # once per step, after the optimizer (ZeRO-1/2 parameter all-gather): not hidden


def comm_plan(
    strategy: Strategy,
    *,
    layout: Layout,
    links: Links,
    trainable_params: float,
    total_params: float,
    precision: Precision,
    fp8_gather_fraction: float = 0.0,
) -> CommPlan:
    """The collectives of one optimizer step for ``strategy`` and their times.

    Gradients are reduced in their storage dtype: fp32 under PyTorch AMP (DDP),
    16-bit under DeepSpeed and FSDP mixed precision.  DeepSpeed ZeRO-2 and
    ZeRO-3/FSDP reduce every micro-batch (they cannot keep unsharded gradients);
    DDP and ZeRO-1 reduce once per optimizer step (``no_sync``).
    ``fp8_gather_fraction`` (knobs.fp8_all_gather, precision fp8): under FSDP that share of the parameters — the
    float8 linears' weights — is all-gathered at 1 byte per element, cast on each rank's shard before the gather
    (torchao ``float8/fsdp_utils.py``: ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``; tensor-wise
    scaling only, ``Float8LinearConfig.__post_init__``); DeepSpeed's ZeRO-3 gathers 16-bit.  Gradients are reduced
    in 16 bits either way.
    """
    zero = CommPlan(0.0, 0.0, 0.0, 0.0)
    if layout.world_size <= 1:
        return zero
    e = precision.compute_bytes
    grad_bytes = trainable_params * (4 if strategy.engine is Engine.TORCH and precision.mixed else e)
    f8 = fp8_gather_fraction if strategy.engine is Engine.FSDP else 0.0
    param16 = total_params * (e * (1.0 - f8) + 1.0 * f8)  # the gathered parameters' bytes
    if strategy is Strategy.DDP:
        return CommPlan(0.0, 0.0, collective_seconds(grad_bytes, 2, layout, links), 0.0)
    stage = strategy.zero_stage
    rs = collective_seconds(trainable_params * e, 1, layout, links)
    if stage is ZeroStage.STAGE_1:
        ag = collective_seconds(trainable_params * e, 1, layout, links)
        return CommPlan(0.0, 0.0, rs, ag)
    if stage is ZeroStage.STAGE_2:
        ag_fwd = collective_seconds(param16, 1, layout, links) if strategy is Strategy.FSDP_GRAD_OP else 0.0
        ag_step = 0.0 if strategy is Strategy.FSDP_GRAD_OP else collective_seconds(trainable_params * e, 1, layout, links)
        return CommPlan(ag_fwd, rs, 0.0, ag_step)
    ag = collective_seconds(param16, 1, layout, links)
    return CommPlan(ag, ag + rs, 0.0, 0.0)


def exposed_comm_seconds(plan: CommPlan, *, micro_steps: int, t_forward: float, t_backward: float, overlap: float) -> float:
    """Communication left on the critical path after overlap with compute.

    Gathers prefetch behind forward, reductions run behind backward (DDP's
    bucketed all-reduce, Li et al. 2020, "PyTorch Distributed", Sec. 3.2.3;
    FSDP/ZeRO-3 prefetching).  ``overlap`` ∈ [0, 1] is the fraction of compute
    that communication can hide behind.
    """
    hidden_f = overlap * t_forward
    hidden_b = overlap * t_backward
    per_micro = max(0.0, plan.per_micro_forward - hidden_f) + max(0.0, plan.per_micro_backward - hidden_b)
    last = max(0.0, plan.per_step - max(0.0, hidden_b - plan.per_micro_backward))
    return micro_steps * per_micro + last + plan.after_step
