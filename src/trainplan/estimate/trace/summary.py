"""From the watched step to a :class:`~trainplan.estimate.trace.results.TraceResult`.

Each storage is labelled by what it turned out to be (a parameter or buffer,
some parameter's ``.grad``, a tensor kept in ``optimizer.state``; anything else
is an activation or a temporary by when it was born, see
:func:`~trainplan.estimate.trace.memory.replay`), the timeline is replayed for
the peak, and QLoRA's 4-bit storage is applied as bookkeeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn
from torch.optim import Optimizer as TorchOptimizer

from trainplan.estimate.allocator import replay_events
from trainplan.estimate.heap import replay_heap
from trainplan.estimate.trace.fake import model_tensors
from trainplan.estimate.trace.lora import QLORA_NOTE, qlora_bytes
from trainplan.estimate.trace.memory import Category, Phase, StorageTimeline, replay, training_loop_events
from trainplan.estimate.trace.optimizers import ADAM8BIT_NOTE, optimizer_tensors
from trainplan.estimate.trace.prepare import PreparedModel
from trainplan.estimate.trace.results import MemoryBreakdown, TraceResult
from trainplan.estimate.trace.target import CUDA_NOTE
from trainplan.estimate.trace.watch import StepWatch
from trainplan.spec import Optimizer

__all__ = ["summarise"]


def summarise(
    model: nn.Module,
    opt: TorchOptimizer,
    prepared: PreparedModel,
    watch: StepWatch,
    *,
    on_cuda: bool,
    optimizer: Optimizer,
) -> TraceResult:
    """Label each storage, replay the timeline for the peak, and add QLoRA's bookkeeping."""
    timeline = watch.timeline
    categories = _categories(timeline, model, opt, skip_scalars=on_cuda)
    result = replay(timeline, categories)
    state = {
        cat: sum(timeline.storages[k].nbytes for k, c in categories.items() if c is cat)
        for cat in (Category.PARAMETERS, Category.GRADIENTS, Category.OPTIMIZER)
    }
    at_peak = dict(result.at_peak)
    peak = result.peak_bytes
    activation_peak = result.activation_peak_bytes
    if prepared.quantized_numels:
        saved, dequantized = qlora_bytes(prepared.quantized_numels, prepared.quantized_element_bytes)
        at_peak[Category.PARAMETERS] -= saved
        state[Category.PARAMETERS] -= saved
        at_peak[Category.TEMPORARIES] += dequantized
        activation_peak += dequantized
        peak += dequantized - saved
    params = list(model.parameters())
    recompute = watch.probe.flops
    # the same allocations through PyTorch's caching-allocator rules: what it would reserve (estimate/allocator.py)
    events = [(key, delta) for key, delta, _ in timeline.events]
    cached = replay_events(events)
    expandable = replay_events(events, expandable_segments=True)
    # on a CPU: the training loop's allocations through glibc's malloc, what its heap keeps (estimate/heap.py)
    heap = None if on_cuda else replay_heap(training_loop_events(timeline, categories)).retained
    return TraceResult(
        params=sum(p.numel() for p in params),
        trainable_params=sum(p.numel() for p in params if p.requires_grad),
        flops_forward=float(watch.flops[Phase.FORWARD]),
        flops_backward=float(watch.flops[Phase.BACKWARD] - recompute),
        flops_recompute=float(recompute),
        peak_bytes=int(peak),
        at_peak=_breakdown(at_peak),
        peak_phase=result.peak_phase.value,
        state_bytes=_breakdown({**state, Category.ACTIVATIONS: 0, Category.TEMPORARIES: 0}),
        activation_peak_bytes=int(activation_peak),
        notes=_notes(prepared, on_cuda=on_cuda, optimizer=optimizer),
        optimizer_temporary_bytes=int(result.optimizer_temporary_bytes),
        reserve_fraction=cached.fragmentation,
        expandable_reserve_fraction=expandable.fragmentation,
        reserve_bytes=cached.reserved - cached.allocated,
        expandable_reserve_bytes=expandable.reserved - expandable.allocated,
        heap_retention_bytes=heap,
        ops_step=watch.ops[Phase.FORWARD] + watch.ops[Phase.BACKWARD],
        memory_bytes_step=watch.memory_bytes[Phase.FORWARD] + watch.memory_bytes[Phase.BACKWARD],
        ops_optimizer=watch.ops[Phase.OPTIMIZER],
        memory_bytes_optimizer=watch.memory_bytes[Phase.OPTIMIZER],
        conv_flops_step=watch.counter.class_flops["conv"],
        rnn_flops_step=watch.counter.class_flops["rnn"],
        attention_flops_forward=watch.attention_flops[Phase.FORWARD],
        attention_flops_backward=watch.attention_flops[Phase.BACKWARD],
        memory_bytes_forward=watch.memory_bytes[Phase.FORWARD],
        memory_bytes_backward=watch.memory_bytes[Phase.BACKWARD],
        flops_optimizer=float(watch.flops[Phase.OPTIMIZER]),
    )


def _categories(
    timeline: StorageTimeline, model: nn.Module, opt: TorchOptimizer, *, skip_scalars: bool
) -> dict[int, Category]:
    """Storage key -> category for gradients, optimizer state and model tensors (later labels win)."""
    categories: dict[int, Category] = {}

    def mark(tensors: Any, cat: Category) -> None:
        for t in tensors:
            key = timeline.key_of(t)
            if key is not None:
                categories[key] = cat

    mark((p.grad for p in model.parameters() if p.grad is not None), Category.GRADIENTS)
    mark(optimizer_tensors(opt, skip_scalars=skip_scalars), Category.OPTIMIZER)
    mark(model_tensors(model), Category.PARAMETERS)
    return categories


def _notes(prepared: PreparedModel, *, on_cuda: bool, optimizer: Optimizer) -> tuple[str, ...]:
    """The approximations applied, in words."""
    notes: list[str] = []
    if on_cuda:
        notes.append(CUDA_NOTE)
    if optimizer is Optimizer.ADAM8BIT:
        notes.append(ADAM8BIT_NOTE)
    if prepared.quantized_numels:
        notes.append(QLORA_NOTE)
    if prepared.lora_backend:
        notes.append(f"lora via {prepared.lora_backend}")
    if prepared.checkpointing != "none":
        notes.append(f"activation checkpointing {prepared.checkpointing}")
    return tuple(notes)


def _breakdown(values: Mapping[Category, int]) -> MemoryBreakdown:
    return MemoryBreakdown(
        parameters=int(values[Category.PARAMETERS]),
        gradients=int(values[Category.GRADIENTS]),
        optimizer=int(values[Category.OPTIMIZER]),
        activations=int(values[Category.ACTIVATIONS]),
        temporaries=int(values[Category.TEMPORARIES]),
    )
