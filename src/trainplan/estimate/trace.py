"""Estimate any PyTorch model by tracing one real training step on the fake device.

:func:`trace_training_step` builds the user's model under PyTorch's
``FakeTensorMode`` (tensors carry shapes, dtypes and devices but no data, so a
70B-parameter model costs no memory) and runs one *real* training step of the
real module: forward, loss, ``backward()`` and ``optimizer.step()`` of the real
``torch.optim`` optimizer.  While it runs:

* ``torch.utils.flop_counter.FlopCounterMode`` (PyTorch's own counter) counts
  the FLOPs of matmuls, convolutions and attention, split into forward,
  backward and recomputation (recomputation is told apart through the
  ``context_fn`` hook of ``torch.utils.checkpoint``);
* :class:`~trainplan.estimate.trace_memory.StorageTimeline` follows every
  storage allocated and freed, so the live memory of the step is known at every
  operator, by category (parameters, gradients, optimizer state, activations,
  temporaries) and by phase (forward, backward, optimizer).

The step is a steady-state step: the optimizer state exists before it starts
(as in every step after the first), gradients do not (``zero_grad(set_to_none=True)``),
and the model output is dropped once the loss is computed.

Tracing always runs on the fake **CPU** device: a CPU-only build of PyTorch
cannot run a training step on fake CUDA tensors (``.to("cuda")``, autograd
metadata and SDPA fail or abort), and a trace must not depend on whether the
planning machine has a GPU.  For ``device="cuda"`` the trace applies what
differs on CUDA and matters for memory: the caching allocator's 512-byte
rounding and the multi-tensor (``foreach``) optimizers PyTorch uses by default
there.  Other differences (CPU vs CUDA autocast op lists, kernel workspaces)
are listed in ``docs/trace.md``.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensorMode,
    UnsupportedOperatorException,
)
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import (
    FlopCounterMode,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from trainplan.errors import TrainplanError
from trainplan.estimate.trace_memory import (
    CUDA_ALLOCATION_GRANULARITY_BYTES,
    Category,
    Phase,
    StorageTimeline,
    cpu_convolution_workspace,
    replay,
)
from trainplan.estimate.trace_setup import (
    QLORA_BITS_PER_PARAM,
    InputLike,
    LoraLike,
    autocast_context,
    forward_and_loss,
    make_inputs,
    make_optimizer,
    prepare_model,
    prime_optimizer_state,
    recompute_listener,
)
from trainplan.spec import Checkpointing, Optimizer, Precision

__all__ = [
    "MemoryBreakdown",
    "TraceError",
    "TraceResult",
    "build_hf_causal_lm",
    "load_factory",
    "trace_training_step",
]


class TraceError(TrainplanError):
    """Tracing the model failed for a reason the user can fix; the message is one line."""


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of device memory by what they hold."""

    parameters: int  # parameters and buffers
    gradients: int
    optimizer: int  # optimizer state
    activations: int  # saved for backward, outputs, the batch, recomputed tensors
    temporaries: int  # born in backward or the optimizer step and not kept

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.temporaries


@dataclass(frozen=True)
class TraceResult:
    """What one traced training step needs, for the whole micro-batch on one device."""

    params: int  # all parameters (frozen included), each shared parameter once
    trainable_params: int
    flops_forward: float
    flops_backward: float  # backward kernels, without recomputation
    flops_recompute: float  # forward ops recomputed by activation checkpointing
    peak_bytes: int
    at_peak: MemoryBreakdown
    peak_phase: str  # "forward" | "backward" | "optimizer"
    state_bytes: MemoryBreakdown  # params / grads / optimizer state held after the step; activations 0
    activation_peak_bytes: int  # highest activations + temporaries during forward and backward
    notes: tuple[str, ...] = ()  # approximations applied, in words
    optimizer_temporary_bytes: int = 0  # highest temporaries during optimizer.step() (foreach buffers)

    @property
    def flops_per_step(self) -> float:
        return self.flops_forward + self.flops_backward + self.flops_recompute


# --------------------------------------------------------------------------- factories


