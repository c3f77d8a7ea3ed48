"""``trainplan run`` as a library call: :func:`execute` a :class:`RunRequest`.

Order of work: load and check the job (data file, target column, model
factory, script) → probe the machine → choose the option → prepare the run
directory → resolve the :class:`~trainplan.run.config.RunConfig` → render →
submit (with a progress view, when the caller gives one) → read the workers'
``result.json`` (a :class:`~trainplan.run.results.WorkerResult`) → write
``summary.json`` (measured against predicted) → record a calibration.

Bad input raises :class:`~trainplan.errors.TrainplanError` before anything
is launched or any file is touched.  A run that fails or is preempted still
returns a :class:`RunSummary`; the run directory is always kept.
"""

from __future__ import annotations

import math
import platform
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

from trainplan.errors import SpecError, TrainplanError
from trainplan.estimate.tabular import rounds_per_fit
from trainplan.files import write_json_atomic, write_text_atomic
from trainplan.measure.calibration import Calibration, record_calibration
from trainplan.measure.probe import Accelerator, Hardware, probe_hardware
from trainplan.run.choose import Option, choose_option
from trainplan.run.config import RunConfig
from trainplan.run.launch import DEFAULT_MAX_RESTARTS, LaunchSpec, WarmWorker, deepspeed_config, render, submit
from trainplan.run.predict import FIGURES, Prediction, relative_error
from trainplan.run.results import Measured, RunStatus, WorkerResult
from trainplan.run.rundir import RunLock, RunPaths, prepare_run_dir
from trainplan.run.workloads.checks import check_job_strategy, check_qlora_installed
from trainplan.spec import JobKind, Method, Precision, TabularLibrary, load_job
from trainplan.strategies import Engine, Strategy

#: Exit code of a run stopped by SIGTERM after writing a checkpoint (EX_TEMPFAIL, sysexits.h: retry later).
PREEMPTED_EXIT_CODE = 75
#: Default time between checkpoints of neural runs, in minutes.
DEFAULT_CHECKPOINT_MINUTES = 10.0


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for on the command line."""

    job_path: Path | None  # None: --script alone (a kind: script job named after the script, --steps long)
    out: Path
    strategy: str | None = None
    devices: int | None = None
    steps: int | None = None
    checkpoint_every: int | None = None
    checkpoint_minutes: float | None = DEFAULT_CHECKPOINT_MINUTES
    resume: bool = False
    overwrite: bool = False
    script: Path | None = None
    script_args: tuple[str, ...] = ()
    max_restarts: int = DEFAULT_MAX_RESTARTS
    tp: int = 1  # tensor-parallel degree (fsdp over the remaining ranks)
    sequence_parallel: bool = False
    ep: int = 1  # expert-parallel degree (each MoE layer's experts split over ep ranks, fsdp over the rest)
    pp: int = 1  # pipeline stages (fsdp over each stage's ranks)
    vpp: int = 1  # chunks per pipeline rank (interleaved 1F1B)


class ProgressSink(Protocol):
    """A progress display: :meth:`refresh` is called while the workers train, :meth:`close` at the end."""

    def refresh(self) -> None: ...

    def close(self) -> None: ...


#: Makes a progress display from (metrics.jsonl path, total steps, a label); the CLI passes a rich one.
ProgressFactory = Callable[[Path, int, str], ProgressSink]


@dataclass(frozen=True)
class RunSummary:
    """The outcome of a run: measurement against prediction."""

    status: RunStatus
    out: Path
    exit_code: int
    kind: str
    strategy: str
    devices: int
    accelerator: str
    hardware_id: str
    reason: str
    measured: dict[str, float | None]
    predicted: dict[str, float | None]
    error: dict[str, float | None]
    steps: int = 0
    restarts: int = 0
    precision: str | None = None
    peak_method: str | None = None
    prediction_note: str | None = None
    message: str | None = None
    notes: tuple[str, ...] = field(default=())
    #: the prediction used a rate measured by an earlier run on this machine (the calibration store)
    predicted_from_calibration: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "out": str(self.out),
            "exit_code": self.exit_code,
            "kind": self.kind,
            "strategy": self.strategy,
            "devices": self.devices,
            "accelerator": self.accelerator,
            "hardware_id": self.hardware_id,
            "reason": self.reason,
            "measured": self.measured,
            "predicted": self.predicted,
            "error": self.error,
            "steps": self.steps,
            "restarts": self.restarts,
            "precision": self.precision,
            "peak_method": self.peak_method,
            "prediction_note": self.prediction_note,
            "predicted_from_calibration": self.predicted_from_calibration,
            "message": self.message,
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- the job


def apply_overrides(job: Any, steps: int | None) -> Any:
    """The job with ``--steps`` applied (boosting rounds — trees, or solver iterations — for tabular jobs)."""
    if steps is None:
        return job
    if steps < 1:
        raise SpecError(f"must be >= 1, got {steps}", field="--steps")
    data = job.model_dump()
    if job.kind is JobKind.TABULAR:
        data["iterations" if job.library is TabularLibrary.SKLEARN_LINEAR else "trees"] = steps
    else:
        data["steps"] = steps
        if job.kind is not JobKind.SCRIPT:
            data["epochs"] = None
        if job.kind is JobKind.TRANSFORMER:
            data["tokens"] = None
    return type(job).model_validate(data)


def load_request_job(request: RunRequest) -> Any:
    """The job file's job, or for ``--script`` alone a ``kind: script`` job named after the script."""
    if request.job_path is not None:
        return load_job(request.job_path)
    if request.script is None:
        raise SpecError("give a job file, or --script PATH to run your own script", field="JOB")
    if request.steps is None:
        raise SpecError("a script run without a job file needs --steps (the optimizer steps, ctx.total_steps)",
                        field="--steps")
    from trainplan.spec import JOB_NAME, ScriptJob

    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.script.stem).lstrip("._-")[:100] or "script"
    assert JOB_NAME.fullmatch(name)
    return ScriptJob(name=name, steps=request.steps)


