"""Running the model on the fake device: fake twins of its tensors, and what fake tensors cannot answer.

The model is built on the meta device and given fake CPU tensors here
(:func:`materialize_fake`).  Fake tensors carry shapes and dtypes but no
values, so code that reads values must be answered for them: the optimizer's
host scalars (:class:`~trainplan.estimate.trace.optimizers.OptimizerScalars`)
and transformers' packed-sequence check (:func:`unpacked_batches_for_transformers`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

__all__ = ["materialize_fake", "model_tensors", "unpacked_batches_for_transformers"]


def model_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Parameters, buffers and plain tensor attributes of every submodule."""
    yield from model.parameters()
    yield from model.buffers()
    for m in model.modules():
        for v in vars(m).values():
            if isinstance(v, torch.Tensor):
                yield v


def materialize_fake(model: nn.Module) -> None:
    """Replace every parameter, buffer and tensor attribute by an empty tensor on the
    (fake) CPU device, keeping shared tensors shared.  Call under ``FakeTensorMode``."""
    # id -> (old, new); holding the old tensor keeps its id from being reused.
    memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def twin(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            new = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")
            if isinstance(t, nn.Parameter):
                new = nn.Parameter(new, requires_grad=t.requires_grad)
            memo[id(t)] = (t, new)
        return memo[id(t)][1]

    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = twin(p)  # type: ignore[assignment]  # twin of a Parameter is a Parameter
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = twin(b)
        for name, v in list(vars(m).items()):
            if isinstance(v, torch.Tensor):
                setattr(m, name, twin(v))


@contextlib.contextmanager
def unpacked_batches_for_transformers() -> Iterator[None]:
    """Tell transformers that the traced batch holds no packed sequences.

    transformers checks ``position_ids`` for packed sequences and skips the
    causal mask (SDPA's ``is_causal``) only after reading their values; on fake
    tensors it cannot, assumes a packed batch, and materializes a ``(B, 1, S, S)``
    mask and repeated K/V heads that a real run of the same batch does not have.
    The trace's batches are never packed or padded, so the check is answered
    for it.  The patch is process-global while the context is open, and undone
    when it closes.  No-op without transformers.
    """
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    if not hasattr(masking_utils, "find_packed_sequence_indices"):
        yield
        return
    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda *args, **kwargs: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original
