"""The training step: autocast, backward with gradient accumulation, the optimizer step.

DeepSpeed's engine owns backward and step (it scales for accumulation
itself); for the torch engines the loss is divided by the accumulation
count, gradients are synchronised only on the last micro-batch of a window,
and the optimizer steps at the window's end.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trainplan.run.runtime.wrapping import Placement, Wrapped
from trainplan.spec import Precision
from trainplan.strategies import Engine


def autocast(placement: Placement) -> contextlib.AbstractContextManager[Any]:
    """Mixed-precision autocast where the plan asks for it (plain torch engines on CUDA)."""
    precision = placement.precision
    if (
        placement.strategy.engine is Engine.TORCH
        and placement.device.type == "cuda"
        and precision in (Precision.BF16, Precision.FP16)
    ):
        dtype = torch.bfloat16 if precision is Precision.BF16 else torch.float16
        return torch.autocast("cuda", dtype=dtype)
    return contextlib.nullcontext()


class Stepper:
    """Backward and optimizer steps of one wrapped model, with ``grad_accum`` micro-batches a step."""

    def __init__(self, wrapped: Wrapped, grad_accum: int) -> None:
        self.wrapped = wrapped
        self.grad_accum = grad_accum
        self._micro = 0
        self._sync_next()

    def _sync_next(self) -> None:
        """Synchronise gradients only on the last micro-batch of an accumulation window."""
        self.wrapped.set_grad_sync((self._micro + 1) % self.grad_accum == 0)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (scaled for gradient accumulation)."""
        engine = self.wrapped.engine
        if engine is not None:
            engine.backward(loss)  # DeepSpeed divides by its gradient_accumulation_steps
            return
        scaled = loss / self.grad_accum
        if self.wrapped.scaler is not None:
            scaled = self.wrapped.scaler.scale(scaled)
        scaled.backward()

    def step(self) -> bool:
        """End of a micro-batch; steps the optimizer at the accumulation boundary.  Returns whether it stepped."""
        engine = self.wrapped.engine
        if engine is not None:
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            return bool(boundary)
        self._micro += 1
        stepped = self._micro % self.grad_accum == 0
        if stepped:
            optimizer, scaler = self.wrapped.optimizer, self.wrapped.scaler
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            self._micro = 0
        self._sync_next()
        return stepped
