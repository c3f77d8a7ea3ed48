"""Configure a model for one training step the way a job asks.

These helpers turn job settings (precision, optimizer, activation
checkpointing, LoRA, loss) into a configured module, optimizer, batch and loss
value.  They are plain PyTorch and work the same on real tensors and under
``FakeTensorMode``: the tracer (:mod:`trainplan.estimate.trace`) calls them on
fake tensors, and the validation (tests, ``benchmarks/gpu_validate.py``) calls
them on real ones, so the step that is measured is the step that is traced.

Conventions (documented in ``docs/trace.md``):

* Mixed precision (``fp16``/``bf16``) keeps fp32 parameters and runs the step
  under ``torch.autocast``; ``bf16-pure`` stores the parameters (and so the
  gradients and optimizer state) in bf16 and runs without autocast.
* With LoRA, the frozen base weights are stored in the compute dtype (bf16 or
  fp16 under mixed precision; fp32 under fp32) since they need no fp32 master
  copy; adapters are fp32 master weights (bf16 under ``bf16-pure``).
* ``full`` checkpointing recomputes every block; ``selective`` checkpoints the
  same blocks but saves the outputs of matmuls, convolutions and attention
  (PyTorch's selective activation checkpointing, as torchtitan's "op" mode)
  and recomputes only the cheap ops between them (norms, activations,
  element-wise).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer as TorchOptimizer
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from trainplan.spec import Checkpointing, Optimizer, Precision

__all__ = [
    "Adam8bitStandIn",
    "InputLike",
    "Lion",
    "LoraLike",
    "LoraLinear",
    "PreparedModel",
    "apply_activation_checkpointing",
    "autocast_context",
    "find_checkpoint_blocks",
    "forward_and_loss",
    "make_inputs",
    "make_optimizer",
    "prepare_model",
    "prime_optimizer_state",
    "recompute_listener",
]

_DTYPES: dict[str, torch.dtype] = {
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

# QLoRA stores frozen linear weights as 4-bit NF4 with double quantization:
# 4 bits + 0.127 bits of quantization constants per parameter (Dettmers et al.
# 2023, "QLoRA", Sec. 3 "Double Quantization").
QLORA_BITS_PER_PARAM = 4.127


class InputLike(Protocol):
    """One model input: per-sample shape (no batch dim) and dtype name."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> str: ...


class LoraLike(Protocol):
    """LoRA settings: rank, alpha (``None`` = rank) and target module names."""

    @property
    def rank(self) -> int: ...

    @property
    def alpha(self) -> float | None: ...

    @property
    def targets(self) -> tuple[str, ...]: ...


# --------------------------------------------------------------------------- inputs


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
        dtype = _DTYPES.get(name)
        if dtype is None:
            raise ValueError(f"unknown input dtype {name!r}; allowed: {', '.join(_DTYPES)}")
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


# --------------------------------------------------------------------------- precision


