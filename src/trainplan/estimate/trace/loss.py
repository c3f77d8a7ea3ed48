"""The forward pass and the loss: what a training loop keeps of the model's output.

A new built-in loss is a name in :data:`LOSS_NAMES` plus a branch in
:func:`forward_and_loss`; anything else can be passed as a callable
``loss(output, batch) -> scalar``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LOSS_NAMES", "LossLike", "forward_and_loss"]

# The built-in losses, by name.
LOSS_NAMES: tuple[str, ...] = ("mean", "sum", "mse", "cross_entropy")

LossLike = str | Callable[[Any, Sequence[torch.Tensor]], torch.Tensor]


def forward_and_loss(model: nn.Module, batch: Sequence[torch.Tensor], loss: LossLike) -> torch.Tensor:
    """Run the forward pass and return the scalar loss; the model output is dropped.

    ``loss``: ``mean`` / ``sum`` of the output, ``mse`` against zeros,
    ``cross_entropy`` against class 0 (for models whose ``forward`` takes
    ``labels`` — Hugging Face — the first input is passed as ``labels`` and the
    model's own loss is used), or a callable ``loss(output, batch) -> scalar``.
    Only the loss is kept, as training loops do (Hugging Face Trainer and
    Lightning keep ``loss.detach()``), so the output's memory is freed before
    backward.
    """
    out = None
    if loss == "cross_entropy" and _accepts_labels(model):
        out = model(*batch, labels=batch[0])
        own = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
        if isinstance(own, torch.Tensor):
            del out
            return own
    if out is None:
        out = model(*batch)
    if callable(loss):
        value = loss(out, batch)
    else:
        y = _main_output(out)
        if loss == "mean":
            value = y.mean()
        elif loss == "sum":
            value = y.sum()
        elif loss == "mse":
            value = F.mse_loss(y, torch.zeros_like(y))
        elif loss == "cross_entropy":
            value = _cross_entropy(y, batch)
        else:
            raise ValueError(f"unknown loss {loss!r}; allowed: {', '.join(LOSS_NAMES)}, or a callable")
        del y
    del out
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError("the loss must be a scalar tensor")
    return value


def _accepts_labels(model: nn.Module) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "labels" in params


def _main_output(out: Any) -> torch.Tensor:
    """The tensor a loss is computed from: the tensor, ``logits``, or the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        for v in out.values():
            if isinstance(v, torch.Tensor):
                return v
    if isinstance(out, (tuple, list)):
        for v in out:
            if isinstance(v, torch.Tensor):
                return v
    raise TypeError(f"the model returned {type(out).__name__}, which holds no tensor to compute a loss from")


def _cross_entropy(logits: torch.Tensor, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Cross entropy against all-zero class targets.

    Class dim 1 (PyTorch's convention) except for language-model outputs
    ``(B, S, V)`` whose first two dims match an integer ``(B, S)`` input, where
    the class dim is last.
    """
    if logits.dim() < 2:
        raise ValueError(f"cross_entropy needs outputs with a class dimension, got shape {tuple(logits.shape)}")
    first = batch[0] if batch else None
    if (
        logits.dim() == 3
        and first is not None
        and not first.is_floating_point()
        and first.dim() == 2
        and tuple(first.shape) == tuple(logits.shape[:2])
    ):
        target = torch.zeros(logits.shape[0] * logits.shape[1], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)
    target_shape = (logits.shape[0], *logits.shape[2:])
    target = torch.zeros(target_shape, dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, target)
