"""Precision: which dtype each tensor of the step is stored in, and when autocast is on.

Conventions (documented in ``docs/trace.md``):

* Mixed precision (``fp16``/``bf16``) keeps fp32 parameters and runs the step
  under ``torch.autocast``; ``bf16-pure`` stores the parameters (and so the
  gradients and optimizer state) in bf16, casts floating inputs to bf16 and
  runs without autocast.
* With LoRA, the frozen base weights are stored in the compute dtype (bf16 or
  fp16 under mixed precision; fp32 under fp32) since they need no fp32 master
  copy; adapters are fp32 master weights (bf16 under ``bf16-pure``).

A new precision mode is a member of ``trainplan.spec.Precision`` plus its
answers in the functions below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from trainplan.spec import Precision

__all__ = [
    "autocast_context",
    "cast_floating",
    "frozen_base_dtype",
    "input_float_dtype",
    "master_dtype",
]


def autocast_context(precision: Precision, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for mixed precision, a no-op for fp32 and bf16-pure."""
    if precision is Precision.BF16:
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision is Precision.FP16:
        return torch.autocast(device_type, dtype=torch.float16)
    return contextlib.nullcontext()


def master_dtype(precision: Precision) -> torch.dtype:
    """The dtype of trainable parameters, so of their gradients and optimizer state: bf16 under bf16-pure, else fp32."""
    return torch.bfloat16 if precision is Precision.BF16_PURE else torch.float32


def input_float_dtype(precision: Precision) -> torch.dtype | None:
    """The dtype floating inputs are cast to: bf16 under bf16-pure, else ``None`` (kept as made)."""
    return torch.bfloat16 if precision is Precision.BF16_PURE else None


def half_dtype(precision: Precision) -> torch.dtype:
    """The 16-bit compute dtype: fp16 for ``fp16``, bf16 otherwise."""
    return torch.float16 if precision is Precision.FP16 else torch.bfloat16


def frozen_base_dtype(precision: Precision, *, qlora: bool) -> torch.dtype:
    """The dtype of LoRA's frozen base weights: the compute dtype (fp32 only for an fp32 job without QLoRA)."""
    return torch.float32 if precision is Precision.FP32 and not qlora else half_dtype(precision)


def cast_floating(module: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating parameters and buffers to ``dtype`` (integer buffers stay).

    Parameters are replaced by new ``Parameter`` objects (shared ones stay
    shared) rather than through ``Module.to``, which on fake tensors swaps
    tensor objects and fails when the fake mode holds a weak reference to one.
    """
    if not any(t.is_floating_point() and t.dtype != dtype for t in _tensors_of(module)):
        return
    # id -> (old, new); holding the old tensor keeps its id from being reused.
    params: dict[int, tuple[torch.Tensor, nn.Parameter]] = {}
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.no_grad():
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is None or not p.is_floating_point() or p.dtype == dtype:
                    continue
                if id(p) not in params:
                    params[id(p)] = (p, nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad))
                m._parameters[name] = params[id(p)][1]
            for name, b in list(m._buffers.items()):
                if b is None or not b.is_floating_point() or b.dtype == dtype:
                    continue
                if id(b) not in buffers:
                    buffers[id(b)] = (b, b.to(dtype))
                m._buffers[name] = buffers[id(b)][1]


def _tensors_of(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()
