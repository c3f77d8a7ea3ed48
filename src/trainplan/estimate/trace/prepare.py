"""Configure a model for one training step the way a job asks: precision, activation checkpointing, LoRA.

:func:`prepare_model` and the other helpers of this package are plain
PyTorch and work the same on real tensors and under ``FakeTensorMode``: the
tracer calls them on the meta and fake devices, and the validation (tests,
``benchmarks/gpu_validate.py``) calls them on real ones, so the step that is
measured is the step that is traced.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from trainplan.estimate.trace.checkpointing import apply_activation_checkpointing
from trainplan.estimate.trace.lora import LoraLike, apply_lora
from trainplan.estimate.trace.precision import cast_floating, master_dtype
from trainplan.spec import Checkpointing, Precision

__all__ = ["PreparedModel", "prepare_model"]


@dataclass(frozen=True)
class PreparedModel:
    """A model configured for training, with what the configuration did."""

    model: nn.Module
    quantized_numels: tuple[int, ...]  # sizes of the frozen linear weights QLoRA stores in 4 bit
    quantized_element_bytes: int  # bytes per element those weights have in the traced model
    checkpointing: str
    lora_backend: str | None


def prepare_model(
    model: nn.Module,
    *,
    precision: Precision,
    checkpointing: Checkpointing = Checkpointing.NONE,
    checkpoint_fraction: float = 1.0,
    lora: LoraLike | None = None,
    qlora: bool = False,
    lora_backend: str = "auto",
) -> PreparedModel:
    """Cast, LoRA-wrap and checkpoint ``model`` for one training step (in train mode).

    ``lora_backend``: ``"peft"``, ``"builtin"`` or ``"auto"`` (peft when importable); ``checkpoint_fraction``: the share
    of the blocks full checkpointing wraps (knobs.checkpoint_fraction).
    """
    model.train()
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # no KV cache while training
    cast_floating(model, master_dtype(precision))
    ckpt = apply_activation_checkpointing(model, checkpointing, checkpoint_fraction)
    if lora is None:
        if qlora:
            raise ValueError("qlora needs lora settings")
        return PreparedModel(model, (), 0, ckpt, None)
    applied = apply_lora(model, lora, precision=precision, qlora=qlora, lora_backend=lora_backend)
    return PreparedModel(
        applied.model, applied.quantized_numels, applied.quantized_element_bytes, ckpt, applied.backend
    )
