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
from trainplan.spec import Checkpointing, Method, Optimizer, Precision, TransformerJob

#: Optimizers the built-in workloads can build from torch alone (Muon: torch.optim.Muon beside AdamW).
RUNNABLE_OPTIMIZERS = (Optimizer.ADAMW, Optimizer.SGD, Optimizer.ADAFACTOR, Optimizer.MUON)
#: Where Muon runs: torch.optim.Muon steps whole matrices on every rank (estimate/compat.py says why not elsewhere).
MUON_STRATEGIES = ("single", "ddp")
BUILTIN_LOSSES = ("mean", "sum", "mse", "cross_entropy")


def check_optimizer(kind: Optimizer) -> None:
    if kind not in RUNNABLE_OPTIMIZERS:
        allowed = ", ".join(o.value for o in RUNNABLE_OPTIMIZERS)
        raise SpecError(f"trainplan run supports {allowed}; got {kind.value!r}", field="optimizer")
    if kind is Optimizer.MUON:
        check_muon_available()


def check_muon_available() -> None:
    """torch.optim.Muon arrived in PyTorch 2.9; trainplan's torch extra accepts older releases."""
    from trainplan.estimate.trace.optimizers import muon_missing

    if (missing := muon_missing()) is not None:
        raise SpecError(missing, field="optimizer")


def resolve_arch(job: TransformerJob) -> ModelArch:
    """The job's architecture: inline, or a preset from the catalog."""
    if isinstance(job.model, ModelArch):
        return job.model
    return resolve_model(job.model)


def check_random_init_split(checkpoint: object, flag: str | None) -> None:
    """Tensor, pipeline and expert parallel runs (``flag``: the option that asked for one) train the job's
    architecture from random weights so far: refuse a pretrained checkpoint in one line naming the option."""
    if checkpoint is not None and flag is not None:
        raise SpecError(f"{flag} trains the job's architecture from random weights so far; a pretrained checkpoint "
                        f"trains data parallel (fsdp, zero*)", field=flag)  # fmt: skip


def attention(job: TransformerJob, arch: ModelArch) -> str:
    """The Hugging Face ``attn_implementation`` the run builds its model with: the one the estimate prices."""
    from trainplan.estimate.transformer import hf_attention

    return hf_attention(job, arch)


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
    fused_package = attention(job, arch) == "flash_attention_2"
    if fused_package and arch.attention_sinks:
        # transformers passes the sinks (s_aux) only to kernels that take them (vllm's flash-attn 3, FA4): the
        # flash-attn 2 package would train gpt-oss without its sinks (modeling_flash_attention_utils, v5.25.0)
        raise SpecError("true asks for a fused kernel, and the flash-attn 2 package that trainplan run loads drops "
                        "gpt-oss's attention sinks: use flash_attention: auto (eager attention, as estimated)",
                        field="flash_attention")  # fmt: skip
    if fused_package and importlib.util.find_spec("flash_attn") is None:
        raise SpecError("true asks for a fused kernel, and transformers has no PyTorch SDPA path for this model's "
                        "attention sinks / soft-capping / ALiBi: install flash-attn (a CUDA GPU), or use "
                        "flash_attention: auto (eager attention, as estimated)", field="flash_attention")  # fmt: skip
    if job.precision is Precision.FP8:
        raise SpecError("trainplan run trains in bf16, fp16 or fp32; fp8 is planned, not run here — launch it with "
                        "torchtitan (--float8) or Transformer Engine, or run with precision: bf16", field="precision")  # fmt: skip
    if job.activation_checkpointing is Checkpointing.FULL:
        # the share of the decoder layers the workload wraps is the estimate's (a share that wraps none is refused)
        from trainplan.catalog import get_catalog
        from trainplan.estimate.stack import effective_knobs
        from trainplan.estimate.transformer import checkpointed_count

        checkpointed_count(arch, effective_knobs(job, get_catalog()))


#: Strategies a QLoRA run trains with: its 4-bit base is frozen and whole on every process (bitsandbytes'
#: Params4bit), so data parallel replicates it.  FSDP would need the 4-bit storage in a float type
#: (bnb_4bit_quant_storage) and DeepSpeed casts the module it wraps — neither is run here.
QLORA_STRATEGIES = ("single", "ddp")