def job_json(job: Any) -> dict[str, Any]:
    """The job as JSON for ``run.json``; a transformer's preset is resolved to its architecture."""
    if job.kind is JobKind.TRANSFORMER and isinstance(job.model, str):
        from trainplan.run.workloads.checks import resolve_arch
        from trainplan.catalog import checkpoint_dir as checkpoint_path

        checkpoint = checkpoint_path(job.model)  # a checkpoint directory stays a path: the workers load its weights
        job = job.model_copy(update={"model": str(checkpoint.resolve()) if checkpoint else resolve_arch(job)})
    return job.model_dump(mode="json", exclude_none=True)


def library_pin(job: Any) -> str | None:
    """The pip requirement that installs a tabular job's named release (``library_version``) on the machines a
    launch renders for: ``xgboost==2.1.4``, or ``xgboost==2.1.*`` for a major.minor; None when the job names none."""
    version = getattr(job, "library_version", None)
    if version is None:
        return None
    return f"{job.library.value}=={version}" + (".*" if version.count(".") == 1 else "")


def check_library_release(job: Any) -> None:
    """A tabular job that names its library release (``library_version``) runs with that release: the run measures
    the installed one, so a different major.minor is refused (its prediction would be of another release).  Called
    where the fits run: ``trainplan run`` and local launches here, the rendered worker on the nodes."""
    if getattr(job, "library_version", None) is None:
        return
    import importlib

    lib = job.library.value
    try:  # the module's own version: XGBoost's CPU-only wheel is the distribution xgboost-cpu
        installed = str(importlib.import_module(lib).__version__)
    except ImportError:
        return  # the workload says the library is missing, with how to install it
    if installed.split(".")[:2] != job.library_version.split(".")[:2]:
        raise SpecError(f"the job names {lib} {job.library_version} but {installed} is installed; trainplan run measures "
                        f"the installed release: install {lib}=={job.library_version} or set library_version: "
                        f"{'.'.join(installed.split('.')[:3])}", field="library_version")  # fmt: skip


