"""This process's place in the run: rank and world size, its device, the process group.

Everything the launcher tells a worker through its environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``TORCHELASTIC_RESTART_COUNT``, torchrun's
agent store) is read once, into :class:`ProcessInfo`, when the runtime starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping

import torch

from trainplan.measure.probe import Accelerator
from trainplan.strategies import Engine, Strategy


def env_int(env: Mapping[str, str], name: str, default: int) -> int:
    """``env[name]`` as an integer, ``default`` when unset or empty."""
    value = env.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)  # type: ignore[arg-type]
    except ValueError:
        raise ValueError(f"${name} must be an integer, got {value!r}") from None


@dataclass(frozen=True)
class ProcessInfo:
    """Rank, world size and restart count of this process, as the launcher set them.

    ``agent_store`` is torchrun's TCPStore address (host, port) when the
    workers share the agent's store (``TORCHELASTIC_USE_AGENT_STORE=True``).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    restart_count: int = 0
    agent_store: tuple[str, int] | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ProcessInfo":
        env = os.environ if env is None else env
        store = None
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            store = (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
        return cls(
            rank=env_int(env, "RANK", 0),
            world_size=env_int(env, "WORLD_SIZE", 1),
            local_rank=env_int(env, "LOCAL_RANK", 0),
            restart_count=env_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            agent_store=store,
        )


def best_local_device(local_rank: int) -> torch.device:
    """CUDA (one GPU per local rank), else Apple MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def choose_device(accelerator: Accelerator | None, local_rank: int) -> torch.device:
    """The device the run configuration names (a GPU per local rank on CUDA), else the best local one."""
    if accelerator is Accelerator.CUDA:
        return torch.device("cuda", local_rank)
    if accelerator is not None:
        return torch.device(accelerator.value)
    return best_local_device(local_rank)


def is_distributed() -> bool:
    """Whether ``torch.distributed`` has a process group in this process."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def barrier(device: torch.device) -> None:
    """Wait for every rank (nothing to wait for without a process group)."""
    if not is_distributed():
        return
    if device.type == "cuda":
        torch.distributed.barrier(device_ids=[device.index])
    else:
        torch.distributed.barrier()


def collective_device(device: torch.device) -> torch.device:
    """Where small collective tensors live: the GPU under NCCL, else the CPU (gloo)."""
    return device if device.type == "cuda" else torch.device("cpu")


def needs_process_group(strategy: Strategy, world_size: int) -> bool:
    """Several processes, or a sharding engine (FSDP and DeepSpeed need a group even for one)."""
    return world_size > 1 or strategy.engine is not Engine.TORCH


def init_process_group(info: ProcessInfo, device: torch.device, strategy: Strategy) -> None:
    """Create the process group (gloo on CPU, NCCL on CUDA) when the run needs one and none exists."""
    if not needs_process_group(strategy, info.world_size) or is_distributed():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    torch.distributed.init_process_group(backend=backend, **rendezvous_kwargs(info))
    if strategy.engine is Engine.DEEPSPEED:
        import deepspeed

        if device.type == "cpu":
            skip_deepspeed_shm_op()
        deepspeed.init_distributed(dist_backend=backend)  # wraps the group made above


def rendezvous_kwargs(info: ProcessInfo) -> dict[str, Any]:
    """Rendezvous keys under a prefix per torchrun attempt.

    Under torchrun the workers share the agent's TCPStore, which outlives
    an elastic restart; without a per-attempt prefix a restarted rank can
    read the address its dead predecessor published and fail to connect
    (seen with gloo, torch 2.13).
    """
    if info.agent_store is None:
        return {}
    host, port = info.agent_store
    store = torch.distributed.TCPStore(
        host, port, world_size=info.world_size, is_master=False, timeout=timedelta(minutes=10)
    )
    prefixed = torch.distributed.PrefixStore(f"trainplan/attempt_{info.restart_count}", store)
    return {"store": prefixed, "rank": info.rank, "world_size": info.world_size}


def skip_deepspeed_shm_op() -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce kernel on a CPU.

    DeepSpeed builds ``deepspeed_shm_comm`` (ninja + g++, about a minute on
    two cores, cached in ``$TORCH_EXTENSIONS_DIR``) when it creates its comm
    backend, but only ``inference_all_reduce`` — DeepSpeed-Inference — uses
    it; training collectives go through ``torch.distributed`` (gloo).
    DeepSpeed keeps its op-compatibility table in a module-level dict that it
    reads before building (``deepspeed.ops.__compatible_ops__``, documented
    there as persistent); marking the op incompatible skips the build.  With
    another DeepSpeed layout this does nothing and DeepSpeed compiles as usual.
    """
    try:
        import deepspeed.ops

        table = deepspeed.ops.__compatible_ops__
        if isinstance(table, dict):
            table["deepspeed_shm_comm"] = False
    except (ImportError, AttributeError):
        pass
