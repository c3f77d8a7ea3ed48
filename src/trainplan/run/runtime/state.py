"""Checkpoint and resume of a wrapped model; the full weights at the end.

Plain torch and FSDP write full (unsharded) model and optimizer state dicts
from rank 0, gathered with ``torch.distributed.checkpoint.state_dict`` — one
format for single, DDP and FSDP; DeepSpeed writes its own sharded
checkpoint.  Every rank also writes its :class:`TrainerState` (step, RNG,
clocks, peak).  The folder protocol is :class:`~trainplan.run.checkpoint.CheckpointStore`'s.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from trainplan.run.checkpoint import (
    CheckpointRef,
    CheckpointStore,
    load_tensor_file,
    save_tensor_file,
    set_rng_state,
)
from trainplan.run.runtime.wrapping import Pipeline, Wrapped
from trainplan.strategies import Engine, Strategy


@dataclass(frozen=True)
class TrainerState:
    """One rank's state besides model and optimizer: what a resume restores."""

    step: int
    rng: dict[str, Any]
    train_s: float  # training time of the run up to this checkpoint, over every segment
    peak_bytes: int  # peak memory so far, over every segment
    world_size: int
    strategy: Strategy

    def to_file_dict(self) -> dict[str, Any]:
        """Plain types only (the file is read back with ``weights_only=True``)."""
        return {
            "step": self.step,
            "rng": self.rng,
            "train_s": self.train_s,
            "peak_bytes": self.peak_bytes,
            "world_size": self.world_size,
            "strategy": self.strategy.value,
        }

    @classmethod
    def from_file_dict(cls, data: dict[str, Any]) -> "TrainerState":
        return cls(
            step=int(data["step"]),
            rng=data["rng"],
            train_s=float(data["train_s"]),
            peak_bytes=int(data["peak_bytes"]),
            world_size=int(data["world_size"]),
            strategy=Strategy(data["strategy"]),
        )


def _trainer_file(folder: Path, rank: int) -> Path:
    return folder / f"trainer_rank{rank}.pt"


def has_quantized_base(module: torch.nn.Module) -> bool:
    """Whether ``module`` holds 4-bit bitsandbytes weights (QLoRA).  Their packed storage and quantization
    state are not trained: a checkpoint keeps only the trainable tensors, and a resume loads the base from the
    pretrained checkpoint again (NF4 quantization is deterministic)."""
    return any(getattr(p, "quant_state", None) is not None for p in module.parameters())


def _frozen_keys(module: torch.nn.Module) -> Callable[[str], bool]:
    """Whether a state-dict key belongs to a frozen parameter of ``module``: the parameter itself or a 4-bit
    weight's quantization state riding on it (``….weight.absmax``, ``….weight.quant_map`` …)."""
    frozen = {n for n, p in module.named_parameters() if not p.requires_grad}

    def test(key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[:i]) in frozen for i in range(1, len(parts) + 1))

    return test


def full_state_dicts(wrapped: Wrapped, *, optimizer: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Collective: full (unsharded) model and optimizer state dicts, on the CPU (torch engines)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    module = wrapped.module
    quantized = has_quantized_base(module)
    # cpu_offload gives the values to global rank 0 only: a pipeline's stages each need their own part
    offload = wrapped.pipeline is None
    opts = StateDictOptions(full_state_dict=True, cpu_offload=offload, ignore_frozen_params=quantized)
    model_sd = get_model_state_dict(module, options=opts)
    if quantized:  # the 4-bit weights' quantization state rides along as extra state: not trained, not saved
        frozen = _frozen_keys(module)
        model_sd = {k: v for k, v in model_sd.items() if not frozen(k)}
    optim_sd = get_optimizer_state_dict(module, wrapped.optimizer, options=opts) if optimizer else None
    if not offload:
        model_sd, optim_sd = _to_cpu(model_sd), _to_cpu(optim_sd)
    return model_sd, optim_sd


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_to_cpu(v) for v in tree)
    return tree.detach().to("cpu") if isinstance(tree, torch.Tensor) else tree


def _stage_files(folder: Path, pipeline: Pipeline | None) -> tuple[Path, Path]:
    """The model and optimizer files of a checkpoint: one pair, or one per pipeline stage (each stage's part)."""
    tag = "" if pipeline is None else f".pp{pipeline.stage}"
    return folder / f"model{tag}.pt", folder / f"optim{tag}.pt"


