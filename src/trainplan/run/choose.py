"""Choose what to run on this machine: strategy, processes, threads.

With no ``--strategy``, the candidates this machine can run are priced by the
planner (:mod:`trainplan.run.predict`) and the fastest one whose predicted
peak fits a device is taken; without predictions the default is one process
(``single``) on one device, or DDP over every GPU.  A named strategy is
checked against what the machine and the installed packages allow.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Callable

from trainplan.errors import SpecError
from trainplan.measure.probe import Accelerator, Hardware
from trainplan.run.predict import Prediction, predict
from trainplan.run.workloads.checks import check_job_strategy
from trainplan.spec import JobKind, Precision
from trainplan.strategies import Engine, Strategy, strategies_for

#: Processes a multi-process strategy gets on a CPU when --devices is not given.
CPU_DEFAULT_PROCESSES = 2

Predictor = Callable[[Any, str, int, str], Prediction]


@dataclass(frozen=True)
class Option:
    """What a run will use."""

    strategy: Strategy  # SINGLE for tabular jobs
    devices: int  # GPUs, or processes on CPU; parallel fits for tabular jobs
    accelerator: Accelerator
    threads_per_process: int
    reason: str
    prediction: Prediction
    tp: int = 1  # tensor-parallel degree (run/runtime/model_parallel.py), fsdp over devices / tp ranks
    sequence_parallel: bool = False
    ep: int = 1  # expert-parallel degree (run/runtime/expert_parallel.py), every rank a data-parallel rank
    pp: int = 1  # pipeline stages (run/runtime/model_parallel.py), fsdp over devices / pp ranks of a stage
    vpp: int = 1  # chunks per pipeline rank (interleaved 1F1B)


def max_devices(hw: Hardware) -> int:
    """GPUs on CUDA, 1 on MPS, cores on CPU."""
    if hw.accelerator is Accelerator.CUDA:
        return len(hw.gpus)
    if hw.accelerator is Accelerator.MPS:
        return 1
    return hw.cpu_cores


def _unit(hw: Hardware) -> str:
    return {Accelerator.CUDA: "GPU", Accelerator.MPS: "MPS device", Accelerator.CPU: "core"}[hw.accelerator]


def deepspeed_installed() -> bool:
    return importlib.util.find_spec("deepspeed") is not None


def check_strategy(strategy: Strategy, devices: int, hw: Hardware, job: Any) -> None:
    """Raise :class:`SpecError` when ``strategy`` on ``devices`` cannot run here."""
    if hw.accelerator is Accelerator.MPS and strategy is not Strategy.SINGLE:
        raise SpecError(f"{strategy.value} does not run on Apple MPS; use single", field="--strategy")
    if strategy is Strategy.SINGLE and devices > 1:
        raise SpecError(
            f"single runs one process; for --devices {devices} choose ddp, fsdp, fsdp-grad-op or zero1/2/3",
            field="--strategy",
        )
    if strategy.multi_device_only and devices < 2:
        raise SpecError(f"{strategy.value} needs --devices 2 or more (got {devices})", field="--devices")
    if strategy.engine is Engine.DEEPSPEED and not deepspeed_installed():
        raise SpecError(f"{strategy.value} needs DeepSpeed: pip install 'trainplan[deepspeed]'", field="--strategy")
    if (
        strategy.engine is Engine.FSDP
        and hw.accelerator is Accelerator.CUDA
        and getattr(job, "precision", None) is Precision.FP16
    ):
        raise SpecError("fp16 with fsdp is not supported by trainplan run; use bf16", field="precision")
    check_job_strategy(job, strategy)


def _threads(hw: Hardware, processes: int) -> int:
    return max(1, hw.cpu_cores // max(1, processes))


def choose_option(
    job: Any,
    hw: Hardware,
    *,
    strategy: str | None = None,
    devices: int | None = None,
    predictor: Predictor = predict,
    tp: int = 1,
    sequence_parallel: bool = False,
    ep: int = 1,
    pp: int = 1,
    vpp: int = 1,
) -> Option:
    """The option to run ``job`` with on ``hw`` (see the module docstring)."""
    if pp != 1 or vpp != 1:
        if tp != 1 or sequence_parallel or ep != 1:
            raise SpecError("pipeline parallel with tensor or expert parallel is launched (--to torchtitan / "
                            "megatron), not run here: give one of --pp, --tp, --ep", field="--pp")  # fmt: skip
        return _choose_pipeline(job, hw, strategy, devices, pp, vpp)
    if ep != 1:
        if tp != 1 or sequence_parallel:
            raise SpecError("expert and tensor parallel together are launched (--to torchtitan / megatron), not run "
                            "here: give --ep or --tp", field="--ep")  # fmt: skip
        return _choose_expert_parallel(job, hw, strategy, devices, ep)
    if tp != 1 or sequence_parallel:
        return _choose_tensor_parallel(job, hw, strategy, devices, tp, sequence_parallel)
    if devices is not None and devices < 1:
        raise SpecError(f"must be >= 1, got {devices}", field="--devices")
    limit = max_devices(hw)
    if devices is not None and devices > limit:
        raise SpecError(f"this machine has {limit} {_unit(hw)}{'s' if limit != 1 else ''}; got {devices}", field="--devices")
    if job.kind is JobKind.TABULAR:
        return _choose_tabular(job, hw, strategy, devices, predictor)
    if strategy is not None:
        chosen = Strategy.parse(strategy)
        n = devices or (1 if not chosen.multi_device_only else _default_processes(hw))
        check_strategy(chosen, n, hw, job)
        return Option(chosen, n, hw.accelerator, _threads(hw, n), "named with --strategy", predictor(job, chosen.value, n, hw.hardware_id))
    n = devices or (limit if hw.accelerator is Accelerator.CUDA else 1)
    candidates = [Strategy.SINGLE] if n == 1 and hw.accelerator is not Accelerator.CUDA else list(strategies_for(n))
    if hw.accelerator is Accelerator.MPS:
        candidates = [Strategy.SINGLE]
    runnable = []
    for cand in candidates:
        try:
            check_strategy(cand, n, hw, job)
        except SpecError:
            continue
        runnable.append(cand)
    priced = [(c, predictor(job, c.value, n, hw.hardware_id)) for c in runnable]
    fits = [(c, p) for c, p in priced if p.peak_gib is None or p.peak_gib <= hw.device_memory_gib]
    timed = [(c, p) for c, p in fits if p.train_s is not None]
    if timed:
        best, pred = min(timed, key=lambda cp: cp[1].train_s)  # type: ignore[arg-type, return-value]
        return Option(best, n, hw.accelerator, _threads(hw, n), "fastest predicted option that fits", pred)
    if not fits and priced:
        smallest = min(p.peak_gib for _, p in priced if p.peak_gib is not None)
        raise SpecError(
            f"no strategy fits: the smallest predicted peak is {smallest:.1f} GiB per device, "
            f"this machine has {hw.device_memory_gib:.1f} GiB",
            field="--strategy",
        )
    default = Strategy.SINGLE if n == 1 else Strategy.DDP
    pred = dict(priced).get(default) or predictor(job, default.value, n, hw.hardware_id)
    return Option(default, n, hw.accelerator, _threads(hw, n), "default (no predicted time to compare)", pred)


def _choose_tensor_parallel(job: Any, hw: Hardware, strategy: str | None, devices: int | None, tp: int,
                            sequence_parallel: bool) -> Option:  # fmt: skip
    """``--tp N [--sp]``: tensor parallel inside FSDP (a 2-D mesh), for a transformer job's built-in model."""
    if tp < 1:
        raise SpecError(f"must be >= 1, got {tp}", field="--tp")
    if sequence_parallel and tp == 1:
        raise SpecError("sequence parallelism shards activations over the tensor-parallel ranks: it needs --tp > 1", field="--sp")
    _require_transformer(job, "--tp", "tensor", "a Llama-family model")
    _check_tensor_parallel_model(job, tp)
    named = f"named with --tp {tp}" + (" --sp" if sequence_parallel else "")
    return _model_parallel_option(job, hw, strategy, devices, "--tp", tp, "tensor", named, tp=tp,
                                  sequence_parallel=sequence_parallel)  # fmt: skip


