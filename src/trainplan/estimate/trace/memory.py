"""Live-memory timeline of one traced training step.

:class:`StorageTimeline` is a ``TorchDispatchMode`` that sees the result of
every ATen operator run while it is active.  For each tensor storage it has
not seen before it records an *allocation* event (its size in bytes) and
attaches a weak-reference callback that records the matching *free* event when
the storage dies.  Storages that exist before the step (parameters, optimizer
state, the batch) are registered explicitly with :meth:`StorageTimeline.track`.
What a kernel allocates inside itself and frees before it returns is invisible
to a dispatch mode; a :data:`WorkspaceModel` (see
:mod:`trainplan.estimate.trace.workspace`) adds it per operator.

Categories are assigned *after* the step, from what each storage turned out to
be (a parameter, a parameter's ``.grad``, a tensor in ``optimizer.state``, or
else an activation / temporary depending on when it was born), and the timeline
is then replayed by :func:`replay` to find the peak, its breakdown and its
phase.  Assigning categories after the fact matters twice: a gradient is born
as the output of a backward kernel and only becomes ``param.grad`` when
``AccumulateGrad`` steals it, and a tensor born during ``optimizer.step()`` is
optimizer *state* only if the optimizer keeps it (``foreach`` AdamW also makes
parameter-sized temporaries that it frees again).

The same bookkeeping idea underlies PyTorch's own
``torch.distributed._tools.mem_tracker.MemTracker``; that class was measured
here at ~50 s for one LLaMA-7B step (it deep-copies a snapshot per module on
every operator) against ~3 s for this one, and it files optimizer-step
temporaries under optimizer state, so it is not used.  See ``docs/trace.md``.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

__all__ = [
    "CUDA_ALLOCATION_GRANULARITY_BYTES",
    "Category",
    "Phase",
    "ReplayResult",
    "StorageTimeline",
    "WorkspaceModel",
    "replay",
    "training_loop_events",
]

# The CUDA caching allocator rounds every block up to a multiple of 512 bytes
# (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp), and
# ``torch.cuda.max_memory_allocated`` reports the rounded sizes.  The CPU
# allocator reports exact sizes.
CUDA_ALLOCATION_GRANULARITY_BYTES = 512


class Phase(str, Enum):
    """Where in the training step something happened (ordered as in the step)."""

    FORWARD = "forward"  # model forward and the loss
    BACKWARD = "backward"  # loss.backward(), including recomputation
    OPTIMIZER = "optimizer"  # optimizer.step()


class Category(str, Enum):
    """What a byte of device memory holds."""

    PARAMETERS = "parameters"  # parameters and buffers
    GRADIENTS = "gradients"  # ``param.grad``
    OPTIMIZER = "optimizer"  # tensors kept in ``optimizer.state``
    ACTIVATIONS = "activations"  # born in forward (or recomputed): saved tensors, outputs, the batch
    TEMPORARIES = "temporaries"  # born in backward / optimizer step and not kept as state


_PHASES: tuple[Phase, ...] = tuple(Phase)
_CATEGORIES: tuple[Category, ...] = tuple(Category)


@dataclass(frozen=True)
class _Storage:
    """One tracked storage: its size and when it was born."""

    nbytes: int
    phase: Phase
    recomputed: bool
    preexisting: bool
    workspace: bool = False  # a kernel's internal buffer, alive only during its operator


# A model of the memory a kernel allocates internally and frees before it
# returns (invisible to a dispatch mode): (op, args, kwargs, outputs) -> bytes.
WorkspaceModel = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], int]

# A model of an output the fake kernel returns empty but the real kernel fills and autograd keeps (oneDNN's
# LSTM workspace, ``workspace.cpu_rnn_saved_workspace``): (op, args, kwargs, outputs) -> (that output, its
# real bytes) or None.  The timeline books that output's storage at the real size, for as long as it lives.
SavedWorkspaceModel = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], "tuple[Any, int] | None"]


class StorageTimeline(TorchDispatchMode):
    """Record allocation and free events of tensor storages, with the phase of each.

    ``granularity_bytes`` rounds each storage up as the target device's allocator
    would (512 for CUDA, 1 for CPU).  The driver sets :attr:`phase` and
    :attr:`recomputing` as the step proceeds, and calls :meth:`close` when the
    step is over so that frees during teardown are not recorded.
    """

    def __init__(self, *, granularity_bytes: int = 1, workspace: WorkspaceModel | None = None,
                 saved_workspace: SavedWorkspaceModel | None = None) -> None:  # fmt: skip
        super().__init__()
        if granularity_bytes < 1:
            raise ValueError(f"granularity_bytes must be >= 1, got {granularity_bytes}")
        self.granularity_bytes = granularity_bytes
        self.workspace = workspace
        self.saved_workspace = saved_workspace
        self.phase: Phase = Phase.FORWARD
        self.recomputing: bool = False
        self.storages: list[_Storage] = []
        # (storage key, signed bytes, phase index); positive = allocation.
        self.events: list[tuple[int, int, int]] = []
        self._keys: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._closed = False

    # ------------------------------------------------------------------ recording
    def _rounded(self, nbytes: int) -> int:
        g = self.granularity_bytes
        return int(math.ceil(nbytes / g) * g)

    def _on_free(self, key: int, _ref: weakref.ref[Any]) -> None:
        self._refs.pop(key, None)
        if not self._closed:
            self.events.append((key, -self.storages[key].nbytes, _PHASES.index(self.phase)))

    def _see(self, t: torch.Tensor, *, preexisting: bool, real_nbytes: int | None = None) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # e.g. sparse or exotic subclasses: not tracked
            return
        if st in self._keys:
            return
        nbytes = self._rounded(st.nbytes() if real_nbytes is None else real_nbytes)
        key = len(self.storages)
        self._keys[st] = key
        self.storages.append(_Storage(nbytes, self.phase, self.recomputing, preexisting))
        self._refs[key] = weakref.ref(st, partial(self._on_free, key))
        if nbytes:
            self.events.append((key, nbytes, _PHASES.index(self.phase)))

    def track(self, tensors: Iterable[Any]) -> None:
        """Register tensors that exist before the step (parameters, state, batch)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._see(t, preexisting=True)

    def key_of(self, t: torch.Tensor) -> int | None:
        """The key of the storage behind ``t``, or ``None`` if it was never seen."""
        try:
            return self._keys.get(t.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return None

    def close(self) -> None:
        """Stop recording (frees after this point belong to teardown, not the step)."""
        self._closed = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self._closed:
            sized = self.saved_workspace(func, args, kwargs, out) if self.saved_workspace is not None else None
            for leaf in tree_leaves(out):
                if isinstance(leaf, torch.Tensor):
                    real = sized[1] if sized is not None and leaf is sized[0] else None
                    self._see(leaf, preexisting=False, real_nbytes=real)
            if self.workspace is not None:
                extra = self._rounded(self.workspace(func, args, kwargs, out))
                if extra > 0:
                    key = len(self.storages)
                    self.storages.append(_Storage(extra, self.phase, self.recomputing, False, workspace=True))
                    phase_idx = _PHASES.index(self.phase)
                    self.events.append((key, extra, phase_idx))
                    self.events.append((key, -extra, phase_idx))
        return out


@dataclass(frozen=True)
class ReplayResult:
    """The peak of a replayed timeline."""

    peak_bytes: int
    at_peak: dict[Category, int]
    peak_phase: Phase
    activation_peak_bytes: int  # max of activations + temporaries over forward and backward
    optimizer_temporary_bytes: int  # max of temporaries during the optimizer step
    phase_peaks: dict[Phase, int]  # highest total reached within each phase


def replay(timeline: StorageTimeline, categories: dict[int, Category]) -> ReplayResult:
    """Replay ``timeline`` with the final category of each storage.

    ``categories`` maps storage keys to :class:`Category` for parameters,
    gradients and optimizer state; every other storage is an activation if it
    was born in the forward pass, while recomputing, or before the step (the
    batch), and a temporary otherwise.
    """

    def category(key: int) -> Category:
        known = categories.get(key)
        if known is not None:
            return known
        s = timeline.storages[key]
        if s.workspace:
            return Category.TEMPORARIES
        if s.preexisting or s.recomputed or s.phase is Phase.FORWARD:
            return Category.ACTIVATIONS
        return Category.TEMPORARIES

    live = dict.fromkeys(_CATEGORIES, 0)
    total = 0
    peak = -1
    at_peak = dict(live)
    peak_phase = Phase.FORWARD
    act_peak = 0
    opt_temp_peak = 0
    phase_peaks = dict.fromkeys(_PHASES, 0)
    for key, delta, phase_idx in timeline.events:
        cat = category(key)
        live[cat] += delta
        total += delta
        phase = _PHASES[phase_idx]
        phase_peaks[phase] = max(phase_peaks[phase], total)
        if total > peak:
            peak = total
            at_peak = dict(live)
            peak_phase = phase
        if phase is Phase.OPTIMIZER:
            opt_temp_peak = max(opt_temp_peak, live[Category.TEMPORARIES])
        else:
            act_peak = max(act_peak, live[Category.ACTIVATIONS] + live[Category.TEMPORARIES])
    return ReplayResult(
        peak_bytes=max(peak, 0),
        at_peak=at_peak,
        peak_phase=peak_phase,
        activation_peak_bytes=act_peak,
        optimizer_temporary_bytes=opt_temp_peak,
        phase_peaks=phase_peaks,
    )


def training_loop_events(timeline: StorageTimeline, categories: dict[int, Category], *,
                         steps: int = 3) -> list[tuple[int, int]]:  # fmt: skip
    """The traced step as a training loop repeats it, as (key, ±bytes) events in the process's order.

    The parameters are allocated first (the model is built after the run starts measuring), the optimizer
    state when the first step's optimizer phase begins (``torch.optim`` creates it lazily), a new batch at the
    start of every step (the previous one freed once the new one exists), then the step's own events; what the
    step leaves alive (the gradients) is freed when the next step begins (``zero_grad(set_to_none=True)``).
    Each step's storages get keys of their own.  ``estimate/heap.py`` replays this for a CPU process.
    """
    n = len(timeline.storages)
    pre = [k for k, s in enumerate(timeline.storages) if s.preexisting and s.nbytes]
    params = [k for k in pre if categories.get(k) is Category.PARAMETERS]
    state = [k for k in pre if categories.get(k) is Category.OPTIMIZER]
    batch = [k for k in pre if k not in params and k not in state]
    size = {k: timeline.storages[k].nbytes for k in pre}
    optimizer = _PHASES.index(Phase.OPTIMIZER)
    events = [(k, size[k]) for k in params]
    carried: list[tuple[int, int]] = []  # (key, bytes) alive at the end of the previous step
    for step in range(steps):
        offset = (step + 1) * n
        events += [(offset + k, size[k]) for k in batch]
        events += [(key, -nbytes) for key, nbytes in carried]
        alive = {offset + k: size[k] for k in batch}
        state_pending = step == 0
        for key, delta, phase in timeline.events:
            if timeline.storages[key].preexisting:
                continue
            if state_pending and phase == optimizer:
                events += [(k, size[k]) for k in state]
                state_pending = False
            if delta > 0:
                alive[offset + key] = delta
                events.append((offset + key, delta))
            elif offset + key in alive:
                events.append((offset + key, -alive.pop(offset + key)))
        if state_pending:  # a step whose optimizer phase allocated nothing
            events += [(k, size[k]) for k in state]
        carried = list(alive.items())
    return events
