"""Activation checkpointing: which blocks are wrapped, what selective checkpointing saves, and how the
tracer learns when a block is being recomputed.

``full`` checkpointing recomputes every block; ``selective`` checkpoints the
same blocks but saves the outputs of matmuls, convolutions and attention
(PyTorch's selective activation checkpointing, as torchtitan's "op" mode) and
recomputes only the cheap ops between them (norms, activations, element-wise).

Recomputation is signalled through ``torch.utils.checkpoint``'s ``context_fn``:
its second context manager (:class:`_RecomputeMarker`) is entered exactly while
a region is recomputed and tells the listener in :data:`recompute_listener`;
the tracer's listener is a :class:`RecomputeProbe`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from trainplan.estimate.memory import is_checkpointed_block
from trainplan.spec import Checkpointing

if TYPE_CHECKING:
    from trainplan.estimate.trace.flops import FlopTally
    from trainplan.estimate.trace.memory import StorageTimeline

__all__ = [
    "SELECTIVE_SAVE_OPS",
    "RecomputeProbe",
    "apply_activation_checkpointing",
    "find_checkpoint_blocks",
    "recompute_listener",
]

# Listener told when recomputation starts (True) and stops (False); set by the tracer
# for the duration of one step (``recompute_listener.set`` / ``.reset(token)``).
recompute_listener: ContextVar[Callable[[bool], None] | None] = ContextVar("trainplan_recompute_listener", default=None)


class _RecomputeMarker(contextlib.AbstractContextManager["_RecomputeMarker"]):
    """Entered by ``torch.utils.checkpoint`` exactly while it recomputes a region."""

    def __enter__(self) -> _RecomputeMarker:
        listener = recompute_listener.get()
        if listener is not None:
            listener(True)
        return self

    def __exit__(self, *exc: object) -> None:
        listener = recompute_listener.get()
        if listener is not None:
            listener(False)


# Ops whose outputs selective checkpointing keeps: the expensive ones.  Their
# outputs are saved; everything in between is recomputed.
SELECTIVE_SAVE_OPS: frozenset[Any] = frozenset(
    op
    for op in (
        getattr(torch.ops.aten, "mm", None),
        getattr(torch.ops.aten, "addmm", None),
        getattr(torch.ops.aten, "bmm", None),
        getattr(torch.ops.aten, "baddbmm", None),
        getattr(torch.ops.aten, "convolution", None),
        getattr(torch.ops.aten, "_convolution", None),
        getattr(torch.ops.aten, "mkldnn_convolution", None),
        getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None),
        getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None),
        getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None),
        getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None),
    )
    if op is not None
)


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    packet = getattr(op, "overloadpacket", op)
    return CheckpointPolicy.MUST_SAVE if packet in SELECTIVE_SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _context_fn(
    mode: Checkpointing,
) -> Callable[[], tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]]:
    def full() -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
        return contextlib.nullcontext(), _RecomputeMarker()

    def selective() -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
        fwd, recompute = create_selective_checkpoint_contexts(_selective_policy)
        stack = contextlib.ExitStack()

        class _Both(contextlib.AbstractContextManager[None]):
            def __enter__(self) -> None:
                stack.enter_context(_RecomputeMarker())
                stack.enter_context(recompute)

            def __exit__(self, *exc: object) -> None:
                stack.close()

        return fwd, _Both()

    return selective if mode is Checkpointing.SELECTIVE else full


def find_checkpoint_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The blocks that activation checkpointing wraps in a generic model.

    Every child (with parameters) of the outermost ``nn.ModuleList`` /
    ``nn.Sequential`` containers that have at least two children — the trunk of
    layers in almost every architecture, the down and up paths of a U-Net, the
    model itself if it is a ``Sequential``.  Without such a container, the
    model's direct children with parameters.
    """
    blocks: list[tuple[str, nn.Module]] = []
    taken: list[str] = []
    for name, module in model.named_modules():
        if any(name == t or name.startswith(t + ".") or t == "" for t in taken):
            continue
        if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) >= 2:
            taken.append(name)
            for child_name, child in module.named_children():
                if any(True for _ in child.parameters()):
                    blocks.append((f"{name}.{child_name}" if name else child_name, child))
    if not blocks:
        blocks = [(n, c) for n, c in model.named_children() if any(True for _ in c.parameters())]
    return blocks


def _wrap_forward(module: nn.Module, context_fn: Callable[[], Any]) -> None:
    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def apply_activation_checkpointing(model: nn.Module, mode: Checkpointing, fraction: float = 1.0) -> str:
    """Enable checkpointing on ``model`` in place; returns what was wrapped, in words.

    Hugging Face models use their own ``activation_checkpointing_enable`` /
    ``gradient_checkpointing_enable`` (non-reentrant), other models get their
    blocks (:func:`find_checkpoint_blocks`) wrapped in
    ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``.  With ``fraction`` < 1 (full checkpointing on a
    share of the blocks: knobs.checkpoint_fraction) only the blocks :func:`memory.is_checkpointed_block` picks are
    wrapped, Hugging Face decoder layers included; the others keep all their activations.
    """
    if mode is Checkpointing.NONE:
        return "none"
    context_fn = _context_fn(mode)
    kwargs = {"use_reentrant": False, "context_fn": context_fn}
    if fraction < 1.0:
        if mode is not Checkpointing.FULL:
            raise ValueError("a share of the blocks is checkpointed under full checkpointing only")
        chosen = [(n, b) for i, (n, b) in enumerate(find_checkpoint_blocks(model)) if is_checkpointed_block(i, fraction)]
        for _, block in chosen:
            _wrap_forward(block, context_fn)
        names = ", ".join(n for n, _ in chosen[:4]) + (", ..." if len(chosen) > 4 else "")
        return f"full on {len(chosen)} of the blocks ({names})"
    if getattr(model, "supports_gradient_checkpointing", False):
        enable = getattr(model, "activation_checkpointing_enable", None)
        if callable(enable):
            enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)  # type: ignore[operator]
        return f"{mode.value}: Hugging Face layers of {type(model).__name__}"
    blocks = find_checkpoint_blocks(model)
    for _, block in blocks:
        _wrap_forward(block, context_fn)
    names = ", ".join(n for n, _ in blocks[:4]) + (", ..." if len(blocks) > 4 else "")
    return f"{mode.value}: {len(blocks)} blocks ({names})"


class RecomputeProbe:
    """The tracer's :data:`recompute_listener`: told when recomputation starts and stops.

    It marks the timeline (recomputed tensors are activations), books the FLOPs
    counted meanwhile as recomputation, and re-enters the torch-function modes
    of the forward pass (``torch.utils.checkpoint`` recomputes inside the
    autograd engine, where torch-function modes are not active).
    """

    def __init__(
        self, timeline: StorageTimeline, counter: FlopTally, function_modes: Callable[[], list[TorchFunctionMode]]
    ) -> None:
        self.timeline = timeline
        self.counter = counter
        self.function_modes = function_modes
        self.depth = 0
        self.flops = 0
        self._start = 0
        self._stack: contextlib.ExitStack | None = None

    def __call__(self, entering: bool) -> None:
        if entering:
            self.depth += 1
            if self.depth == 1:
                self._start = self.counter.get_total_flops()
                self.timeline.recomputing = True
                self._stack = contextlib.ExitStack()
                for mode in self.function_modes():
                    self._stack.enter_context(mode)
        else:
            self.depth -= 1
            if self.depth == 0:
                if self._stack is not None:
                    self._stack.close()
                    self._stack = None
                self.flops += self.counter.get_total_flops() - self._start
                self.timeline.recomputing = False