def _writes_state(wrapped: Wrapped, is_main: bool) -> bool:
    """Rank 0 writes the state dicts; in a pipeline, the first data-parallel rank of each stage writes its stage's."""
    if wrapped.pipeline is None:
        return is_main
    import torch.distributed as dist

    return dist.get_rank(wrapped.pipeline.dp_group) == 0


def save(
    store: CheckpointStore,
    wrapped: Wrapped,
    step: int,
    trainer_state: Callable[[], TrainerState],
    *,
    rank: int,
    is_main: bool,
) -> CheckpointRef:
    """Collective: write checkpoint ``step``: model and optimizer, then this rank's
    ``trainer_state()`` (taken after them, so its clock and peak include the writing)."""
    folder = store.begin(step)
    if wrapped.engine is not None:
        wrapped.engine.save_checkpoint(str(folder / "deepspeed"), tag="state", save_latest=False)
    else:
        model_sd, optim_sd = full_state_dicts(wrapped)
        if _writes_state(wrapped, is_main):
            model_file, optim_file = _stage_files(folder, wrapped.pipeline)
            save_tensor_file(model_sd, model_file)
            save_tensor_file(optim_sd, optim_file)
    trainer = trainer_state()
    save_tensor_file(trainer.to_file_dict(), _trainer_file(folder, rank))
    return store.commit(step, world_size=trainer.world_size, strategy=trainer.strategy.value)


def restore(ref: CheckpointRef, wrapped: Wrapped, *, rank: int) -> TrainerState:
    """Collective: load checkpoint ``ref`` into ``wrapped`` and this process's RNG; returns the trainer state."""
    if wrapped.engine is not None:
        path, _ = wrapped.engine.load_checkpoint(str(ref.path / "deepspeed"), tag="state")
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load {ref.path / 'deepspeed'}")
    else:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        module = wrapped.module
        quantized = has_quantized_base(module)
        opts = StateDictOptions(full_state_dict=True, strict=not quantized)
        model_file, optim_file = _stage_files(ref.path, wrapped.pipeline)
        keys = set_model_state_dict(module, load_tensor_file(model_file), options=opts)
        if quantized:  # only the frozen base may be missing: it was loaded from the pretrained checkpoint again
            frozen = _frozen_keys(module)
            missing = [k for k in keys.missing_keys if not frozen(k)]
            if missing or keys.unexpected_keys:
                raise RuntimeError(f"checkpoint {ref.path} does not fit this model: missing {missing[:3]}, "
                                   f"unexpected {list(keys.unexpected_keys)[:3]}")
        set_optimizer_state_dict(module, wrapped.optimizer, load_tensor_file(optim_file), options=opts)
    state = TrainerState.from_file_dict(load_tensor_file(_trainer_file(ref.path, rank)))
    set_rng_state(state.rng)
    return state


def full_parameters(wrapped: Wrapped) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective: every parameter gathered in full, in name order."""
    for name, p in sorted(wrapped.module.named_parameters(), key=lambda kv: kv[0]):
        if hasattr(p, "full_tensor"):  # FSDP2 DTensor
            yield name, p.full_tensor()
        elif hasattr(p, "ds_id"):  # DeepSpeed ZeRO-3 partitioned parameter
            import deepspeed

            with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                yield name, p.data.clone()
        else:
            yield name, p.data


def param_fingerprint(wrapped: Wrapped) -> str:
    """Collective: SHA-256 of every parameter, gathered in full, in name order."""
    digest = hashlib.sha256()
    for name, tensor in full_parameters(wrapped):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def full_model_state(wrapped: Wrapped, *, is_main: bool) -> dict[str, torch.Tensor] | None:
    """Collective: the full model state dict on rank 0 (None on other ranks)."""
    module = wrapped.module
    if wrapped.engine is not None and wrapped.strategy.shards_parameters:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            sd = {k: v.detach().to("cpu").clone() for k, v in module.state_dict().items()}
        return sd if is_main else None
    if wrapped.engine is not None:
        return {k: v.detach().to("cpu") for k, v in module.state_dict().items()} if is_main else None
    if wrapped.pipeline is not None:  # every stage's part, gathered on rank 0
        import torch.distributed as dist

        part = full_state_dicts(wrapped, optimizer=False)[0]  # collective over the stage's ranks
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, part if _writes_state(wrapped, is_main) else {})
        return {k: v for p in parts for k, v in p.items()} if is_main else None
    if wrapped.strategy.engine is Engine.FSDP:
        model_sd = full_state_dicts(wrapped, optimizer=False)[0]
    else:
        model_sd = module.state_dict()
    return {k: v.detach().to("cpu") for k, v in model_sd.items()} if is_main else None
