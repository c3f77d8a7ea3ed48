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
    # optimizer state (and its fp32 master) in host RAM; stage 1 keeps the full 16-bit gradients on the device until
    # the accumulation boundary, stage 2 copies each reduced gradient partition to the host during backward
    ZERO1_OFFLOAD = "zero1-offload"
    ZERO2_OFFLOAD = "zero2-offload"
    ZERO3_OFFLOAD = "zero3-offload"  # optimizer state and parameters in host RAM
    FSDP = "fsdp"  # full shard (like ZeRO-3)
    FSDP_GRAD_OP = "fsdp-grad-op"  # shard gradients and optimizer state (like ZeRO-2)
    # full shard with the parameter shards, their gradients and the optimizer step in host RAM: FSDP1
    # CPUOffload(offload_params=True), FSDP2 fully_shard(offload_policy=CPUOffloadPolicy()) (PyTorch FSDP docs)
    FSDP_OFFLOAD = "fsdp-offload"

    @property
    def engine(self) -> Engine:
        return _ENGINES[self]

    @property
    def zero_stage(self) -> ZeroStage:
        """The equivalent ZeRO stage (FSDP full shard ≙ 3, SHARD_GRAD_OP ≙ 2)."""
        return _ZERO_STAGES[self]

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
        return self in (Strategy.ZERO1_OFFLOAD, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD)

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


_ENGINES = {s: (Engine.TORCH if s in (Strategy.SINGLE, Strategy.DDP) else
                Engine.FSDP if s in (Strategy.FSDP, Strategy.FSDP_GRAD_OP, Strategy.FSDP_OFFLOAD) else Engine.DEEPSPEED)
            for s in Strategy}  # fmt: skip
_ZERO_STAGES = {
    Strategy.SINGLE: ZeroStage.NONE,
    Strategy.DDP: ZeroStage.NONE,
    Strategy.ZERO1: ZeroStage.STAGE_1,
    Strategy.ZERO1_OFFLOAD: ZeroStage.STAGE_1,
    Strategy.ZERO2: ZeroStage.STAGE_2,
    Strategy.ZERO2_OFFLOAD: ZeroStage.STAGE_2,
    Strategy.FSDP_GRAD_OP: ZeroStage.STAGE_2,
    Strategy.ZERO3: ZeroStage.STAGE_3,
    Strategy.ZERO3_OFFLOAD: ZeroStage.STAGE_3,
    Strategy.FSDP: ZeroStage.STAGE_3,
    Strategy.FSDP_OFFLOAD: ZeroStage.STAGE_3,
}


class Schedule(str, Enum):
    """Pipeline schedules (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
    Using Megatron-LM", Sec. 2.2): 1F1B (PipeDream-Flush) and its interleaved variant with ``vpp`` model chunks
    per rank; ``none`` without pipeline parallelism."""

    NONE = "none"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved-1f1b"