def _choose_pipeline(job: Any, hw: Hardware, strategy: str | None, devices: int | None, pp: int, vpp: int) -> Option:
    """``--pp N [--vpp V]``: pipeline parallel (1F1B, or interleaved with V chunks a rank) × FSDP over each stage's
    ranks, for a transformer job's built-in Llama-family model."""
    if pp < 2:
        raise SpecError(f"pipeline parallel needs at least 2 stages, got {pp}", field="--pp")
    if vpp < 1:
        raise SpecError(f"must be >= 1, got {vpp}", field="--vpp")
    _require_transformer(job, "--pp", "pipeline", "a Llama-family model")
    arch = _check_llama_model(job, "--pp")
    if pp * vpp > arch.layers:
        raise SpecError(f"pp × vpp = {pp * vpp} pipeline chunks exceed the model's {arch.layers} layers", field="--pp")
    named = f"named with --pp {pp}" + (f" --vpp {vpp}" if vpp > 1 else "")
    return _model_parallel_option(job, hw, strategy, devices, "--pp", pp, "pipeline", named, pp=pp, vpp=vpp)


def _choose_expert_parallel(job: Any, hw: Hardware, strategy: str | None, devices: int | None, ep: int) -> Option:
    """``--ep N``: each MoE layer's experts split over ``ep`` ranks inside FSDP, for a transformer job's model."""
    if ep < 1:
        raise SpecError(f"must be >= 1, got {ep}", field="--ep")
    _require_transformer(job, "--ep", "expert", "a mixture-of-experts model")
    _check_expert_parallel_model(job, ep)
    return _model_parallel_option(job, hw, strategy, devices, "--ep", ep, "expert", f"named with --ep {ep}", ep=ep)


