"""Parallel strategies and the layout of devices they run on.

A :class:`Strategy` says *what* is sharded or offloaded; a :class:`Layout` says
over how many devices.  Sharding rules live on the enum so that the analytic and
the traced estimators apply the same ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum

from trainplan.errors import SpecError


class ZeroStage(IntEnum):
    """Cumulative ZeRO stages (Rajbhandari et al. 2020, "ZeRO", Sec. 5):
    stage 1 shards optimizer state, 2 also gradients, 3 also parameters."""

    NONE = 0
    STAGE_1 = 1
    STAGE_2 = 2
    STAGE_3 = 3


class Engine(str, Enum):
    """The library that implements a strategy (decides dtype conventions and buffers)."""

    TORCH = "torch"  # plain PyTorch: one process, DDP
    FSDP = "fsdp"  # PyTorch FSDP2 (fully_shard)
    DEEPSPEED = "deepspeed"


class Strategy(str, Enum):
    SINGLE = "single"
    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    ZERO2_OFFLOAD = "zero2-offload"  # optimizer state (and its fp32 master) in host RAM
    ZERO3_OFFLOAD = "zero3-offload"  # optimizer state and parameters in host RAM
    FSDP = "fsdp"  # full shard (like ZeRO-3)
    FSDP_GRAD_OP = "fsdp-grad-op"  # shard gradients and optimizer state (like ZeRO-2)
    # full shard with the parameter shards, their gradients and the optimizer step in host RAM: FSDP1
    # CPUOffload(offload_params=True), FSDP2 fully_shard(offload_policy=CPUOffloadPolicy()) (PyTorch FSDP docs)
    FSDP_OFFLOAD = "fsdp-offload"

    @property
    def engine(self) -> Engine:
        if self in (Strategy.SINGLE, Strategy.DDP):
            return Engine.TORCH
        if self in (Strategy.FSDP, Strategy.FSDP_GRAD_OP, Strategy.FSDP_OFFLOAD):
            return Engine.FSDP
        return Engine.DEEPSPEED

    @property
    def zero_stage(self) -> ZeroStage:
        """The equivalent ZeRO stage (FSDP full shard ≙ 3, SHARD_GRAD_OP ≙ 2)."""
        return {
            Strategy.SINGLE: ZeroStage.NONE,
            Strategy.DDP: ZeroStage.NONE,
            Strategy.ZERO1: ZeroStage.STAGE_1,
            Strategy.ZERO2: ZeroStage.STAGE_2,
            Strategy.ZERO2_OFFLOAD: ZeroStage.STAGE_2,
            Strategy.FSDP_GRAD_OP: ZeroStage.STAGE_2,
            Strategy.ZERO3: ZeroStage.STAGE_3,
            Strategy.ZERO3_OFFLOAD: ZeroStage.STAGE_3,
            Strategy.FSDP: ZeroStage.STAGE_3,
            Strategy.FSDP_OFFLOAD: ZeroStage.STAGE_3,
        }[self]

    @property
    def shards_optimizer(self) -> bool:
        return self.zero_stage >= ZeroStage.STAGE_1

    @property
    def shards_gradients(self) -> bool:
        return self.zero_stage >= ZeroStage.STAGE_2

    @property
    def shards_parameters(self) -> bool:
        return self.zero_stage >= ZeroStage.STAGE_3

    @property
    def offloads_optimizer(self) -> bool:
        return self in (Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD)

    @property
    def offloads_parameters(self) -> bool:
        return self in (Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD)

    @property
    def multi_device_only(self) -> bool:
        """Strategies that make no sense on one device (offload does: ZeRO-Offload, and FSDP's CPU offload)."""
        return self in (
            Strategy.DDP,
            Strategy.ZERO1,
            Strategy.ZERO2,
            Strategy.ZERO3,
            Strategy.FSDP,
            Strategy.FSDP_GRAD_OP,
        )

    @classmethod
    def parse(cls, value: str, *, field: str = "--strategy") -> "Strategy":
        try:
            return cls(value.lower())
        except ValueError:
            allowed = ", ".join(s.value for s in cls)
            raise SpecError(f"must be one of {allowed}, got {value!r}", field=field) from None


@dataclass(frozen=True)
class Layout:
    """Devices a job runs on: ``gpus_per_node`` × ``nodes``, all data parallel.

    Validated at construction (like torchtitan's ``ParallelDims``): the degrees
    multiply to the world size and are positive.
    """

    gpus_per_node: int = 1
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise SpecError(f"must be >= 1, got {self.gpus_per_node}", field="--gpus")
        if self.nodes < 1:
            raise SpecError(f"must be >= 1, got {self.nodes}", field="--nodes")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def data_parallel(self) -> int:
        return self.world_size


def strategies_for(world_size: int) -> tuple[Strategy, ...]:
    """The strategies worth evaluating on ``world_size`` devices."""
    if world_size == 1:
        return (Strategy.SINGLE, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD)
    return tuple(s for s in Strategy if s is not Strategy.SINGLE)