@dataclass(frozen=True)
class Layout:
    """Devices a job runs on, ``gpus_per_node`` × ``nodes``, and how the model is split over them.

    The degrees — tensor (``tp``), pipeline (``pp``, with ``vpp`` virtual stages per rank), context (``cp``) and
    expert (``ep``) parallel — multiply with the data-parallel degree to the world size, and are validated at
    construction, as torchtitan's ``ParallelDims`` does: ``tp × pp × cp`` divides the world size and the quotient
    is the data-parallel degree (the ranks the strategy replicates or shards over, ``dp``).  Experts are not
    tensor-parallel (expert-TP 1): the expert layers get their own mapping of a pipeline stage's ``tp × cp × dp``
    ranks, with the expert-parallel ranks innermost (Megatron Core's MoE parallel folding, Liu et al. 2025,
    arXiv 2504.14960; torchtitan lets ``ep`` borrow ``tp`` as well as ``dp_shard × cp`` when expert-TP is 1), so
    ``ep`` divides ``tp × cp × dp`` and an expert group of up to a node's GPUs stays inside the node.  ``sequence_parallel`` shards the
    norms' and dropouts' activations over the tensor-parallel ranks (Korthikanti et al. 2022, Sec. 4.2.2).
    """

    gpus_per_node: int = 1
    nodes: int = 1
    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    # GPUs sharing the scale-up (NVLink) domain when it spans several nodes (GB200 NVL72: 72 over nodes of 4);
    # 0: the node (instances.csv ``scale_up_gpus``)
    scale_up: int = 0

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise SpecError(f"must be >= 1, got {self.gpus_per_node}", field="--gpus")
        if self.scale_up and self.scale_up % self.gpus_per_node:
            raise SpecError(f"a scale-up domain of {self.scale_up} GPUs must hold whole nodes of {self.gpus_per_node}",
                            field="scale_up_gpus")  # fmt: skip
        if self.nodes < 1:
            raise SpecError(f"must be >= 1, got {self.nodes}", field="--nodes")
        for name in ("tp", "pp", "vpp", "cp", "ep"):
            if getattr(self, name) < 1:
                raise SpecError(f"must be >= 1, got {getattr(self, name)}", field=f"--{name}")
        model = self.tp * self.pp * self.cp
        if self.world_size % model:
            raise SpecError(f"tp × pp × cp = {self.tp} × {self.pp} × {self.cp} = {model} must divide the "
                            f"{self.world_size} devices ({self.gpus_per_node} per node × {self.nodes} nodes)",
                            field="--tp/--pp/--cp")  # fmt: skip
        if self.vpp > 1 and self.pp == 1:
            raise SpecError(f"virtual pipeline stages need pipeline parallelism: --vpp {self.vpp} with --pp 1",
                            field="--vpp")  # fmt: skip
        if (self.tp * self.cp * self.data_parallel) % self.ep:
            raise SpecError(f"expert parallelism is carved out of a pipeline stage's tensor-, context- and data-parallel "
                            f"ranks: ep {self.ep} must divide tp × cp × dp = {self.tp} × {self.cp} × {self.data_parallel}",
                            field="--ep")  # fmt: skip
        if self.sequence_parallel and self.tp == 1:
            raise SpecError("sequence parallelism shards activations over the tensor-parallel ranks: it needs --tp > 1",
                            field="--sp")  # fmt: skip

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def split(self, **degrees: int | bool) -> "Layout":
        """The same devices (node shape, node count, scale-up domain) split by other degrees (validated)."""
        return Layout(self.gpus_per_node, self.nodes, scale_up=self.scale_up, **degrees)  # type: ignore[arg-type]

    @property
    def domain(self) -> int:
        """GPUs that reach each other over the scale-up links (NVLink): the node, or the larger domain it is part of."""
        return max(self.scale_up, self.gpus_per_node)

    @property
    def data_parallel(self) -> int:
        """Ranks holding the same model shard (the strategy replicates or shards over them)."""
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def model_parallel(self) -> bool:
        """Whether the model itself is split (tensor, pipeline, context or expert parallel), beyond data parallel."""
        return self.tp * self.pp * self.cp * self.ep > 1

    @property
    def schedule(self) -> Schedule:
        if self.pp == 1:
            return Schedule.NONE
        return Schedule.INTERLEAVED if self.vpp > 1 else Schedule.ONE_F_ONE_B

    def describe(self) -> str:
        """``"tp8·pp4·dp16"``-style degrees (only those above 1, dp always), ``"+sp"`` with sequence parallel."""
        parts = [f"{n}{v}" for n, v in (("tp", self.tp), ("pp", self.pp), ("vpp", self.vpp), ("cp", self.cp),
                                         ("ep", self.ep)) if v > 1]  # fmt: skip
        text = "·".join([*parts, f"dp{self.data_parallel}"])
        return text + ("+sp" if self.sequence_parallel else "")

    def to_dict(self, strategy: "Strategy | None" = None) -> dict[str, object]:
        """The degrees as torchtitan names them: data parallel split into replicate and shard by the strategy."""
        sharded = strategy is not None and strategy.shards_optimizer
        return {
            "dp_replicate": 1 if sharded else self.data_parallel,
            "dp_shard": self.data_parallel if sharded else 1,
            "tp": self.tp,
            "pp": self.pp,
            "vpp": self.vpp,
            "cp": self.cp,
            "ep": self.ep,
            "sequence_parallel": self.sequence_parallel,
            "schedule": self.schedule.value,
        }


def strategies_for(world_size: int) -> tuple[Strategy, ...]:
    """The strategies worth evaluating on ``world_size`` devices (on one, ZeRO-1 offload holds what ZeRO-2 offload
    holds plus the full gradients, and moves the same bytes: not searched there)."""
    if world_size == 1:
        return (Strategy.SINGLE, Strategy.ZERO2_OFFLOAD, Strategy.ZERO3_OFFLOAD, Strategy.FSDP_OFFLOAD)
    return tuple(s for s in Strategy if s is not Strategy.SINGLE)
