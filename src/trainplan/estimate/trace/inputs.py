"""The batch of the traced step: example inputs made from per-sample specs, or by the user's callable."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import torch

__all__ = ["INPUT_DTYPES", "BatchLike", "InputLike", "describe_batch", "example_batch", "make_inputs"]

# Input dtype names a spec may give (the names of ``trainplan.spec.InputSpec.dtype``).
INPUT_DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float64": torch.float64,
        "int64": torch.int64,
        "int32": torch.int32,
        "int16": torch.int16,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
    }
)


class InputLike(Protocol):
    """One model input: per-sample shape (no batch dim) and dtype name."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> str: ...


# A callable ``micro_batch -> tensors`` (called under the fake mode), or input specs.
BatchLike = Callable[[int], Sequence[torch.Tensor]] | Sequence[InputLike]


def make_inputs(
    specs: Sequence[InputLike], micro_batch: int, *, float_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, ...]:
    """One tensor per input spec, shaped ``(micro_batch, *shape)``.

    Floating inputs are standard normal (cast to ``float_dtype`` when given,
    for ``bf16-pure``); integer inputs are uniform in ``[0, high)`` (``high``
    defaults to 2); bool inputs are all False.
    """
    out: list[torch.Tensor] = []
    for spec in specs:
        name = str(getattr(spec.dtype, "value", spec.dtype))
        dtype = INPUT_DTYPES.get(name)
        if dtype is None:
            raise ValueError(f"unknown input dtype {name!r}; allowed: {', '.join(INPUT_DTYPES)}")
        shape = (micro_batch, *tuple(int(s) for s in spec.shape))
        if dtype.is_floating_point:
            t = torch.randn(shape, dtype=float_dtype or dtype)
        elif dtype is torch.bool:
            t = torch.zeros(shape, dtype=torch.bool)
        else:
            high = int(getattr(spec, "high", None) or 2)
            t = torch.randint(0, high, shape, dtype=dtype)
        out.append(t)
    return tuple(out)


def example_batch(
    make_batch: BatchLike, micro_batch: int, *, float_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, ...]:
    """The batch of one step: ``make_batch(micro_batch)`` when it is callable, else :func:`make_inputs` of the specs.

    ``float_dtype`` (``bf16-pure``) casts the floating tensors either way.
    """
    if callable(make_batch):
        batch = tuple(make_batch(micro_batch))
        if float_dtype is not None:
            batch = tuple(t.to(float_dtype) if t.is_floating_point() else t for t in batch)
        return batch
    return make_inputs(make_batch, micro_batch, float_dtype=float_dtype)


def describe_batch(batch: Sequence[torch.Tensor]) -> str:
    """``"(2, 100) float32, ..."``: the shapes and dtypes of ``batch``, for error messages."""
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in batch)