def check_job(job: Any, script: Path | None, *, runs_here: bool = True) -> Any:
    """Reject bad input before launching; returns the job as the prediction should see it.

    Tabular data is inspected (file, target column, classes) and the job's
    ``rows`` / ``features`` replaced by the real ones.  ``runs_here``: the fits run in this Python environment, so a
    named library release must be the installed one; a launch to other machines pins it there instead
    (:func:`library_pin`) and the worker checks it where it runs.
    """
    if script is not None:
        if not script.is_file():
            raise SpecError(f"script not found: {script}", field="--script")
        if script.suffix != ".py":
            raise SpecError(f"must be a Python file (.py), got {script.name}", field="--script")
    if job.kind is JobKind.SCRIPT and script is None:
        raise SpecError("kind: script runs your own training script: give it with --script PATH", field="kind")
    if job.kind is JobKind.TABULAR:
        from trainplan.run.workloads.tabular import inspect_data

        if runs_here:
            check_library_release(job)
        shape = inspect_data(job)
        return job.model_copy(update={"rows": shape.rows, "features": shape.features, "density": shape.density})
    if script is not None:
        return job
    from trainplan.run.workloads.checks import (
        as_built,
        as_trained,
        check_loss,
        check_optimizer,
        check_supported,
        import_callable,
        is_import_path,
        resolve_arch,
    )

    if job.kind is JobKind.KERAS:
        from trainplan.run.workloads.keras import check_keras_job

        return check_keras_job(job)
    check_optimizer(job.optimizer)
    job = as_trained(job)[0]  # the stack and knobs the built-in workloads train with (a note says what differs)
    if job.kind is JobKind.TRANSFORMER:
        arch = resolve_arch(job)
        check_supported(job, arch)
        if job.data not in (None, "synthetic") and not Path(job.data).expanduser().is_file():
            raise SpecError(f"data file not found: {job.data} (or use data: synthetic)", field="data")
        check_pretrained(job, arch)
        job = as_built(job, arch)[0]  # the model as transformers builds it (after the checkpoint's weights are checked)
    else:
        import_callable(job.model, field="model")
        check_loss(job.loss)
        if job.data not in (None, "synthetic"):
            if not is_import_path(job.data):
                raise SpecError(
                    f"for torch jobs, data is 'synthetic' or a data-set factory 'pkg.mod:fn', got {job.data!r}",
                    field="data",
                )
            import_callable(job.data, field="data")
    return job


def check_pretrained(job: Any, arch: Any) -> None:
    """A checkpoint directory: weights that match its config, a tokenizer, and a data file to train on."""
    from trainplan.catalog import checkpoint_dir

    checkpoint = checkpoint_dir(job.model)
    if checkpoint is None:
        if job.data_format is not None:
            raise SpecError("data_format applies to a pretrained checkpoint (model: a directory as save_pretrained "
                            "writes it); other transformer jobs read data as bytes", field="data_format")
        return
    if job.data in (None, "synthetic"):
        raise SpecError("a pretrained checkpoint trains on a data file: JSONL, Parquet or text (data: PATH)", field="data")
    from trainplan.estimate.architecture import param_counts
    from trainplan.run.workloads.pretrained import inspect_checkpoint

    # trainplan's own count of the config's model: equal to what transformers builds for every model type it reads
    # (tests/test_hf_families.py), and it needs no transformers import here (about 3 s of a run's start-up).
    # DeepSeek-V3 checkpoints may carry the multi-token-prediction layers transformers does not build: either count.
    counts = param_counts(arch)
    inspect_checkpoint(checkpoint, expected_params=(counts.total - counts.mtp, counts.total), need_tokenizer=True)


def stack_notes(job: Any, script: Path | None) -> tuple[str, ...]:
    """What of the job's stack, knobs and model the built-in workloads do not apply (none for a user's script)."""
    if script is not None:
        return ()
    from trainplan.run.workloads.checks import as_built, as_trained

    return tuple(note for note in (as_trained(job)[1], as_built(job)[1]) if note is not None)


