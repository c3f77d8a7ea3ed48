"""LoRA adapters (peft or built in) and QLoRA's 4-bit storage of the frozen weights.

All base weights are frozen and stored in the compute dtype
(:func:`~trainplan.estimate.trace.precision.frozen_base_dtype`); adapters
(``lora_A``, ``lora_B``, rank r, scale alpha/r) go on the linear layers whose
name is or ends with a target, ``all-linear`` = every linear layer but the
output head (peft's convention; Hugging Face ``Conv1D`` counts as linear).
QLoRA is bookkeeping on top of the traced step: see :func:`qlora_bytes`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from trainplan.estimate.trace.precision import cast_floating, frozen_base_dtype, master_dtype
from trainplan.spec import Precision

__all__ = [
    "QLORA_BITS_PER_PARAM",
    "QLORA_NOTE",
    "LoraLike",
    "LoraLinear",
    "LoraModel",
    "apply_lora",
    "lora_target_names",
    "peft_available",
    "qlora_bytes",
]

# QLoRA stores frozen linear weights as 4-bit NF4 with double quantization:
# 4 bits + 0.127 bits of quantization constants per parameter (Dettmers et al.
# 2023, "QLoRA", Sec. 3 "Double Quantization").
QLORA_BITS_PER_PARAM = 4.127

QLORA_NOTE = (
    f"qlora: frozen linear weights counted at {QLORA_BITS_PER_PARAM} bits/param "
    "(NF4 + double quantization), "
    "plus one dequantized weight as a temporary at the peak"
)


class LoraLike(Protocol):
    """LoRA settings: rank, alpha (``None`` = rank) and target module names."""

    @property
    def rank(self) -> int: ...

    @property
    def alpha(self) -> float | None: ...

    @property
    def targets(self) -> tuple[str, ...]: ...


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


@dataclass(frozen=True)
class LoraModel:
    """A model with LoRA applied, and what QLoRA would store in 4 bit."""

    model: nn.Module
    backend: str  # "peft" or "builtin"
    quantized_numels: tuple[int, ...]  # sizes of the frozen linear weights QLoRA stores in 4 bit
    quantized_element_bytes: int  # bytes per element those weights have in the traced model (0 without QLoRA)


def apply_lora(
    model: nn.Module, lora: LoraLike, *, precision: Precision, qlora: bool = False, lora_backend: str = "auto"
) -> LoraModel:
    """Freeze ``model``, store its base in the compute dtype and add adapters on the targets.

    ``lora_backend``: ``"peft"``, ``"builtin"`` or ``"auto"`` (peft when importable).
    """
    # Frozen base in the compute dtype; adapters are fp32 masters (bf16 under bf16-pure).
    base_dtype = frozen_base_dtype(precision, qlora=qlora)
    adapter_dtype = master_dtype(precision)
    for p in model.parameters():
        p.requires_grad_(False)
    cast_floating(model, base_dtype)
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
    if getattr(lora, "dropout", 0.0):
        # a CPU trace would keep the CPU dropout's noise tensors, not CUDA's bool masks (tests/estimate/test_lora_saves.py)
        raise ValueError("lora.dropout is counted by the formulas (memory.LoraSaves); a trace does not model it — "
                         "trace with dropout 0")  # fmt: skip
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
    return LoraModel(model, backend, quantized, element_bytes if quantized else 0)


def qlora_bytes(quantized_numels: Sequence[int], element_bytes: int) -> tuple[int, int]:
    """``(saved, dequantized)``: bytes QLoRA saves by storing these weights at
    :data:`QLORA_BITS_PER_PARAM` instead of ``element_bytes`` each, and bytes of
    the largest weight dequantized back to ``element_bytes`` (a temporary at the peak)."""
    saved = 0
    largest = 0
    for numel in quantized_numels:
        full = numel * element_bytes
        saved += full - math.ceil(numel * QLORA_BITS_PER_PARAM / 8)
        largest = max(largest, full)
    return saved, largest


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


def peft_available() -> bool:
    try:
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


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