def _require_transformer(job: Any, flag: str, what: str, model: str) -> None:
    if job.kind is not JobKind.TRANSFORMER:
        raise SpecError(f"{what} parallelism runs kind: transformer jobs ({model}); this is kind: {job.kind.value}",
                        field=flag)  # fmt: skip


def _model_parallel_option(job: Any, hw: Hardware, strategy: str | None, devices: int | None, flag: str, degree: int,
                           what: str, named: str, **degrees: Any) -> Option:  # fmt: skip
    """The option of a run split ``degree`` ways by ``flag`` (--tp, --pp, --ep): FSDP shards over the ranks what the
    split leaves whole, ``degree`` divides the processes, and no prediction is made for this machine."""
    chosen = Strategy.parse(strategy) if strategy else Strategy.FSDP
    if chosen is not Strategy.FSDP:
        raise SpecError(f"with {flag} the ranks shard the rest of the model with fsdp; got {chosen.value}", field="--strategy")
    n = devices or _default_processes(hw)
    if n % degree:
        raise SpecError(f"{flag} {degree} must divide the {n} processes (--devices)", field=flag)
    check_strategy(chosen, max(n, 2), hw, job)
    note = f"no prediction for {what}-parallel runs of this machine yet (trainplan estimate {flag} plans GPU clusters)"
    return Option(chosen, n, hw.accelerator, _threads(hw, n), named, Prediction(note=note), **degrees)


def _check_expert_parallel_model(job: Any, ep: int) -> None:
    """Refuse, before any process starts, a model whose experts the expert-parallel runtime does not map
    (run/runtime/expert_parallel.py): the model is built on the meta device and its experts modules checked."""
    import torch
    from transformers import AutoModelForCausalLM

    from trainplan.catalog import checkpoint_dir
    from trainplan.model import UnsupportedArchitecture
    from trainplan.run.runtime.expert_parallel import check_expert_parallel
    from trainplan.run.workloads.checks import check_random_init_split, resolve_arch
    from trainplan.run.workloads.transformer import hf_config

    check_random_init_split(checkpoint_dir(job.model), "--ep")
    arch = resolve_arch(job)
    if arch.moe is None:
        raise SpecError("expert parallel splits a mixture-of-experts model's experts; this model has none", field="--ep")
    try:
        config = hf_config(arch, job.seq_len)
    except UnsupportedArchitecture as exc:
        raise SpecError(str(exc), field="model") from None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    check_expert_parallel(model, ep)


def _check_tensor_parallel_model(job: Any, tp: int) -> None:
    """Refuse, before any process starts, a model the tensor-parallel runtime does not map
    (run/runtime/model_parallel.py: Llama-family blocks, heads divisible by tp, randomly initialised)."""
    arch = _check_llama_model(job, "--tp")
    kv = arch.kv_heads or arch.heads
    if arch.heads % tp or kv % tp:
        raise SpecError(f"tensor parallel degree {tp} must divide the {arch.heads} attention heads and {kv} key-value heads",
                        field="--tp")  # fmt: skip


def _check_llama_model(job: Any, flag: str) -> Any:
    """The job's architecture, or one line naming ``flag`` when tensor / pipeline parallel runs cannot build it:
    they map Llama-family blocks and train from random weights (run/runtime/model_parallel.py)."""
    from trainplan.catalog import checkpoint_dir
    from trainplan.model import UnsupportedArchitecture, hf_model_type
    from trainplan.run.workloads.checks import check_random_init_split, resolve_arch

    check_random_init_split(checkpoint_dir(job.model), flag)
    arch = resolve_arch(job)
    try:
        family = hf_model_type(arch)
    except UnsupportedArchitecture as exc:
        raise SpecError(str(exc), field="model") from None
    if family != "llama":
        what = "tensor" if flag == "--tp" else "pipeline"
        raise SpecError(f"{what}-parallel runs map Llama-family blocks (q/k/v/o, gate/up/down projections); this "
                        f"model builds as {family}", field=flag)  # fmt: skip
    return arch


def _default_processes(hw: Hardware) -> int:
    if hw.accelerator is Accelerator.CUDA:
        return len(hw.gpus)
    return min(CPU_DEFAULT_PROCESSES, hw.cpu_cores) if hw.cpu_cores >= 2 else 2


def _choose_tabular(job: Any, hw: Hardware, strategy: str | None, devices: int | None, predictor: Predictor) -> Option:
    if strategy not in (None, Strategy.SINGLE.value):
        raise SpecError(
            "applies to transformer and torch jobs; tabular jobs fit their folds in parallel on all cores "
            "(use --devices to cap the parallel fits)",
            field="--strategy",
        )
    from trainplan.run.workloads.tabular import parallelism

    parallel, threads = parallelism(job.cv_folds, hw.cpu_cores, devices)
    pred = predictor(job, Strategy.SINGLE.value, parallel, hw.hardware_id)
    return Option(Strategy.SINGLE, parallel, Accelerator.CPU, threads, f"{parallel} parallel fits × {threads} threads", pred)