#: Called while the data is tokenized: (records done, records in all).
TokenizeProgress = Callable[[int, int], None]


def prepare_data(job: Any, request: RunRequest, progress: TokenizeProgress | None,
                 before: Callable[[], None] | None = None) -> Any:
    """Tokenize a pretrained job's data (None when the run directory's cache already holds it, or no checkpoint);
    ``before`` is called first when it does (``trainplan run`` starts its worker's imports then)."""
    from trainplan.run.workloads import textdata
    from trainplan.catalog import checkpoint_dir as checkpoint_path

    checkpoint = checkpoint_path(job.model) if job.kind is JobKind.TRANSFORMER else None
    if checkpoint is None or request.script is not None:
        return None
    data = Path(job.data).expanduser()
    if request.resume and (request.out / "run.json").exists():
        key = textdata.cache_key(checkpoint, data, job.data_format or textdata.DataFormat(), job.seq_len, job.seed)
        if textdata.cached_key(request.out) != key:
            raise SpecError("the data, its format or the tokenizer changed since the run started; "
                            "start a new run (--out elsewhere, or --overwrite)", field="--resume")
        return None
    if before is not None:
        before()
    return textdata.prepare(checkpoint, data, job.data_format, job.seq_len, job.seed, progress)


def data_stats(out: Path) -> Any:
    """The statistics of the tokenized data cached in ``out`` (None without a cache)."""
    import json

    if not (out / "data" / "data.json").is_file():  # textdata.cache_dir; checked first, as textdata imports torch
        return None
    from trainplan.run.workloads.textdata import DataStats, cache_dir

    try:
        return DataStats(**json.loads((cache_dir(out) / "data.json").read_text(encoding="utf-8"))["stats"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# --------------------------------------------------------------------------- the configuration


def _precision(job: Any, accelerator: Accelerator, strategy: Strategy) -> tuple[Precision, tuple[str, ...]]:
    asked = getattr(job, "precision", Precision.FP32)
    if accelerator is not Accelerator.CUDA:
        note = () if asked is Precision.FP32 else (f"precision {asked.value} runs as fp32 on {accelerator.value}",)
        return Precision.FP32, note
    if asked in (Precision.BF16, Precision.BF16_PURE):
        import torch

        if not torch.cuda.is_bf16_supported():
            return Precision.FP16, (f"this GPU has no bf16; precision {asked.value} runs as fp16",)
    if asked is Precision.BF16_PURE and strategy.engine is Engine.DEEPSPEED:
        return Precision.BF16, ("DeepSpeed keeps fp32 master weights: bf16-pure runs as bf16",)
    return asked, ()


def resolve_config(
    job: Any,
    option: Option,
    paths: RunPaths,
    request: RunRequest,
    *,
    precision: tuple[Precision, tuple[str, ...]] | None = None,
    extra_notes: tuple[str, ...] = (),
) -> RunConfig:
    """Everything the workers need, decided once.

    ``precision`` (the precision and its notes) replaces the choice made from this
    machine's device — ``trainplan launch`` decides it for the plan's GPUs.  ``extra_notes`` join the run's notes.
    """
    base: dict[str, Any] = dict(
        job=job_json(job),
        out_dir=str(paths.root.resolve()),
        strategy=option.strategy,
        accelerator=option.accelerator,
        threads_per_process=option.threads_per_process,
        script=str(request.script.resolve()) if request.script else None,
    )
    if job.kind is JobKind.TABULAR:
        return RunConfig(
            **base,
            world_size=1,
            total_steps=rounds_per_fit(job) * job.cv_folds,
            parallel_fits=option.devices,
            threads_per_fit=option.threads_per_process,
        )
    check_job_strategy(job, option.strategy, model_parallel=option.tp * option.pp * option.ep > 1)
    world = option.devices
    dp = world // (option.tp * option.pp)  # the tp ranks / pipeline stages of a data-parallel rank read the same data
    micro = job.micro_batch
    global_batch = job.global_batch or micro * dp * option.pp  # a pipeline needs at least pp micro-batches a step
    if global_batch % (micro * dp):
        what = "data-parallel ranks" if option.tp > 1 or option.pp > 1 else "processes"
        raise SpecError(
            f"({global_batch}) must be a multiple of micro_batch × {what} ({micro} × {dp})", field="global_batch"
        )
    accum = global_batch // (micro * dp)
    if option.pp > 1 and (accum < option.pp or (option.vpp > 1 and accum % option.pp)):
        rule = f"a multiple of the {option.pp} stages" if option.vpp > 1 else f"at least the {option.pp} stages"
        raise SpecError(f"({global_batch}) gives each data-parallel rank {accum} pipeline micro-batches of {micro} a "
                        f"step; the schedule needs {rule}: raise global_batch", field="global_batch")  # fmt: skip
    precision, notes = precision or _precision(job, option.accelerator, option.strategy)
    notes = (*notes, *extra_notes)
    ds = None
    if option.strategy.engine is Engine.DEEPSPEED:
        ds = deepspeed_config(
            option.strategy,
            micro_batch=micro,
            grad_accum=accum,
            world_size=world,
            precision=precision,
            accelerator=option.accelerator,
        )
    if request.checkpoint_every is not None and request.checkpoint_every < 1:
        raise SpecError(f"must be >= 1, got {request.checkpoint_every}", field="--checkpoint-every")
    total_steps = job.total_steps(global_batch)
    stats = data_stats(paths.root) if job.kind is JobKind.TRANSFORMER and request.script is None else None
    if stats is not None:
        notes = (*notes, stats.describe())
        if job.epochs is not None:  # epochs of the tokenized data, whatever `dataset` estimated
            total_steps = max(1, math.ceil(job.epochs * stats.rows / global_batch))
    return RunConfig(
        **base,
        world_size=world,
        total_steps=total_steps,
        grad_accum=accum,
        micro_batch=micro,
        global_batch=global_batch,
        precision=precision,
        checkpoint_every=request.checkpoint_every,
        checkpoint_minutes=request.checkpoint_minutes,
        deepspeed=ds,
        tp=option.tp,
        sequence_parallel=option.sequence_parallel,
        ep=option.ep,
        pp=option.pp,
        vpp=option.vpp,
        notes=notes,
    )


# --------------------------------------------------------------------------- results


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s*")
_LAUNCHER_ERRORS = ("ChildFailedError", "SignalException")


def last_error_line(log: Path) -> str | None:
    """The most telling line at the end of a log: the last exception line, else the last text line."""
    try:
        lines = [ln.strip() for ln in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return None
    # torchrun prefixes each worker's lines with "[rank0]:" (or "[default0]:"); its own ChildFailedError
    # says only that a worker failed, so the workers' exception lines come first
    lines = [_RANK_PREFIX.sub("", ln) for ln in lines]
    lines = [ln for ln in lines if ln and not ln.startswith("$ ") and not set(ln) <= set("=-*_ ")]
    exc = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Failure))(:.*)?$")
    found = [ln for ln in lines[-400:] if exc.match(ln)]
    causes = [ln for ln in found if not ln.split(":", 1)[0].endswith(_LAUNCHER_ERRORS)]
    if causes or found:
        return (causes or found)[-1][:300]
    return lines[-1][:300] if lines else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _throughput_key(kind: JobKind) -> str:
    return "tokens_per_s" if kind is JobKind.TRANSFORMER else "rows_per_s"


def _figure_keys(kind: JobKind) -> tuple[str, ...]:
    return ("step_time_s", "peak_gib", _throughput_key(kind), "train_s", "final_loss")


def _measured(kind: JobKind, measured: Measured) -> dict[str, float | None]:
    return {k: measured.figure(k) for k in _figure_keys(kind)}


def _predicted(kind: JobKind, prediction: Prediction) -> dict[str, float | None]:
    figures = prediction.figures()
    return {k: figures[k] for k in _figure_keys(kind)}


def calibration_from(summary: RunSummary, job: Any, result: WorkerResult) -> Calibration:
    """The calibration record of a completed run."""
    from trainplan.estimate.tabular import tabular_work_unit

    kind = JobKind(summary.kind)
    m = result.measured
    flops_per_token = result.workload.flops_per_token
    tflops = None
    ns_per_cell = None
    throughput = m.figure(_throughput_key(kind))
    if kind is JobKind.TRANSFORMER and throughput and flops_per_token:
        tflops = flops_per_token * throughput / summary.devices / 1e12
    if kind is JobKind.TABULAR and result.folds:
        ns_per_cell = tabular_ns_per_cell(job, result)
    unit = {JobKind.TRANSFORMER: "tokens/s", JobKind.TORCH: "samples/s", JobKind.KERAS: "samples/s", JobKind.TABULAR: "rows/s"}[kind]
    return Calibration(
        hardware_id=summary.hardware_id,
        kind=kind.value,
        key=job.library.value if kind is JobKind.TABULAR else summary.strategy,
        devices=summary.devices,
        step_time_s=m.step_time_s,
        throughput=throughput,
        throughput_unit=unit,
        peak_gib=m.peak_gib,
        achieved_tflops=tflops,
        recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        host=socket.gethostname() or platform.node(),
        job_name=job.name,
        run_dir=str(summary.out),
        ns_per_cell=ns_per_cell,
        work_unit=tabular_work_unit(job.library.value) if ns_per_cell is not None else None,
    )


def tabular_ns_per_cell(job: Any, result: WorkerResult) -> float | None:
    """The per-core rate the finished folds imply (median over folds), in the catalog's unit."""
    from statistics import median

    from trainplan.catalog import get_catalog
    from trainplan.estimate.tabular import measured_ns_per_cell

    work = result.workload
    if work.rows is None or work.features is None or work.threads_per_fit is None:
        return None  # not a tabular worker's result
    shape = {"rows": work.rows, "features": work.features}
    if job.objective == "multiclass" and work.classes:
        shape["classes"] = work.classes
    real = job.model_copy(update=shape)
    rates = [
        measured_ns_per_cell(real, get_catalog(), rows=f.rows, rounds=f.rounds, fit_s=f.fit_s, threads=work.threads_per_fit)
        for f in result.folds or ()
        if f.fit_s > 0 and f.rounds > 0
    ]
    return median(rates) if rates else None


# --------------------------------------------------------------------------- the whole run


def plan_launch(
    request: RunRequest, *, tokenize_progress: TokenizeProgress | None = None, warm: WarmWorker | None = None
) -> tuple[Any, Hardware, Option, RunPaths, RunConfig, LaunchSpec]:
    """Everything up to (not including) the launch: checks, data, choice, run directory, rendered command.

    ``warm`` is started when the data is tokenized here (the worker then imports while this process tokenizes)."""
    job = apply_overrides(load_request_job(request), request.steps)
    job_for_prediction = check_job(job, request.script)
    check_qlora_installed(job)  # here, not in check_job: a launch render runs it on nodes that install the extra
    if request.strategy is not None:
        check_job_strategy(job, Strategy.parse(request.strategy))  # before the data is tokenized
    prepared = prepare_data(job, request, tokenize_progress, warm.start if warm is not None else None)
    hw = probe_hardware(use_gpus=job.kind is not JobKind.TABULAR)
    strategy, devices = request.strategy, request.devices
    previous = _previous_config(request)
    if previous is not None:  # a resumed run keeps its layout unless told otherwise
        strategy = strategy or (previous.strategy.value if job.kind is not JobKind.TABULAR else None)
        devices = devices or (previous.parallel_fits if job.kind is JobKind.TABULAR else previous.world_size)
    tp, sp, ep, pp, vpp = request.tp, request.sequence_parallel, request.ep, request.pp, request.vpp
    if previous is not None and (tp, sp, ep, pp, vpp) == (1, False, 1, 1, 1):  # a resumed run keeps its layout too
        tp, sp, ep, pp, vpp = previous.tp, previous.sequence_parallel, previous.ep, previous.pp, previous.vpp
    option = choose_option(job_for_prediction, hw, strategy=strategy, devices=devices, tp=tp, sequence_parallel=sp,
                           ep=ep, pp=pp, vpp=vpp)  # fmt: skip
    if previous is not None and job.kind is not JobKind.TABULAR and (
        previous.strategy is not option.strategy or previous.world_size != option.devices
        or (previous.tp, previous.ep, previous.pp, previous.vpp) != (option.tp, option.ep, option.pp, option.vpp)
    ):
        raise SpecError(
            f"the run was started with {previous.strategy.value} on {previous.world_size} process(es) (tp {previous.tp}, "
            f"ep {previous.ep}, pp {previous.pp}, vpp {previous.vpp}); resume it with the same --strategy, --devices, "
            f"--tp, --ep, --pp and --vpp",
            field="--resume",
        )
    RunLock.check_free(request.out)
    paths = prepare_run_dir(request.out, job=job_json(job), resume=request.resume, overwrite=request.overwrite)
    lock = RunLock.acquire(paths.root)
    _held_locks[paths.root.resolve()] = lock
    try:
        if prepared is not None:
            from trainplan.run.workloads.textdata import write_cache

            write_cache(paths.root, prepared)
        config = resolve_config(job, option, paths, request, extra_notes=stack_notes(job, request.script))
        if job.kind is JobKind.KERAS and request.script is None:
            from trainplan.run.workloads.keras import render_keras

            spec = render_keras(config)
        else:
            spec = render(config, script=request.script, script_args=request.script_args, max_restarts=request.max_restarts)
        if not paths.job.exists():
            if request.job_path is not None:
                write_text_atomic(paths.job, request.job_path.read_text(encoding="utf-8"))
            else:
                import yaml

                write_text_atomic(paths.job, yaml.safe_dump(job.model_dump(mode="json", exclude_none=True), sort_keys=False))
    except BaseException:
        release_lock(paths.root)
        if not request.resume:  # a fresh directory holds only what this start wrote: leave nothing behind
            import shutil

            shutil.rmtree(paths.root, ignore_errors=True)
        raise
    return job, hw, option, paths, config, spec


#: The run-directory locks this process holds (taken by plan_launch, dropped when execute returns).
_held_locks: dict[Path, RunLock] = {}


def release_lock(root: Path) -> None:
    lock = _held_locks.pop(Path(root).resolve(), None)
    if lock is not None:
        lock.release()


def _previous_config(request: RunRequest) -> RunConfig | None:
    if not request.resume:
        return None
    path = RunPaths(request.out).run_config
    return RunConfig.read(path) if path.exists() else None


def execute(
    request: RunRequest,
    *,
    progress: ProgressFactory | None = None,
    on_planned: Callable[[Option, RunConfig, LaunchSpec], None] | None = None,
    tokenize_progress: TokenizeProgress | None = None,
) -> RunSummary:
    """Run ``request`` to the end (or to preemption / failure) and summarise it.

    ``progress`` makes the display that follows the run's metrics while it
    trains (the CLI passes :class:`trainplan.cli.progress.ProgressView`); None shows nothing.
    ``tokenize_progress`` is called while a pretrained job's data is tokenized.
    """
    warm = WarmWorker()
    try:
        job, hw, option, paths, config, spec = plan_launch(request, tokenize_progress=tokenize_progress, warm=warm)
    except BaseException:
        warm.discard()
        raise
    try:
        return _execute(request, job, hw, option, paths, config, spec, progress, on_planned, warm)
    finally:
        warm.discard()
        release_lock(paths.root)


def _execute(request: RunRequest, job: Any, hw: Hardware, option: Option, paths: RunPaths, config: RunConfig,
             spec: LaunchSpec, progress: ProgressFactory | None,
             on_planned: Callable[[Option, RunConfig, LaunchSpec], None] | None,
             warm: WarmWorker | None = None) -> RunSummary:
    if on_planned is not None:
        on_planned(option, config, spec)
    paths.result.unlink(missing_ok=True)
    view = None
    if progress:
        label = f"{job.name} · {option.strategy.value if job.kind is not JobKind.TABULAR else job.library.value}"
        view = progress(paths.metrics, config.total_steps, label)
    started = time.perf_counter()
    try:
        rc = submit(spec, log_path=paths.log, poll=view.refresh if view else None, warm=warm)
    finally:
        if view is not None:
            view.close()
    result = WorkerResult.read(paths.result)
    notes: tuple[str, ...] = ()
    blind = result is None and request.script is not None
    if blind and rc == 0:
        # a script that does not use trainplan.runtime: only its wall time is known
        result = WorkerResult(
            status=RunStatus.COMPLETED,
            steps=0,
            measured=Measured(train_s=time.perf_counter() - started),
            precision=config.precision,
        )
    if blind:
        notes = ("the script did not report steps through trainplan.runtime (ctx.end_of_step): only its wall time was "
                 "measured, so nothing is compared with a prediction",)
    status = result.status if result is not None else RunStatus.FAILED
    message = None
    if status is RunStatus.COMPLETED and rc != 0:
        status = RunStatus.FAILED  # the workers finished but the launcher did not exit cleanly
    if status is RunStatus.FAILED:
        why = last_error_line(paths.log)
        who = f"script {request.script.name}" if request.script else "training"
        how = f"was killed by {_signal_name(-rc)}" if rc < 0 else f"failed with exit code {rc}"
        message = f"{who} {how}" + (f": {why}" if why else "") + f" (log: {paths.log})"
        exit_code = rc if rc > 0 else 1
    else:
        exit_code = 0 if status is RunStatus.COMPLETED else PREEMPTED_EXIT_CODE
        if status is RunStatus.PREEMPTED:
            message = (
                f"preempted at step {result.steps if result else 0}: checkpoint written; "
                f"continue with --resume --out {paths.root}"
            )
    kind = job.kind
    measured = _measured(kind, result.measured if result else Measured())
    predicted = _predicted(kind, option.prediction)
    if blind:
        predicted = dict.fromkeys(predicted)
    summary = RunSummary(
        status=status,
        out=paths.root,
        exit_code=exit_code,
        kind=kind.value,
        strategy=option.strategy.value,
        devices=option.devices,
        accelerator=option.accelerator.value,
        hardware_id=hw.hardware_id,
        reason=option.reason,
        measured=measured,
        predicted=predicted,
        error={k: relative_error(measured[k], predicted[k]) for k in measured if k in FIGURES},
        steps=result.steps if result else 0,
        restarts=result.restarts if result else 0,
        precision=(result.precision if result else config.precision).value,
        peak_method=result.peak_method if result else None,
        prediction_note=option.prediction.note,
        message=message,
        notes=(*config.notes, *notes),
        predicted_from_calibration=option.prediction.from_calibration and not blind,
    )
    write_json_atomic(paths.summary, summary.to_json())
    loss = measured.get("final_loss")
    if status is RunStatus.COMPLETED and loss is not None and not math.isfinite(loss):
        summary = _with_note(summary, f"final loss is {loss}: the run diverged; no calibration recorded from it")
        write_json_atomic(paths.summary, summary.to_json())
    elif status is RunStatus.COMPLETED and result is not None and request.script is None:
        try:
            record_calibration(calibration_from(summary, job, result))
        except TrainplanError as exc:
            summary = _with_note(summary, f"calibration not recorded: {exc}")
            write_json_atomic(paths.summary, summary.to_json())
    return summary


def _with_note(summary: RunSummary, note: str) -> RunSummary:
    from dataclasses import replace

    return replace(summary, notes=(*summary.notes, note))
