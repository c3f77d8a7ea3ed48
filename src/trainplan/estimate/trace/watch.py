"""The instruments on the traced step: memory timeline, FLOP tally and recomputation probe, together.

:func:`watching` registers what exists before the step, enters the
instruments for as long as its context is open, and yields a
:class:`StepWatch`; each stage of the step runs inside
:meth:`StepWatch.phase`, which books its allocations, frees and FLOPs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from torch.optim import Optimizer as TorchOptimizer

from trainplan.estimate.trace.checkpointing import RecomputeProbe, recompute_listener
from trainplan.estimate.trace.fake import model_tensors, unpacked_batches_for_transformers
from trainplan.estimate.trace.flops import FlopTally
from trainplan.estimate.trace.memory import Phase, StorageTimeline
from trainplan.estimate.trace.optimizers import optimizer_tensors
from trainplan.estimate.trace.target import function_modes, step_timeline

__all__ = ["StepWatch", "watching"]


@dataclass
class StepWatch:
    """Memory timeline, FLOP tally, recomputation probe, and the FLOPs, operators and memory-bound bytes counted in
    each phase."""

    timeline: StorageTimeline
    counter: FlopTally
    probe: RecomputeProbe
    flops: dict[Phase, int] = field(default_factory=dict)
    ops: dict[Phase, int] = field(default_factory=dict)
    memory_bytes: dict[Phase, int] = field(default_factory=dict)
    attention_flops: dict[Phase, int] = field(default_factory=dict)  # fused attention kernels' share of `flops`

    @contextlib.contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        """Book allocations, frees, FLOPs and operators to ``phase`` (frees stay in it until the next phase begins)."""
        self.timeline.phase = phase
        c = self.counter
        start = (c.get_total_flops(), c.ops, c.memory_bytes, c.class_flops["attention"])
        yield
        self.flops[phase] = c.get_total_flops() - start[0]
        self.ops[phase] = c.ops - start[1]
        self.memory_bytes[phase] = c.memory_bytes - start[2]
        self.attention_flops[phase] = c.class_flops["attention"] - start[3]


@contextlib.contextmanager
def watching(
    model: nn.Module, opt: TorchOptimizer, batch: tuple[torch.Tensor, ...], *, on_cuda: bool
) -> Iterator[StepWatch]:
    """Put the instruments on the step, for as long as the context is open.

    The model's tensors, the optimizer state and the batch are registered as
    existing before the step; the timeline and the FLOP tally see every
    operator; the recomputation probe listens to checkpointing; the target's
    torch-function modes and the transformers packed-sequence answer are on.
    Frees after the step (teardown) are not recorded.
    """
    timeline = step_timeline(on_cuda=on_cuda)
    timeline.track(model_tensors(model))
    timeline.track(optimizer_tensors(opt, skip_scalars=on_cuda))
    timeline.track(batch)
    counter = FlopTally()
    modes = partial(function_modes, on_cuda=on_cuda)
    probe = RecomputeProbe(timeline, counter, modes)
    token = recompute_listener.set(probe)
    try:
        with timeline, counter, unpacked_batches_for_transformers(), contextlib.ExitStack() as entered:
            for mode in modes():
                entered.enter_context(mode)
            yield StepWatch(timeline, counter, probe)
            timeline.close()
    finally:
        recompute_listener.reset(token)
