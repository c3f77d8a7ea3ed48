"""Estimate any PyTorch model by tracing one real training step on the fake device.

:func:`trace_training_step` builds the user's model on the meta device, gives
it fake CPU tensors (shapes and dtypes, no data: a 70B-parameter model costs
no memory) and runs one real training step of the real module — forward,
loss, ``backward()``, ``optimizer.step()`` — while PyTorch's FLOP formulas
count its FLOPs and a storage timeline follows every allocation, by category
(parameters, gradients, optimizer state, activations, temporaries) and phase
(forward, backward, optimizer).  ``docs/trace.md`` explains how and lists
where each part lives; in short:

* :mod:`.step` — :func:`trace_training_step`, as a sequence of named stages;
  :mod:`.watch` puts the instruments on the step, :mod:`.summary` turns it into
  a :class:`TraceResult` (:mod:`.results`);
* configuring the model: :mod:`.prepare` over :mod:`.precision`,
  :mod:`.checkpointing` and :mod:`.lora`; the step's parts: :mod:`.inputs`,
  :mod:`.optimizers`, :mod:`.loss`;
* measuring: :mod:`.memory` (timeline and replay), :mod:`.workspace`
  (memory inside kernels), :mod:`.flops`; the device: :mod:`.fake` (fake
  tensors) and :mod:`.target` (a CUDA job traced on the fake CPU device);
* :mod:`.factory` (where the model comes from) and :mod:`.errors`.
"""

from __future__ import annotations

from trainplan.estimate.trace.errors import TraceError
from trainplan.estimate.trace.factory import build_hf_causal_lm, load_factory
from trainplan.estimate.trace.results import MemoryBreakdown, TraceResult
from trainplan.estimate.trace.step import trace_training_step

__all__ = [
    "MemoryBreakdown",
    "TraceError",
    "TraceResult",
    "build_hf_causal_lm",
    "load_factory",
    "trace_training_step",
]
