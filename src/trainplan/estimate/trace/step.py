"""Trace one steady-state training step of a model on the fake device: :func:`trace_training_step`.

The model is built on the meta device, configured (precision, activation
checkpointing, LoRA), given fake CPU tensors under PyTorch's
``FakeTensorMode`` (shapes, dtypes and devices but no data, so a
70B-parameter model costs no memory), and one *real* training step of the real
module runs: forward, loss, ``backward()`` and ``optimizer.step()`` of the real
``torch.optim`` optimizer.  While it runs a
:class:`~trainplan.estimate.trace.memory.StorageTimeline` follows every storage
allocated and freed, and a :class:`~trainplan.estimate.trace.flops.FlopTally`
counts FLOPs; recomputation by activation checkpointing is told apart through
the checkpoint ``context_fn`` (:mod:`trainplan.estimate.trace.checkpointing`).

The step is a steady-state step: the optimizer state exists before it starts
(as in every step after the first), gradients do not
(``zero_grad(set_to_none=True)``), and the model output is dropped once the
loss is computed.  Each stage below is one function; a failure in a stage is a
:class:`~trainplan.estimate.trace.errors.TraceError` naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.optim import Optimizer as TorchOptimizer

from trainplan.estimate.trace.errors import TraceError, enum_setting, stage
from trainplan.estimate.trace.fake import materialize_fake
from trainplan.estimate.trace.inputs import BatchLike, describe_batch, example_batch
from trainplan.estimate.trace.lora import LoraLike
from trainplan.estimate.trace.loss import LOSS_NAMES, LossLike, forward_and_loss
from trainplan.estimate.trace.memory import Phase
from trainplan.estimate.trace.optimizers import (
    OptimizerScalars,
    default_foreach,
    make_optimizer,
    prime_optimizer_state,
)
from trainplan.estimate.trace.precision import autocast_context, input_float_dtype
from trainplan.estimate.trace.prepare import PreparedModel, prepare_model
from trainplan.estimate.trace.results import TraceResult
from trainplan.estimate.trace.summary import summarise
from trainplan.estimate.trace.target import target_kind
from trainplan.estimate.trace.watch import StepWatch, watching
from trainplan.spec import Checkpointing, Optimizer, Precision

__all__ = ["trace_training_step"]


def trace_training_step(
    build_model: Callable[[], nn.Module],
    make_batch: BatchLike,
    *,
    micro_batch: int,
    precision: str | Precision = "bf16",
    optimizer: str | Optimizer = "adamw",
    activation_checkpointing: str | Checkpointing = "none",
    checkpoint_fraction: float = 1.0,
    loss: LossLike = "mean",
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
    settings = _settings(precision, optimizer, activation_checkpointing, device, micro_batch, loss)
    # Build and configure on the meta device: no memory, no init compute, and Module.to works there.
    with torch.device("meta"):
        model = _build(build_model)
        prepared = _prepare(model, settings, lora=lora, qlora=qlora, lora_backend=lora_backend,
                            checkpoint_fraction=checkpoint_fraction)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = _materialize(prepared)
        batch = _batch(make_batch, micro_batch, settings)
        opt = _optimizer(model, settings)
        with watching(model, opt, batch, on_cuda=settings.on_cuda) as watch:
            value = _forward(model, batch, loss, settings, watch)
            _backward(value, watch)
            del value  # a training loop drops the loss after backward, before the optimizer step
            _optimizer_step(opt, watch)
        return summarise(model, opt, prepared, watch, on_cuda=settings.on_cuda, optimizer=settings.optimizer)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class _Settings:
    """The job's settings, validated."""

    precision: Precision
    optimizer: Optimizer
    checkpointing: Checkpointing
    on_cuda: bool  # the job runs on CUDA (the trace still runs on the fake CPU device)