def autocast_context(precision: Precision, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """``torch.autocast`` for mixed precision, a no-op for fp32 and bf16-pure."""
    if precision is Precision.BF16:
        return torch.autocast(device_type, dtype=torch.bfloat16)
    if precision is Precision.FP16:
        return torch.autocast(device_type, dtype=torch.float16)
    return contextlib.nullcontext()


def _half_dtype(precision: Precision) -> torch.dtype:
    return torch.float16 if precision is Precision.FP16 else torch.bfloat16


def _cast_floating(module: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating parameters and buffers to ``dtype`` (integer buffers stay).

    Parameters are replaced by new ``Parameter`` objects (shared ones stay
    shared) rather than through ``Module.to``, which on fake tensors swaps
    tensor objects and fails when the fake mode holds a weak reference to one.
    """
    if not any(t.is_floating_point() and t.dtype != dtype for t in _tensors_of(module)):
        return
    # id -> (old, new); holding the old tensor keeps its id from being reused.
    params: dict[int, tuple[torch.Tensor, nn.Parameter]] = {}
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    with torch.no_grad():
        for m in module.modules():
            for name, p in list(m._parameters.items()):
                if p is None or not p.is_floating_point() or p.dtype == dtype:
                    continue
                if id(p) not in params:
                    params[id(p)] = (p, nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad))
                m._parameters[name] = params[id(p)][1]
            for name, b in list(m._buffers.items()):
                if b is None or not b.is_floating_point() or b.dtype == dtype:
                    continue
                if id(b) not in buffers:
                    buffers[id(b)] = (b, b.to(dtype))
                m._buffers[name] = buffers[id(b)][1]


def _tensors_of(module: nn.Module) -> Iterator[torch.Tensor]:
    yield from module.parameters()
    yield from module.buffers()


# --------------------------------------------------------------------------- LoRA


class LoraLinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (Hu et al. 2021, "LoRA", Eq. 3).

    ``y = base(x) + (x A^T B^T) * alpha / rank``; ``B`` starts at zero.  Works
    for ``nn.Linear`` and Hugging Face's ``Conv1D`` (weight stored transposed).
    """

    def __init__(self, base: nn.Module, rank: int, alpha: float, *, dtype: torch.dtype) -> None:
        super().__init__()
        in_f, out_f = _linear_dims(base)
        self.base = base
        device = _weight_of(base).device
        self.lora_A = nn.Linear(in_f, rank, bias=False, device=device, dtype=dtype)
        self.lora_B = nn.Linear(rank, out_f, bias=False, device=device, dtype=dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


def _weight_of(module: nn.Module) -> torch.Tensor:
    w = getattr(module, "weight", None)
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"{type(module).__name__} has no weight")
    return w


def _is_conv1d_hf(module: nn.Module) -> bool:
    # transformers.pytorch_utils.Conv1D (GPT-2): a linear layer with weight (in, out).
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf")


def _is_linear(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or _is_conv1d_hf(module)


def _linear_dims(module: nn.Module) -> tuple[int, int]:
    w = _weight_of(module)
    if _is_conv1d_hf(module):
        return int(w.shape[0]), int(w.shape[1])
    return int(w.shape[1]), int(w.shape[0])


def _output_head(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            head = get()
        except (AttributeError, NotImplementedError):
            head = None
        if isinstance(head, nn.Module):
            return head
    return None


def lora_target_names(model: nn.Module, targets: Sequence[str]) -> list[str]:
    """Full names of the linear modules LoRA wraps.

    A target matches a module whose name is the target or ends with
    ``.target``; ``all-linear`` matches every linear layer but the output head
    (the same convention as peft's ``all-linear``).
    """
    head = _output_head(model)
    names: list[str] = []
    for name, module in model.named_modules():
        if not name or not _is_linear(module):
            continue
        if "all-linear" in targets:
            if module is not head:
                names.append(name)
            continue
        if any(name == t or name.endswith("." + t) for t in targets):
            names.append(name)
    return names


def _apply_lora_builtin(
    model: nn.Module, names: Sequence[str], rank: int, alpha: float, dtype: torch.dtype
) -> nn.Module:
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoraLinear(getattr(parent, child), rank, alpha, dtype=dtype))
    return model


def _apply_lora_peft(model: nn.Module, names: Sequence[str], rank: int, alpha: float, keep_fp32: bool) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    # peft annotates lora_alpha as int but scales by alpha / r with any number.
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]
        target_modules=list(names),
        lora_dropout=0.0,
        bias="none",
    )
    return get_peft_model(model, config, autocast_adapter_dtype=keep_fp32)  # type: ignore[return-value]


def peft_available() -> bool:
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- activation checkpointing

# Listener told when recomputation starts (True) and stops (False); set by the tracer.
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
_SAVE_OPS: frozenset[Any] = frozenset(
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
    return CheckpointPolicy.MUST_SAVE if packet in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


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


def apply_activation_checkpointing(model: nn.Module, mode: Checkpointing) -> str:
    """Enable checkpointing on ``model`` in place; returns what was wrapped, in words.

    Hugging Face models use their own ``activation_checkpointing_enable`` /
    ``gradient_checkpointing_enable`` (non-reentrant), other models get their
    blocks (:func:`find_checkpoint_blocks`) wrapped in
    ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``.
    """
    if mode is Checkpointing.NONE:
        return "none"
    context_fn = _context_fn(mode)
    kwargs = {"use_reentrant": False, "context_fn": context_fn}
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


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class PreparedModel:
    """A model configured for training, with what the configuration did."""

    model: nn.Module
    quantized_numels: tuple[int, ...]  # sizes of the frozen linear weights QLoRA stores in 4 bit
    quantized_element_bytes: int  # bytes per element those weights have in the traced model
    checkpointing: str
    lora_backend: str | None


def prepare_model(
    model: nn.Module,
    *,
    precision: Precision,
    checkpointing: Checkpointing = Checkpointing.NONE,
    lora: LoraLike | None = None,
    qlora: bool = False,
    lora_backend: str = "auto",
) -> PreparedModel:
    """Cast, LoRA-wrap and checkpoint ``model`` for one training step (in train mode).

    ``lora_backend``: ``"peft"``, ``"builtin"`` or ``"auto"`` (peft when importable).
    """
    model.train()
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # no KV cache while training
    master = torch.bfloat16 if precision is Precision.BF16_PURE else torch.float32
    _cast_floating(model, master)
    ckpt = apply_activation_checkpointing(model, checkpointing)
    if lora is None:
        if qlora:
            raise ValueError("qlora needs lora settings")
        return PreparedModel(model, (), 0, ckpt, None)

    # Frozen base in the compute dtype; adapters are fp32 masters (bf16 under bf16-pure).
    base_dtype = torch.float32 if precision is Precision.FP32 and not qlora else _half_dtype(precision)
    adapter_dtype = torch.bfloat16 if precision is Precision.BF16_PURE else torch.float32
    for p in model.parameters():
        p.requires_grad_(False)
    _cast_floating(model, base_dtype)
    names = lora_target_names(model, tuple(lora.targets))
    if not names:
        raise ValueError(f"LoRA targets {', '.join(lora.targets)} match no linear layer of {type(model).__name__}")
    head = _output_head(model)
    quantized: tuple[int, ...] = ()
    if qlora:
        # bitsandbytes (through transformers) quantizes every linear layer except the output head.
        quantized = tuple(
            _weight_of(m).numel() for n, m in model.named_modules() if n and _is_linear(m) and m is not head
        )
    rank = int(lora.rank)
    alpha = float(lora.alpha if lora.alpha is not None else rank)
    backend = lora_backend
    if backend == "auto":
        backend = "peft" if peft_available() else "builtin"
    if backend == "peft":
        model = _apply_lora_peft(model, names, rank, alpha, keep_fp32=adapter_dtype == torch.float32)
    elif backend == "builtin":
        model = _apply_lora_builtin(model, names, rank, alpha, adapter_dtype)
    else:
        raise ValueError(f"unknown lora_backend {lora_backend!r}; allowed: auto, peft, builtin")
    element_bytes = torch.empty((), dtype=base_dtype).element_size()
    return PreparedModel(model, quantized, element_bytes if quantized else 0, ckpt, backend)


# --------------------------------------------------------------------------- optimizers


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


def make_optimizer(params: Any, name: Optimizer, *, foreach: bool | None = None, lr: float = 1e-4) -> TorchOptimizer:
    """The real optimizer for ``name`` over ``params`` (trainable parameters).

    ``foreach``: PyTorch's multi-tensor implementation (the default on CUDA);
    ``None`` keeps PyTorch's own default for the device.
    """
    params = [p for p in params if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
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


# --------------------------------------------------------------------------- loss


def _accepts_labels(model: nn.Module) -> bool:
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "labels" in params


def _main_output(out: Any) -> torch.Tensor:
    """The tensor a loss is computed from: the tensor, ``logits``, or the first tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, Mapping):
        if isinstance(out.get("logits"), torch.Tensor):
            return out["logits"]
        for v in out.values():
            if isinstance(v, torch.Tensor):
                return v
    if isinstance(out, (tuple, list)):
        for v in out:
            if isinstance(v, torch.Tensor):
                return v
    raise TypeError(f"the model returned {type(out).__name__}, which holds no tensor to compute a loss from")


def _cross_entropy(logits: torch.Tensor, batch: Sequence[torch.Tensor]) -> torch.Tensor:
    """Cross entropy against all-zero class targets.

    Class dim 1 (PyTorch's convention) except for language-model outputs
    ``(B, S, V)`` whose first two dims match an integer ``(B, S)`` input, where
    the class dim is last.
    """
    if logits.dim() < 2:
        raise ValueError(f"cross_entropy needs outputs with a class dimension, got shape {tuple(logits.shape)}")
    first = batch[0] if batch else None
    if (
        logits.dim() == 3
        and first is not None
        and not first.is_floating_point()
        and first.dim() == 2
        and tuple(first.shape) == tuple(logits.shape[:2])
    ):
        target = torch.zeros(logits.shape[0] * logits.shape[1], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target)
    target_shape = (logits.shape[0], *logits.shape[2:])
    target = torch.zeros(target_shape, dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, target)


def forward_and_loss(
    model: nn.Module, batch: Sequence[torch.Tensor], loss: str | Callable[[Any, Sequence[torch.Tensor]], torch.Tensor]
) -> torch.Tensor:
    """Run the forward pass and return the scalar loss; the model output is dropped.

    ``loss``: ``mean`` / ``sum`` of the output, ``mse`` against zeros,
    ``cross_entropy`` against class 0 (for models whose ``forward`` takes
    ``labels`` — Hugging Face — the first input is passed as ``labels`` and the
    model's own loss is used), or a callable ``loss(output, batch) -> scalar``.
    Only the loss is kept, as training loops do (Hugging Face Trainer and
    Lightning keep ``loss.detach()``), so the output's memory is freed before
    backward.
    """
    out = None
    if loss == "cross_entropy" and _accepts_labels(model):
        out = model(*batch, labels=batch[0])
        own = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
        if isinstance(own, torch.Tensor):
            del out
            return own
    if out is None:
        out = model(*batch)
    if callable(loss):
        value = loss(out, batch)
    else:
        y = _main_output(out)
        if loss == "mean":
            value = y.mean()
        elif loss == "sum":
            value = y.sum()
        elif loss == "mse":
            value = F.mse_loss(y, torch.zeros_like(y))
        elif loss == "cross_entropy":
            value = _cross_entropy(y, batch)
        else:
            raise ValueError(f"unknown loss {loss!r}; allowed: mean, sum, mse, cross_entropy, or a callable")
        del y
    del out
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise ValueError("the loss must be a scalar tensor")
    return value
