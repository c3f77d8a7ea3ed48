"""Checks of a job that the parent process makes before launching — without importing torch.

Each raises :class:`~trainplan.errors.SpecError` naming the field at fault.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any, Callable

from trainplan.errors import SpecError
from trainplan.catalog import resolve_model
from trainplan.model import ModelArch, UnsupportedArchitecture, hf_model_type
from trainplan.spec import Method, Optimizer, Precision, TransformerJob

#: Optimizers the built-in workloads can build from torch alone.
RUNNABLE_OPTIMIZERS = (Optimizer.ADAMW, Optimizer.SGD, Optimizer.ADAFACTOR)
BUILTIN_LOSSES = ("mean", "sum", "mse", "cross_entropy")


def check_optimizer(kind: Optimizer) -> None:
    if kind not in RUNNABLE_OPTIMIZERS:
        allowed = ", ".join(o.value for o in RUNNABLE_OPTIMIZERS)
        raise SpecError(f"trainplan run supports {allowed}; got {kind.value!r}", field="optimizer")


def resolve_arch(job: TransformerJob) -> ModelArch:
    """The job's architecture: inline, or a preset from the catalog."""
    if isinstance(job.model, ModelArch):
        return job.model
    return resolve_model(job.model)


def check_supported(job: TransformerJob, arch: ModelArch) -> None:
    """Reject what the built-in workload cannot build, naming the field."""
    if arch.arch != "decoder":
        raise SpecError(f"trainplan run builds decoder models only, got {arch.arch!r}", field="model.arch")
    if arch.position not in ("rope", "learned"):
        raise SpecError(
            f"trainplan run supports rope (Llama-style) or learned (GPT-2-style) positions, got {arch.position!r}",
            field="model.position",
        )
    try:
        hf_model_type(arch)
    except UnsupportedArchitecture as exc:
        raise SpecError(str(exc), field="model") from None
    if job.method is Method.QLORA:
        from trainplan.catalog import checkpoint_dir

        if checkpoint_dir(job.model) is None:
            raise SpecError("qlora quantises a pretrained checkpoint's weights to 4 bit: give model: ./checkpoint "
                            "(a save_pretrained folder), or method: lora for the job's random-weight model", field="method")  # fmt: skip
    if job.precision is Precision.FP8:
        raise SpecError("trainplan run trains in bf16, fp16 or fp32; fp8 is planned, not run here — launch it with "
                        "torchtitan (--float8) or Transformer Engine, or run with precision: bf16", field="precision")  # fmt: skip


#: Strategies a QLoRA run trains with: its 4-bit base is frozen and whole on every process (bitsandbytes'
#: Params4bit), so data parallel replicates it.  FSDP would need the 4-bit storage in a float type
#: (bnb_4bit_quant_storage) and DeepSpeed casts the module it wraps — neither is run here.
QLORA_STRATEGIES = ("single", "ddp")


def check_qlora_strategy(job: Any, strategy: Any) -> None:
    """A QLoRA job trains single or DDP (QLORA_STRATEGIES)."""
    if getattr(job, "method", None) is Method.QLORA and strategy.value not in QLORA_STRATEGIES:
        raise SpecError(f"qlora runs single or ddp (its 4-bit base is replicated); got {strategy.value} — "
                        "use --strategy ddp, or method: lora", field="--strategy")  # fmt: skip


def check_qlora_installed(job: Any) -> None:
    """A QLoRA job that runs on this machine needs bitsandbytes here."""
    if getattr(job, "method", None) is Method.QLORA and importlib.util.find_spec("bitsandbytes") is None:
        raise SpecError("qlora needs bitsandbytes: pip install 'trainplan[qlora]'", field="method")


def import_callable(path: str, *, field: str) -> Callable[..., Any]:
    """Import ``"pkg.mod:name"``; the current directory is importable, as with ``python -m``."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"cannot import module {module_name!r} ({exc})", field=field) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SpecError(f"{module_name!r} has no callable {attr!r}", field=field)
    return fn


def is_import_path(value: str | None) -> bool:
    """``"pkg.mod:name"`` (and not ``"sklearn:<set>"`` nor a Windows drive)."""
    if not value or ":" not in value or value.startswith("sklearn:"):
        return False
    module, _, attr = value.partition(":")
    return bool(module) and bool(attr) and len(module) > 1 and "/" not in module and "\\" not in module


def check_loss(loss: str) -> None:
    if loss not in BUILTIN_LOSSES and not is_import_path(loss):
        raise SpecError(f"must be one of {', '.join(BUILTIN_LOSSES)} or an import path 'pkg.mod:fn', got {loss!r}", field="loss")