def _settings(
    precision: Any, optimizer: Any, checkpointing: Any, device: str, micro_batch: int, loss: LossLike
) -> _Settings:
    """Check every setting before anything is built; :class:`TraceError` names the first bad one."""
    prec: Precision = enum_setting(Precision, precision, "precision")
    if prec is Precision.FP8:  # planned by the formulas (transformer jobs); a traced step runs in 16 or 32 bits
        raise TraceError("precision must be one of fp32, fp16, bf16, bf16-pure for a trace (fp8 is planned for "
                         "kind: transformer jobs by the formulas), got 'fp8'")  # fmt: skip
    opt_name: Optimizer = enum_setting(Optimizer, optimizer, "optimizer")
    ckpt: Checkpointing = enum_setting(Checkpointing, checkpointing, "activation_checkpointing")
    target = target_kind(device)
    if micro_batch < 1:
        raise TraceError(f"micro_batch must be >= 1, got {micro_batch}")
    if isinstance(loss, str) and loss not in LOSS_NAMES:
        raise TraceError(f"loss must be {', '.join(LOSS_NAMES)} or a callable, got {loss!r}")
    return _Settings(prec, opt_name, ckpt, target == "cuda")


# --------------------------------------------------------------------------- the model, the batch, the optimizer


def _build(build_model: Callable[[], nn.Module]) -> nn.Module:
    """Call the user's factory (on the meta device) and check that it made a module."""
    name = getattr(build_model, "__qualname__", None) or type(build_model).__name__
    with stage(f"the model factory {name} failed"):
        model = build_model()
    if not isinstance(model, nn.Module):
        raise TraceError(f"the model factory {name} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _prepare(
    model: nn.Module, settings: _Settings, *, lora: LoraLike | None, qlora: bool, lora_backend: str,
    checkpoint_fraction: float = 1.0,
) -> PreparedModel:
    """Precision casts, activation checkpointing and LoRA, as the job asks (on the meta device)."""
    with stage("cannot configure the model"):
        return prepare_model(
            model,
            precision=settings.precision,
            checkpointing=settings.checkpointing,
            checkpoint_fraction=checkpoint_fraction,
            lora=lora,
            qlora=qlora,
            lora_backend=lora_backend,
        )


def _materialize(prepared: PreparedModel) -> nn.Module:
    """Give every tensor of the configured model a fake CPU twin (shared tensors stay shared)."""
    with stage("cannot move the model to the fake device"):
        materialize_fake(prepared.model)
    return prepared.model


def _batch(make_batch: BatchLike, micro_batch: int, settings: _Settings) -> tuple[torch.Tensor, ...]:
    """The example batch of ``micro_batch`` samples (floating inputs in bf16 under bf16-pure)."""
    with stage("cannot make the example batch"):
        return example_batch(make_batch, micro_batch, float_dtype=input_float_dtype(settings.precision))


def _optimizer(model: nn.Module, settings: _Settings) -> TorchOptimizer:
    """The real optimizer over the trainable parameters, its state already created as by a first step."""
    foreach = default_foreach(settings.optimizer, on_cuda=settings.on_cuda)
    with stage("cannot create the optimizer"):
        opt = make_optimizer(model.parameters(), settings.optimizer, foreach=foreach, model=model)
        with OptimizerScalars():
            prime_optimizer_state(opt)
    return opt


# --------------------------------------------------------------------------- the watched step


def _forward(
    model: nn.Module, batch: tuple[torch.Tensor, ...], loss: LossLike, settings: _Settings, watch: StepWatch
) -> torch.Tensor:
    """The forward pass and the loss (under autocast for mixed precision); only the loss is kept."""
    with (
        watch.phase(Phase.FORWARD),
        stage(f"the example inputs [{describe_batch(batch)}] do not fit the model (forward failed)"),
        autocast_context(settings.precision, "cpu"),
    ):
        return forward_and_loss(model, batch, loss)


def _backward(value: torch.Tensor, watch: StepWatch) -> None:
    """``loss.backward()``, recomputation by activation checkpointing included."""
    with watch.phase(Phase.BACKWARD), stage("backward failed"):
        value.backward()


def _optimizer_step(opt: TorchOptimizer, watch: StepWatch) -> None:
    """``optimizer.step()`` (host scalars the optimizer reads are answered, see ``OptimizerScalars``)."""
    with watch.phase(Phase.OPTIMIZER), stage("the optimizer step failed"), OptimizerScalars():
        opt.step()
