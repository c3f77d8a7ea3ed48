"""From a job and a plan option to a :class:`LaunchPlan`: which option, where it runs, what the workers are told.

The option is the N-th of ``trainplan plan``'s ranking (``--option N``) or the
configuration named like ``trainplan estimate`` does (``--gpu A100-80GB --gpus 4
[--nodes M] --strategy zero2``, ``--instance NAME``, ``--cpus N``).  An option
the planner rejects is not launched.  Everything is checked here, before a
file is written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainplan.catalog import Catalog, find_accelerator, find_instance, get_catalog
from trainplan.errors import InfeasibleError, SpecError
from trainplan.estimate.compat import micro_steps_of
from trainplan.estimate.hardware import Hardware, hardware_for_cpus, hardware_for_gpu, hardware_for_instance, with_layout
from trainplan.estimate.result import Estimate
from trainplan.measure.probe import Accelerator
from trainplan.planner.calibrated import efficiency_lookup
from trainplan.planner.core import estimate_option, plan_job, require_options
from trainplan.run.api import RunRequest, apply_overrides, check_job, resolve_config, stack_notes
from trainplan.run.choose import Option
from trainplan.run.predict import Prediction
from trainplan.run.rundir import RunPaths
from trainplan.run.targets.base import LaunchOptions, LaunchPlan, Placement, Target
from trainplan.spec import JobKind, Precision, load_job
from trainplan.strategies import Engine, Layout, Strategy


@dataclass(frozen=True)
class LaunchRequest:
    """What the user asked ``trainplan launch`` for."""

    job_path: Path
    target: Target
    out: Path
    option: int | None = None  # the N-th option of the plan's ranking (1-based)
    gpu: str | None = None
    gpus: int = 1  # per node
    nodes: int = 1
    instance: str | None = None
    cpus: int | None = None
    strategy: str | None = None
    # model-parallel degrees of a named configuration (tp, pp, vpp, cp, ep, sequence_parallel), as `estimate` takes them
    degrees: dict[str, int | bool] = field(default_factory=dict)
    device: str | None = None  # "cpu": rehearse the plan's layout on CPUs (gloo)
    steps: int | None = None
    checkpoint_every: int | None = None
    checkpoint_minutes: float | None = 10.0
    overwrite: bool = False
    options: LaunchOptions = field(default_factory=LaunchOptions)


#: Targets that run a layout splitting the model (the others run data-parallel layouts only).
MODEL_PARALLEL_TARGETS = frozenset({Target.TORCHTITAN, Target.MEGATRON})

#: Targets that train with their own trainer and model code, not trainplan's worker.
OWN_TRAINER_TARGETS = frozenset({Target.TORCHTITAN, Target.MEGATRON})


def _hardware(request: LaunchRequest, catalog: Catalog) -> Hardware:
    named = [n for n, v in (("--gpu", request.gpu), ("--instance", request.instance), ("--cpus", request.cpus)) if v is not None]
    if len(named) > 1:
        raise SpecError("give one of --gpu NAME, --instance NAME, --cpus N", field="hardware")
    Layout(gpus_per_node=request.gpus, nodes=request.nodes)  # validates the degrees
    if request.gpu is not None:
        hw = hardware_for_gpu(find_accelerator(request.gpu, catalog), catalog, gpus=request.gpus, nodes=request.nodes)
        return with_layout(hw, request.degrees)
    if request.instance is not None:
        return with_layout(hardware_for_instance(find_instance(request.instance, catalog), catalog, nodes=request.nodes),
                           request.degrees)  # fmt: skip
    if request.cpus is None or request.cpus < 1:
        raise SpecError(f"must be >= 1, got {request.cpus}", field="--cpus")
    return with_layout(hardware_for_cpus(request.cpus, catalog), request.degrees)  # degrees on CPUs: one line


def choose_estimate(job: Any, request: LaunchRequest, catalog: Catalog) -> Estimate:
    """The plan option to launch: ``--option N`` of the ranking, or the named configuration."""
    named = request.gpu is not None or request.instance is not None or request.cpus is not None
    if request.option is not None and (named or request.strategy):
        raise SpecError("give --option N, or the hardware (--gpu/--instance/--cpus) and --strategy, not both", field="--option")
    if not named:
        degrees = [f"--{k}" if k != "sequence_parallel" else "--sp" for k, v in request.degrees.items() if v not in (1, False)]
        loose = [n for n, v in (("--gpus", request.gpus != 1), ("--nodes", request.nodes != 1), ("--strategy", bool(request.strategy))) if v]
        loose += degrees
        if loose:
            raise SpecError("applies to hardware named with --gpu or --instance; --option N takes the plan's own", field=loose[0])
    efficiency = efficiency_lookup(job)
    if not named:
        plan = require_options(plan_job(job, catalog, efficiency_for=efficiency, hints=False), job)
        n = request.option or 1
        if not 1 <= n <= len(plan.options):
            raise SpecError(f"the plan has {len(plan.options)} option(s) that fit; got {n}", field="--option")
        chosen = plan.options[n - 1]
        if chosen.hardware.layout.model_parallel and request.target not in MODEL_PARALLEL_TARGETS:
            data_parallel = next((i + 1 for i, e in enumerate(plan.options) if not e.hardware.layout.model_parallel), None)
            alt = f"; option {data_parallel} is the best data-parallel one" if data_parallel else ""
            raise SpecError(f"option {n} ({chosen.hardware.label}, {chosen.setup}) splits the model (tensor / pipeline / "
                            f"context / expert parallel), which {request.target.value} does not run: --to torchtitan or megatron renders it, "
                            f"the other targets data-parallel options{alt}", field="--option")  # fmt: skip
        return chosen
    strategy = Strategy.parse(request.strategy) if request.strategy else None
    hw = _hardware(request, catalog)
    if hw.layout.model_parallel and request.target not in MODEL_PARALLEL_TARGETS:
        raise SpecError(f"{request.target.value} runs data-parallel layouts; --to torchtitan or megatron renders tensor / pipeline / "
                        "context / expert parallel ones", field="--tp/--pp/--cp/--ep")  # fmt: skip
    e = estimate_option(job, hw, catalog, strategy=strategy, efficiency_for=efficiency)
    if not e.fits:
        raise InfeasibleError(f"the plan rejects {e.hardware.label} with {e.strategy}: {e.reason}", field="--strategy")
    return e


def placement_of(e: Estimate, job: Any, device: str | None) -> Placement:
    """Nodes, processes per node and device of an option (``device="cpu"`` rehearses a GPU plan on CPUs)."""
    hw = e.hardware
    if device not in (None, "cpu", "cuda"):
        raise SpecError(f"must be cpu or cuda, got {device!r}", field="--device")
    if hw.accelerator is not None and hw.accelerator.kind == "tpu":
        return _tpu_placement(e, job, device)
    gpu = hw.accelerator.id if hw.accelerator is not None and hw.accelerator.kind == "gpu" else None
    if hw.accelerator is not None and gpu is None:
        raise SpecError(f"{hw.accelerator.id} is not a GPU; launches run on GPUs, TPU slices or CPUs", field="--gpu")
    tabular = job.kind is JobKind.TABULAR
    procs = 1 if (tabular and e.strategy != "dask-gpu") or gpu is None else hw.layout.gpus_per_node
    run_on = Accelerator.CUDA if gpu is not None and not tabular else Accelerator.CPU
    if device == "cuda" and run_on is not Accelerator.CUDA:
        raise SpecError("the option has no GPU to run on", field="--device")
    if device == "cpu":
        run_on = Accelerator.CPU
    cpus = hw.vcpus_per_node if not (device == "cpu" and gpu is not None) else procs
    inst = hw.instance
    spot = bool(job.constraints.spot and inst is not None and inst.spot_price_usd_per_h is not None and inst.cloud != "local")
    return Placement(
        nodes=hw.layout.nodes,
        procs_per_node=procs,
        device=run_on,
        cpus_per_node=max(1, cpus),
        hours=e.hours,
        label=hw.label,
        gpu=gpu,
        instance=inst.name if inst is not None else None,
        cloud=inst.cloud if inst is not None else None,
        spot=spot,
    )


def _tpu_placement(e: Estimate, job: Any, device: str | None) -> Placement:
    """A TPU option: one slice (a catalog row such as ``tpu-v5litepod-8``); its chips are the replicas, driven by one
    process per TPU VM host (run/tpu.py)."""
    from trainplan.run.tpu import slice_hosts

    hw = e.hardware
    acc, inst = hw.accelerator, hw.instance
    assert acc is not None
    if device is not None:
        raise SpecError(f"the option is a TPU slice ({hw.label}); --device cpu/cuda rehearses GPU plans", field="--device")
    if inst is None:
        raise SpecError(f"name a TPU slice with --instance (tpu-v5litepod-8, tpu-v4-8, ...), not --gpu {acc.id}", field="--gpu")
    if hw.layout.nodes > 1:
        raise SpecError(f"{hw.layout.nodes} TPU slices over the data-centre network (Multislice) are not rendered; "
                        f"pick one larger slice (--instance tpu-...-N)", field="--nodes")  # fmt: skip
    chips = hw.layout.gpus_per_node
    spot = bool(job.constraints.spot and inst.spot_price_usd_per_h is not None)
    return Placement(nodes=1, procs_per_node=chips, device=Accelerator.CPU, cpus_per_node=max(1, hw.vcpus_per_node),
                     hours=e.hours, label=hw.label, instance=inst.name, cloud=inst.cloud, spot=spot, tpu=acc.id,
                     hosts=slice_hosts(acc.id, chips))  # fmt: skip


def launch_precision(job: Any, placement: Placement, strategy: Strategy, catalog: Catalog) -> tuple[Precision, tuple[str, ...]]:
    """The precision the workers use on the plan's device (not this machine's)."""
    asked = getattr(job, "precision", Precision.FP32)
    if placement.tpu is not None:  # bf16 is the TPU's matmul type; the estimate already rejected fp16 there
        return asked, ()
    if placement.device is not Accelerator.CUDA:
        note = () if asked is Precision.FP32 else (f"precision {asked.value} runs as fp32 on cpu",)
        return Precision.FP32, note
    acc = catalog.accelerators.get(placement.gpu) if placement.gpu else None
    if asked in (Precision.BF16, Precision.BF16_PURE) and acc is not None and acc.peak_bf16_tflops is None:
        return Precision.FP16, (f"{acc.id} has no bf16; precision {asked.value} runs as fp16",)
    if asked is Precision.BF16_PURE and strategy.engine is Engine.DEEPSPEED:
        return Precision.BF16, ("DeepSpeed keeps fp32 master weights: bf16-pure runs as bf16",)
    return asked, ()


def check_out(out: Path, overwrite: bool) -> None:
    """``--out`` must be new or empty (or, with ``--overwrite``, a directory trainplan rendered), and its path free
    of control characters: a line break in a path written into a line-based file (an ``#SBATCH`` directive, a
    hostfile, DeepSpeed's environment file) would start a new line that the engine reads as a command."""
    bad = next((c for c in str(out) if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise SpecError(f"the path holds a control character ({bad!r}); rendered launch files are line-based, "
                        "so it cannot be written safely — choose another --out", field="--out")
    if out.exists() and not out.is_dir():
        raise SpecError(f"{out} exists and is not a directory; choose another --out", field="--out")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise SpecError(f"{out} exists and is not empty; choose another --out or pass --overwrite", field="--out")
        if not (out / "run.json").exists():
            raise SpecError(f"{out} was not rendered by trainplan (no run.json); refusing to replace it", field="--overwrite")
        from trainplan.run.rundir import foreign_entries

        results = sorted(n for n in ("checkpoints", "model.pt", "final", "result.json", "metrics.jsonl") if (out / n).exists())
        if results:
            raise SpecError(f"{out} holds a run's results ({', '.join(results)}); --overwrite would delete them — "
                            "launch into another --out", field="--overwrite")
        foreign = foreign_entries(out)
        if foreign:
            raise SpecError(f"{out} holds files trainplan did not write ({', '.join(foreign[:3])}); refusing to replace it",
                            field="--overwrite")


def resolve_launch(request: LaunchRequest, *, run_dir: Path | None = None) -> LaunchPlan:
    """The launch plan: option, placement and the workers' configuration; raises before writing anything.

    ``run_dir`` is where the workers write (default: ``request.out``).
    """
    catalog = get_catalog()
    options = request.options
    job = apply_overrides(load_job(request.job_path), request.steps)
    # torchtitan trains its own model code (checked by run/targets/torchtitan.py), not trainplan's worker
    # a named tabular release is checked against this environment only where the fits run here (local, or a Dask /
    # Ray cluster the driver starts); elsewhere the render pins it and the worker checks it on the nodes
    here = request.target is Target.LOCAL or (request.target in (Target.DASK, Target.RAY) and options.address is None)
    checked = job if request.target in OWN_TRAINER_TARGETS else check_job(job, options.script, runs_here=here)
    e = choose_estimate(checked, request, catalog)
    if e.strategy == "dask-gpu" and request.target is not Target.DASK:
        raise SpecError(f"the option trains one XGBoost model over {e.hardware.layout.gpus_per_node} GPUs with "
                        "xgboost.dask: launch it with --to dask", field="--to")  # fmt: skip
    if e.strategy == "dask-cpu" and request.target is not Target.DASK:
        # every other target would start the whole job on each machine: N independent fits of the whole table
        raise SpecError(f"the option trains one {job.library.value} model over {e.hardware.layout.nodes} machines "
                        "through Dask: launch it with --to dask --address SCHEDULER", field="--to")  # fmt: skip
    placement = placement_of(e, job, request.device)
    out = request.out.expanduser().resolve()
    check_out(out, request.overwrite)
    tabular = job.kind is JobKind.TABULAR
    strategy = Strategy.SINGLE if tabular else Strategy(e.strategy)
    if tabular:
        from trainplan.run.workloads.tabular import parallelism

        devices, threads = parallelism(job.cv_folds, placement.cpus_per_node)
    else:
        # a layout that splits the model feeds each batch to its data-parallel ranks only (tensor, pipeline and
        # context ranks share one): the run configuration divides the batch over those
        devices = e.hardware.layout.data_parallel if e.hardware.layout.model_parallel else placement.world_size
        threads = max(1, placement.cpus_per_node // placement.procs_per_node)
    option = Option(strategy, devices, placement.device, threads, f"plan option {e.hardware.label} {e.strategy}", Prediction())
    run_request = RunRequest(
        job_path=request.job_path,
        out=run_dir or out,
        checkpoint_every=request.checkpoint_every,
        checkpoint_minutes=request.checkpoint_minutes,
        script=options.script,
        script_args=options.script_args,
        max_restarts=options.max_restarts,
    )
    if placement.tpu is not None:
        check_tpu_job(job, request, options, placement)
    precision = launch_precision(job, placement, strategy, catalog) if not tabular else None
    notes = () if request.target in OWN_TRAINER_TARGETS else stack_notes(job, options.script)
    config = resolve_config(job, option, RunPaths(run_dir or out), run_request, precision=precision, extra_notes=notes)
    return LaunchPlan(
        target=request.target,
        job_path=request.job_path,
        job=job,
        strategy=strategy,
        placement=placement,
        config=config,
        out=out,
        options=options,
        layout=e.hardware.layout,
        micro_steps=1 if tabular else micro_steps_of(job, e.hardware),
    )


def check_tpu_job(job: Any, request: LaunchRequest, options: LaunchOptions, placement: Placement) -> None:
    """What runs on a TPU VM: a Keras job (trainplan's worker under TPUStrategy), or the user's own script under
    torch_xla for ``transformer`` / ``torch`` jobs — trainplan's torch worker does not run on XLA."""
    if request.target is not Target.SKYPILOT:
        raise SpecError(f"{request.target.value} cannot run this plan: the option is a TPU slice, which runs as a Cloud "
                        f"TPU VM; use --to skypilot", field="--to")  # fmt: skip
    if job.kind is JobKind.TABULAR:
        raise SpecError("tabular jobs do not run on TPUs (no GBDT library trains there)", field="kind")
    if job.kind is JobKind.KERAS and options.script is None and placement.hosts > 1:
        raise SpecError(f"{placement.instance} spans {placement.hosts} TPU VM hosts; trainplan's Keras worker runs "
                        f"TPUStrategy on one host (TPUClusterResolver(tpu='local')): pick a single-host slice "
                        f"(tpu-v5litepod-8, tpu-v5p-8, tpu-v6e-8, tpu-v4-8) or give --script", field="--instance")  # fmt: skip
    if job.kind in (JobKind.TRANSFORMER, JobKind.TORCH) and options.script is None:
        raise SpecError(f"kind: {job.kind.value} on a TPU runs your own torch_xla script: give --script TRAIN.py "
                        f"(trainplan's torch worker does not run on XLA: torch_xla has no build for torch 2.13)",
                        field="--script")  # fmt: skip