def check_job_strategy(job: Any, strategy: Any, *, model_parallel: bool = False) -> None:
    """A QLoRA job trains single or DDP (QLORA_STRATEGIES); so does a Muon job (MUON_STRATEGIES), without tensor,
    pipeline or expert parallel."""
    if getattr(job, "method", None) is Method.QLORA and strategy.value not in QLORA_STRATEGIES:
        raise SpecError(f"qlora runs single or ddp (its 4-bit base is replicated); got {strategy.value} — "
                        "use --strategy ddp, or method: lora", field="--strategy")  # fmt: skip
    if getattr(job, "optimizer", None) is Optimizer.MUON and (strategy.value not in MUON_STRATEGIES or model_parallel):
        got = strategy.value + (" with tensor / pipeline / expert parallel" if model_parallel else "")
        raise SpecError(f"muon runs single or ddp (torch.optim.Muon steps whole matrices on every rank); got {got} — "
                        "use --strategy ddp, or optimizer: adamw", field="--strategy")  # fmt: skip


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




#: Knobs the built-in workloads apply as the estimate prices them (run/worker.py allow_tf32_matmul,
#: run/workloads/transformer.py for qlora_fp32_params and checkpoint_fraction — finish_model wraps that share of the
#: decoder layers); every other knob is the plain stack's, whatever the job says.
HONOURED_KNOBS = {"tf32_matmul": ("transformer", "torch"), "qlora_fp32_params": ("transformer",),
                  "checkpoint_fraction": ("transformer",)}


def as_trained(job: Any) -> tuple[Any, str | None]:
    """The job as the built-in workloads train it, and a note naming what of its stack and knobs they do not apply.

    ``trainplan run`` (and the torchrun / SLURM / SkyPilot renders of its worker) trains eager PyTorch — the
    ``plain`` stack of catalog/data/stacks.yaml.  A job that names another stack, or knobs the worker does not
    implement (compile, a chunked or fused loss, fused kernels, optimizer-in-backward …), is estimated for the
    stack and knobs as trained, so that the prediction the run is compared with describes the run; the note says
    what was set aside.  A job that already trains as planned comes back unchanged with no note."""
    kind = getattr(getattr(job, "kind", None), "value", None)
    if kind not in ("transformer", "torch"):
        return job, None
    from trainplan.catalog import get_catalog
    from trainplan.estimate.stack import KNOB_NAMES, effective_knobs
    from trainplan.spec import Stack

    catalog = get_catalog()
    stated = effective_knobs(job, catalog)
    kept = {k: getattr(stated, k) for k, kinds in HONOURED_KNOBS.items() if kind in kinds}
    trained_job = job.model_copy(update={"stack": Stack.PLAIN, "knobs": job.knobs.model_copy(update={
        **{k: None for k in type(job.knobs).model_fields}, **kept})})
    trained = effective_knobs(trained_job, catalog)
    # every knob the estimate reads (loss_chunk_tokens is folded into loss_chunks)
    differ = [k for k in KNOB_NAMES if k != "loss_chunk_tokens" and getattr(stated, k) != getattr(trained, k)]
    if job.stack is Stack.PLAIN and not differ:
        return job, None
    shown = ", ".join(f"{k} {_shown(getattr(stated, k))} → {_shown(getattr(trained, k))}" for k in differ)
    what = f"stack {job.stack.value}" if job.stack is not Stack.PLAIN else "the job's knobs"
    note = (f"trainplan run trains eager PyTorch (stack plain), not {what}"
            + (f": {shown}" if shown else "") + "; the prediction is for the run as it trains "
            "(run your own stack with --script, or launch --to torchtitan)")
    return trained_job, note


def as_built(job: Any, arch: ModelArch | None = None) -> tuple[Any, str | None]:
    """The job with the model the built-in workloads build, and a note when it differs from the job's (``arch``: the
    job's architecture when the caller has resolved it already — a checkpoint's config.json is not read again).

    transformers builds no DeepSeek-V3 multi-token-prediction module (``num_nextn_predict_layers``: its
    ``DeepseekV3Model`` stops at the decoder layers, and ``from_pretrained`` ignores those weights:
    ``_keys_to_ignore_on_load_unexpected``, transformers 5.25), so the prediction a run is compared with leaves them
    out; the plan and ``estimate`` keep them (Megatron and torchtitan recipes can train them)."""
    if getattr(getattr(job, "kind", None), "value", None) != "transformer":
        return job, None
    arch = arch or resolve_arch(job)
    if not arch.mtp_layers:
        return job, None
    note = (f"transformers builds none of the model's {arch.mtp_layers} multi-token-prediction module(s) "
            "(num_nextn_predict_layers): trainplan run trains and predicts the model without them")
    return job.model_copy(update={"model": arch.model_copy(update={"mtp_layers": 0})}), note


def _shown(value: Any) -> str:
    if isinstance(value, frozenset):  # knobs.recompute_modules
        return "[" + ", ".join(sorted(_shown(v) for v in value)) + "]"
    return str(getattr(value, "value", value)).lower()
