"""Optimizers: the real one for a job's setting, its state as in a steady-state step, and stand-ins.

A new optimizer is a member of ``trainplan.spec.Optimizer`` plus a branch in
:func:`make_optimizer` (and in :func:`default_foreach` if PyTorch has a
multi-tensor implementation of it).  Write a ``torch.optim.Optimizer`` here
only when PyTorch has none; what it allocates is what the trace counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim import Optimizer as TorchOptimizer
from torch.utils._python_dispatch import TorchDispatchMode

from trainplan.spec import Optimizer

__all__ = [
    "ADAM8BIT_NOTE",
    "Adam8bitStandIn",
    "Lion",
    "MuonWithAdamW",
    "OptimizerScalars",
    "default_foreach",
    "make_optimizer",
    "muon_split",
    "optimizer_tensors",
    "prime_optimizer_state",
]

ADAM8BIT_NOTE = "adam8bit: bitsandbytes state layout allocated by a stand-in (uint8 states + block absmax)"


class Lion(TorchOptimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Alg. 2).

    One state tensor (the momentum) per parameter.
    """

    def __init__(
        self, params: Any, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg = state["exp_avg"]
                if group["weight_decay"]:
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                update = exp_avg.mul(beta1).add_(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-group["lr"])
                exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


class Adam8bitStandIn(TorchOptimizer):
    """Memory stand-in for bitsandbytes' ``Adam8bit`` (bitsandbytes is not a dependency).

    It allocates the state bitsandbytes allocates — two uint8 tensors per
    parameter plus one fp32 absmax per 256-element block for each, and two fp32
    tensors for parameters under 4,096 elements (``min_8bit_size``) — and its
    ``step`` changes nothing (bitsandbytes' fused kernel needs no
    parameter-sized temporaries).  Source: bitsandbytes ``optim/optimizer.py``
    (``Optimizer8bit.init_state``, ``min_8bit_size=4096``, block size 256).
    Not an optimizer to train with.
    """

    BLOCK = 256
    MIN_8BIT_SIZE = 4096

    def __init__(self, params: Any, lr: float = 1e-4) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    if p.numel() >= self.MIN_8BIT_SIZE:
                        blocks = -(-p.numel() // self.BLOCK)
                        state["state1"] = torch.zeros_like(p, dtype=torch.uint8)
                        state["state2"] = torch.zeros_like(p, dtype=torch.uint8)
                        state["absmax1"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                        state["absmax2"] = torch.zeros(blocks, dtype=torch.float32, device=p.device)
                    else:
                        state["state1"] = torch.zeros_like(p, dtype=torch.float32)
                        state["state2"] = torch.zeros_like(p, dtype=torch.float32)
                    state["step"] = 0
                state["step"] += 1
        return loss


class MuonWithAdamW(TorchOptimizer):
    """``torch.optim.Muon`` on the hidden 2-D matrices and ``torch.optim.AdamW`` on the other parameters, as one
    optimizer: one ``step``, one state dict, one list of param groups for LR schedulers.

    torch.optim.Muon's documentation trains with the two side by side ("Muon only supports 2D params; use a standard
    optimizer such as AdamW for biases, embeddings, and other non-2D parameters").  Both are PyTorch's own and do the
    arithmetic; this class only builds them over the same param-group dicts (so a scheduler's ``lr`` reaches them)
    and one state mapping (so ``state_dict`` / ``load_state_dict`` round-trip both).

    One learning rate and weight decay serve both: Muon's update is scaled to AdamW's RMS (``adjust_lr_fn=
    "match_rms_adamw"``, Liu et al. 2025, which "can directly reuse the learning rate and weight decay tuned for
    AdamW" — torch.optim.Muon's documentation), at torch.optim.AdamW's default weight decay 0.01.
    """

    def __init__(self, muon_params: Any, adamw_params: Any, *, lr: float = 1e-3, weight_decay: float = 1e-2,
                 foreach: bool | None = None) -> None:  # fmt: skip
        groups: list[dict[str, Any]] = []
        if muon_params := list(muon_params):
            groups.append({"params": muon_params, "muon": True})
        if adamw_params := list(adamw_params):
            groups.append({"params": adamw_params, "muon": False})
        super().__init__(groups, {"lr": lr, "weight_decay": weight_decay, "muon": False})
        self._foreach = foreach
        self._bind()

    def _bind(self) -> None:
        muon = [g for g in self.param_groups if g["muon"]]
        adamw = [g for g in self.param_groups if not g["muon"]]
        self._parts: list[TorchOptimizer] = []
        if muon:
            self._parts.append(torch.optim.Muon(muon, adjust_lr_fn="match_rms_adamw"))
        if adamw:
            self._parts.append(torch.optim.AdamW(adamw, foreach=self._foreach))
        for part in self._parts:
            part.state = self.state  # parameters are disjoint: one mapping holds both optimizers' state

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self._parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._bind()  # load_state_dict made new group dicts: build the two over them again


def muon_split(model: torch.nn.Module, params: list[torch.nn.Parameter]) -> tuple[list[Any], list[Any]]:
    """``params`` split into (Muon's, AdamW's): Muon takes the 2-D parameters except embedding tables and the output
    head (``get_output_embeddings()`` where the model has one) — torch.optim.Muon's documentation and Liu et al.
    2025 ("Muon is Scalable for LLM Training") keep embeddings and the head on AdamW."""
    skip = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if head is not None and getattr(head, "weight", None) is not None:
        skip.add(id(head.weight))
    muon = [p for p in params if p.ndim == 2 and id(p) not in skip]
    chosen = {id(p) for p in muon}
    return muon, [p for p in params if id(p) not in chosen]


def muon_missing() -> str | None:
    """Why this environment cannot build Muon (``torch.optim.Muon`` arrived in PyTorch 2.9), or None."""
    if hasattr(torch.optim, "Muon"):
        return None
    return f"muon needs torch.optim.Muon (PyTorch >= 2.9); this environment has torch {torch.__version__}"


def make_optimizer(params: Any, name: Optimizer, *, foreach: bool | None = None, lr: float = 1e-4,
                   model: torch.nn.Module | None = None) -> TorchOptimizer:  # fmt: skip
    """The real optimizer for ``name`` over ``params`` (trainable parameters).

    ``foreach``: PyTorch's multi-tensor implementation (the default on CUDA);
    ``None`` keeps PyTorch's own default for the device.  ``model``: the module the parameters belong to, which
    Muon needs to tell hidden matrices from embeddings and the head (:func:`muon_split`).
    """
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    if name is Optimizer.MUON:
        if (missing := muon_missing()) is not None:
            raise ValueError(missing)
        if model is None:
            raise ValueError("muon needs the model to split its parameters")
        hidden, rest = muon_split(model, params)
        return MuonWithAdamW(hidden, rest, lr=lr, foreach=foreach)
    if name is Optimizer.ADAMW:
        return torch.optim.AdamW(params, lr=lr, foreach=foreach)
    if name is Optimizer.SGD:
        return torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=foreach)
    if name is Optimizer.ADAFACTOR:
        return torch.optim.Adafactor(params, lr=lr, foreach=foreach)
    if name is Optimizer.LION:
        return Lion(params, lr=lr)
    if name is Optimizer.ADAM8BIT:
        return Adam8bitStandIn(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}")


def default_foreach(name: Optimizer, *, on_cuda: bool) -> bool | None:
    """PyTorch's default for ``name``: multi-tensor (foreach) kernels on CUDA, a loop over parameters on CPU.

    ``None`` for optimizers without a ``foreach`` switch.
    """
    # Muon's AdamW part takes the switch; torch.optim.Muon itself has only its per-tensor loop
    return on_cuda if name in (Optimizer.ADAMW, Optimizer.SGD, Optimizer.ADAFACTOR, Optimizer.MUON) else None


def prime_optimizer_state(optimizer: TorchOptimizer) -> None:
    """Create the optimizer's state as the first real step would, without a forward/backward.

    Every parameter gets a zero gradient, the optimizer steps once, and the
    gradients are set back to ``None`` — so the traced step is a steady-state
    step (state already allocated), as every step after the first is.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def optimizer_tensors(optimizer: TorchOptimizer, *, skip_scalars: bool) -> Iterator[torch.Tensor]:
    """The tensors in ``optimizer.state``; ``skip_scalars`` leaves out 0-dim ones (host ``step`` counts on CUDA)."""
    for state in optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and not (skip_scalars and v.dim() == 0):
                yield v


class OptimizerScalars(TorchDispatchMode):
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