def load_factory(path: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (the attribute may be dotted: ``mod:Class.build``).

    The current directory is searched too, as ``python -c`` would.  Raises
    :class:`TraceError` naming the path and what went wrong.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TraceError(f"model factory must be 'package.module:function', got {path!r}")
    added = os.getcwd() not in sys.path
    if added:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise TraceError(f"cannot import module {module_name!r} of model factory {path!r}: {exc}") from exc
    except Exception as exc:  # the module itself raised while importing
        raise TraceError(
            f"importing {module_name!r} for model factory {path!r} raised {type(exc).__name__}: {_one_line(exc)}"
        ) from exc
    finally:
        if added:
            sys.path.remove(os.getcwd())
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TraceError(f"module {module_name!r} has no attribute {attr!r} (model factory {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TraceError(f"model factory {path!r} is a {type(obj).__name__}, not a callable")
    return obj  # type: ignore[no-any-return]


def build_hf_causal_lm(config: Mapping[str, Any] | Any) -> nn.Module:
    """A randomly initialised Hugging Face causal LM from a config (a ``config.json`` dict or a ``PretrainedConfig``).

    Called inside the tracer it builds fake tensors (no memory, no weights
    downloaded); called outside it builds a real model.  ``use_cache`` is off.
    """
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
    except ImportError as exc:  # pragma: no cover - transformers is in the torch extra
        raise TraceError("tracing a Hugging Face config needs transformers: pip install 'trainplan[torch]'") from exc
    if isinstance(config, PretrainedConfig):
        cfg = config
    elif isinstance(config, Mapping):
        kwargs = dict(config)
        model_type = kwargs.pop("model_type", None)
        if not model_type:
            raise TraceError("the Hugging Face config has no 'model_type' (e.g. 'llama', 'gpt2')")
        for key in ("architectures", "transformers_version", "torch_dtype", "dtype"):
            kwargs.pop(key, None)
        try:
            cfg = AutoConfig.for_model(model_type, **kwargs)
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"bad Hugging Face config for model_type {model_type!r}: {_one_line(exc)}") from exc
    else:
        raise TraceError(f"expected a config dict or PretrainedConfig, got {type(config).__name__}")
    cfg.use_cache = False
    try:
        return AutoModelForCausalLM.from_config(cfg)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise TraceError(f"transformers cannot build a causal LM from this config: {_one_line(exc)}") from exc


# --------------------------------------------------------------------------- tracing

# FlopCounterMode has formulas for CUDA's fused attention ops but not for the
# CPU flash-attention op the fake CPU device dispatches to; use PyTorch's own
# SDPA formulas for it (they count full, non-causal attention, as on CUDA).
_aten = torch.ops.aten


def _cpu_flash_forward_flop(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    return int(sdpa_flop_count(query_shape, key_shape, value_shape))


def _cpu_flash_backward_flop(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    return int(sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape))


_EXTRA_FLOP_FORMULAS: dict[Any, Callable[..., int]] = {}
if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _EXTRA_FLOP_FORMULAS[_aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_forward_flop
if hasattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
    _EXTRA_FLOP_FORMULAS[_aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_flash_backward_flop


class _FlopTally(TorchDispatchMode):
    """Sum the FLOPs of every operator with ``FlopCounterMode``'s own formulas.

    ``FlopCounterMode`` itself is not entered: its module tracker registers
    gradient hooks on module outputs that keep the tensors recomputed by
    activation checkpointing alive until the mode exits, which would inflate
    the memory this trace measures.  Its formula registry (``flop_registry``,
    PyTorch's ``register_flop_formula`` table plus our CPU-attention entries) is
    used as is.
    """

    def __init__(self) -> None:
        super().__init__()
        self.registry = FlopCounterMode(display=False, custom_mapping=_EXTRA_FLOP_FORMULAS).flop_registry
        self.total = 0

    def get_total_flops(self) -> int:
        return self.total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = self.registry.get(func._overloadpacket)
        if formula is not None:
            self.total += int(formula(*args, **kwargs, out_val=out))
        return out


class _OptimizerScalars(TorchDispatchMode):
    """Answer ``Tensor.item()`` with 1 (False for bools) while the optimizer steps.

    Some optimizers read scalars on the host (Adafactor reads the step count and
    each parameter's norm); their values steer arithmetic, not allocation, so a
    stand-in value traces the same memory.  Only used around ``optimizer.step()``:
    ``.item()`` in the model's forward is still reported as data-dependent.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default:
            t = args[0]
            return False if t.dtype is torch.bool else (1.0 if t.is_floating_point() else 1)
        return func(*args, **(kwargs or {}))


class _FusedAttentionAsOnCuda(TorchFunctionMode):
    """Run ``F.scaled_dot_product_attention`` as a fused kernel, as CUDA does.

    On CUDA, SDPA picks FlashAttention (or memory-efficient attention when a
    mask is given, or for fp32), which keeps only the output and a
    ``(B, H, S)`` fp32 log-sum-exp for backward — also with dropout.  On CPU,
    dropout or some masks make PyTorch fall back to the math path, which
    materializes ``(B, H, S, S)`` attention weights.  For a CUDA target the
    trace therefore calls the fused CPU flash-attention operator, whose outputs
    and saved tensors have the same sizes as the CUDA kernels'.  Under autocast
    the inputs are cast first, as SDPA's autocast rule does.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return _fused_sdpa(*args, **kwargs)


def _fused_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(dtype) if t.is_floating_point() else t for t in (query, key, value))
    # Grouped-query attention: the fused kernels read the shared K/V heads in place
    # (the fake operator accepts fewer K/V heads and gives K/V-shaped gradients).
    if attn_mask is not None and attn_mask.dtype != query.dtype and attn_mask.dtype is not torch.bool:
        attn_mask = attn_mask.to(query.dtype)
    out, _lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )
    return out


class _RecomputeProbe:
    """Told by the checkpoint ``context_fn`` when recomputation starts and stops.

    It marks the timeline (recomputed tensors are activations), books the FLOPs
    counted meanwhile as recomputation, and re-enters the torch-function modes
    of the forward pass (``torch.utils.checkpoint`` recomputes inside the
    autograd engine, where torch-function modes are not active).
    """

    def __init__(
        self, timeline: StorageTimeline, counter: _FlopTally, function_modes: Callable[[], list[TorchFunctionMode]]
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


@contextlib.contextmanager
def _unpacked_batches_for_transformers() -> Iterator[None]:
    """Tell transformers that the traced batch holds no packed sequences.

    transformers checks ``position_ids`` for packed sequences and skips the
    causal mask (SDPA's ``is_causal``) only after reading their values; on fake
    tensors it cannot, assumes a packed batch, and materializes a ``(B, 1, S, S)``
    mask and repeated K/V heads that a real run of the same batch does not have.
    The trace's batches are never packed or padded, so the check is answered
    for it.  No-op without transformers.
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _enum(cls: type[Any], value: Any, field: str) -> Any:
    try:
        return cls(getattr(value, "value", value))
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise TraceError(f"{field} must be one of {allowed}, got {value!r}") from None


def _target(device: str) -> str:
    kind = torch.device(device).type if device else "cuda"
    if kind not in ("cuda", "cpu"):
        raise TraceError(f"device must be 'cuda' or 'cpu', got {device!r}")
    return kind


def _model_tensors(model: nn.Module) -> Iterator[torch.Tensor]:
    """Parameters, buffers and plain tensor attributes of every submodule."""
    yield from model.parameters()
    yield from model.buffers()
    for m in model.modules():
        for v in vars(m).values():
            if isinstance(v, torch.Tensor):
                yield v


def _materialize_fake(model: nn.Module) -> None:
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


def _optimizer_tensors(optimizer: torch.optim.Optimizer, *, skip_scalars: bool) -> Iterator[torch.Tensor]:
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and not (skip_scalars and v.dim() == 0):
                yield v


@contextlib.contextmanager
def _stage(message: str) -> Iterator[None]:
    """Turn exceptions of one stage of the trace into :class:`TraceError`."""
    try:
        yield
    except TraceError:
        raise
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise TraceError(
            f"{message}: the model has data-dependent control flow or output shapes "
            f"(e.g. `if x.sum() > 0:`, `.item()`, `nonzero()`), which cannot be traced without real data "
            f"({_one_line(exc)})"
        ) from exc
    except UnsupportedOperatorException as exc:
        raise TraceError(
            f"{message}: operator {_one_line(exc)} has no fake-tensor implementation (a custom kernel?)"
        ) from exc
    except Exception as exc:
        raise TraceError(f"{message}: {type(exc).__name__}: {_one_line(exc)}") from exc


def trace_training_step(
    build_model: Callable[[], nn.Module],
    make_batch: Callable[[int], Sequence[torch.Tensor]] | Sequence[InputLike],
    *,
    micro_batch: int,
    precision: str | Precision = "bf16",
    optimizer: str | Optimizer = "adamw",
    activation_checkpointing: str | Checkpointing = "none",
    loss: str | Callable[[Any, Sequence[torch.Tensor]], torch.Tensor] = "mean",
    lora: LoraLike | None = None,
    qlora: bool = False,
    device: str = "cuda",
    lora_backend: str = "auto",
) -> TraceResult:
    """Trace one steady-state training step of ``build_model()`` on the fake device.

    ``make_batch`` is either a callable ``micro_batch -> tensors`` (called under
    the fake mode) or input specs (per-sample ``shape`` and ``dtype``; the batch
    dim is ``micro_batch``).  ``qlora`` stores the frozen linear weights in
    4-bit NF4 (bookkeeping, see ``notes``).  ``device`` is the device the job
    runs on (``cuda`` or ``cpu``).  Raises :class:`TraceError` when the model
    cannot be built or traced.
    """
    prec: Precision = _enum(Precision, precision, "precision")
    opt_name: Optimizer = _enum(Optimizer, optimizer, "optimizer")
    ckpt: Checkpointing = _enum(Checkpointing, activation_checkpointing, "activation_checkpointing")
    target = _target(device)
    if micro_batch < 1:
        raise TraceError(f"micro_batch must be >= 1, got {micro_batch}")
    if isinstance(loss, str) and loss not in ("mean", "sum", "mse", "cross_entropy"):
        raise TraceError(f"loss must be mean, sum, mse, cross_entropy or a callable, got {loss!r}")
    on_cuda = target == "cuda"
    notes: list[str] = []
    if on_cuda:
        notes.append(
            "traced on the fake CPU device with CUDA allocator rounding, foreach optimizers and fused attention"
        )

    name = getattr(build_model, "__qualname__", None) or type(build_model).__name__
    # Build and configure on the meta device (no memory, no init compute; Module.to
    # works there), then give every tensor a fake CPU twin.
    with torch.device("meta"):
        with _stage(f"the model factory {name} failed"):
            model = build_model()
        if not isinstance(model, nn.Module):
            raise TraceError(f"the model factory {name} returned {type(model).__name__}, not a torch.nn.Module")
        with _stage("cannot configure the model"):
            prepared = prepare_model(
                model, precision=prec, checkpointing=ckpt, lora=lora, qlora=qlora, lora_backend=lora_backend
            )
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        model = prepared.model
        with _stage("cannot move the model to the fake device"):
            _materialize_fake(model)
        pure_dtype = torch.bfloat16 if prec is Precision.BF16_PURE else None
        with _stage("cannot make the example batch"):
            if callable(make_batch):
                batch = tuple(make_batch(micro_batch))
                if pure_dtype is not None:
                    batch = tuple(t.to(pure_dtype) if t.is_floating_point() else t for t in batch)
            else:
                batch = make_inputs(make_batch, micro_batch, float_dtype=pure_dtype)
        # PyTorch's defaults: multi-tensor (foreach) kernels on CUDA, a loop over parameters on CPU.
        foreach = on_cuda if opt_name in (Optimizer.ADAMW, Optimizer.SGD, Optimizer.ADAFACTOR) else None
        with _stage("cannot create the optimizer"):
            opt = make_optimizer(model.parameters(), opt_name, foreach=foreach)
            with _OptimizerScalars():
                prime_optimizer_state(opt)
        if opt_name is Optimizer.ADAM8BIT:
            notes.append("adam8bit: bitsandbytes state layout allocated by a stand-in (uint8 states + block absmax)")

        timeline = (
            StorageTimeline(granularity_bytes=CUDA_ALLOCATION_GRANULARITY_BYTES)
            if on_cuda
            else StorageTimeline(granularity_bytes=1, workspace=cpu_convolution_workspace)
        )
        timeline.track(_model_tensors(model))
        timeline.track(_optimizer_tensors(opt, skip_scalars=on_cuda))
        timeline.track(batch)
        counter = _FlopTally()

        def function_modes() -> list[TorchFunctionMode]:
            return [_FusedAttentionAsOnCuda()] if on_cuda else []

        probe = _RecomputeProbe(timeline, counter, function_modes)
        token = recompute_listener.set(probe)
        try:
            with timeline, counter, _unpacked_batches_for_transformers(), contextlib.ExitStack() as modes:
                for mode in function_modes():
                    modes.enter_context(mode)
                timeline.phase = Phase.FORWARD
                shapes = ", ".join(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}" for t in batch)
                with (
                    _stage(f"the example inputs [{shapes}] do not fit the model (forward failed)"),
                    autocast_context(prec, "cpu"),
                ):
                    value = forward_and_loss(model, batch, loss)
                flops_forward = counter.get_total_flops()
                timeline.phase = Phase.BACKWARD
                with _stage("backward failed"):
                    value.backward()
                del value
                flops_backward_all = counter.get_total_flops() - flops_forward
                timeline.phase = Phase.OPTIMIZER
                with _stage("the optimizer step failed"), _OptimizerScalars():
                    opt.step()
                timeline.close()
        finally:
            recompute_listener.reset(token)

        categories: dict[int, Category] = {}

        def mark(tensors: Any, cat: Category) -> None:
            for t in tensors:
                key = timeline.key_of(t)
                if key is not None:
                    categories[key] = cat

        params = list(model.parameters())
        mark((p.grad for p in params if p.grad is not None), Category.GRADIENTS)
        mark(_optimizer_tensors(opt, skip_scalars=on_cuda), Category.OPTIMIZER)
        mark(_model_tensors(model), Category.PARAMETERS)
        result = replay(timeline, categories)

        def bytes_of(cat: Category) -> int:
            return sum(timeline.storages[k].nbytes for k, c in categories.items() if c is cat)

        state = {cat: bytes_of(cat) for cat in (Category.PARAMETERS, Category.GRADIENTS, Category.OPTIMIZER)}
        n_params = sum(p.numel() for p in params)
        n_trainable = sum(p.numel() for p in params if p.requires_grad)

        at_peak = dict(result.at_peak)
        peak = result.peak_bytes
        activation_peak = result.activation_peak_bytes
        if prepared.quantized_numels:
            saved = 0
            largest = 0
            for numel in prepared.quantized_numels:
                full = numel * prepared.quantized_element_bytes
                saved += full - math.ceil(numel * QLORA_BITS_PER_PARAM / 8)
                largest = max(largest, full)
            at_peak[Category.PARAMETERS] -= saved
            state[Category.PARAMETERS] -= saved
            at_peak[Category.TEMPORARIES] += largest
            activation_peak += largest
            peak += largest - saved
            notes.append(
                f"qlora: frozen linear weights counted at {QLORA_BITS_PER_PARAM} bits/param "
                "(NF4 + double quantization), "
                "plus one dequantized weight as a temporary at the peak"
            )
        if prepared.lora_backend:
            notes.append(f"lora via {prepared.lora_backend}")
        if prepared.checkpointing != "none":
            notes.append(f"activation checkpointing {prepared.checkpointing}")

    return TraceResult(
        params=n_params,
        trainable_params=n_trainable,
        flops_forward=float(flops_forward),
        flops_backward=float(flops_backward_all - probe.flops),
        flops_recompute=float(probe.flops),
        peak_bytes=int(peak),
        at_peak=_breakdown(at_peak),
        peak_phase=result.peak_phase.value,
        state_bytes=MemoryBreakdown(
            parameters=state[Category.PARAMETERS],
            gradients=state[Category.GRADIENTS],
            optimizer=state[Category.OPTIMIZER],
            activations=0,
            temporaries=0,
        ),
        activation_peak_bytes=int(activation_peak),
        notes=tuple(notes),
        optimizer_temporary_bytes=int(result.optimizer_temporary_bytes),
    )


def _breakdown(values: Mapping[Category, int]) -> MemoryBreakdown:
    return MemoryBreakdown(
        parameters=int(values[Category.PARAMETERS]),
        gradients=int(values[Category.GRADIENTS]),
        optimizer=int(values[Category.OPTIMIZER]),
        activations=int(values[Category.ACTIVATIONS]),
        temporaries=int(values[Category.TEMPORARIES]),
    )
