"""``trainplan launch``: the plan handed to the engines people already run.

One module per target, each ``render(plan: LaunchPlan) -> Rendered`` — pure:
files and argument lists, checked before anything is written.
:func:`write_rendered` writes them all or none; :func:`submit` runs the
command (after checking that a cluster address answers).  ``local`` is
``trainplan run``.

=========  =====================================================================
torchrun   :mod:`.torchrun` — one command per node, c10d rendezvous, elastic restarts
deepspeed  :mod:`.deepspeed` — the DeepSpeed launcher, hostfile, ``ds_config.json``
slurm      :mod:`.slurm` — ``job.sbatch`` (srun + torchrun, ``--time`` from the estimate, requeue)
ray        :mod:`.ray` — Ray Train driver (TorchTrainer, XGBoost/LightGBM trainers)
dask       :mod:`.dask` — tabular jobs on Dask (xgboost.dask, LightGBM Dask, joblib)
skypilot   :mod:`.skypilot` — ``task.yaml`` for ``sky launch`` / ``sky jobs launch``
horovod    :mod:`.horovod` — ``horovodrun`` for a Horovod script (rendering only)
torchtitan :mod:`.torchtitan` — ``torchrun -m torchtitan.train``: tensor / pipeline / context / expert parallel
megatron   :mod:`.megatron` — ``torchrun pretrain_gpt.py``: Megatron-LM's arguments for the same layouts
=========  =====================================================================
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from pathlib import Path

from trainplan.run.targets.base import Command, LaunchOptions, LaunchPlan, Placement, Rendered, Target
from trainplan.run.targets.files import LAUNCH_RECORD, write_rendered
from trainplan.run.targets.plan import LaunchRequest, resolve_launch

__all__ = [
    "LAUNCH_RECORD",
    "Command",
    "LaunchOptions",
    "LaunchPlan",
    "LaunchRequest",
    "Placement",
    "Rendered",
    "Target",
    "prepare_launch",
    "render",
    "write_rendered",
]


def _module(target: Target):  # type: ignore[no-untyped-def]
    if target is Target.LOCAL:
        raise ValueError("the local target is `trainplan run` (trainplan.run.execute); it renders nothing")
    return import_module(f"trainplan.run.targets.{target.value}")


def render(plan: LaunchPlan) -> Rendered:
    """The files and commands of ``plan`` for its target (pure; raises on a plan the target cannot run)."""
    rendered = _module(plan.target).render(plan)
    note = rocm_note(plan)
    return replace(rendered, notes=(*rendered.notes, note)) if note else rendered


def rocm_note(plan: LaunchPlan) -> str | None:
    """What an option on AMD GPUs needs beyond the render: the same code runs on a ROCm build of PyTorch, which
    reuses the ``torch.cuda`` interfaces and runs the ``nccl`` backend on RCCL (PyTorch's "HIP (ROCm) semantics"
    notes, docs.pytorch.org/docs/2.13/notes/hip.html), but the torch wheel pip installs by default is the CUDA build."""
    from trainplan.catalog import get_catalog

    gpu = plan.placement.gpu
    acc = get_catalog().accelerators.get(gpu) if gpu else None
    if acc is None or acc.vendor != "amd":
        return None
    if plan.job.kind.value == "keras":  # TensorFlow's ROCm build is its own package (AMD's tensorflow-rocm wheels)
        return (f"{gpu} is an AMD GPU: install TensorFlow's ROCm build (tensorflow-rocm) on the nodes before trainplan; "
                "pip's default tensorflow is the CUDA build. It has not been run by trainplan's tests")
    if plan.is_tabular:  # estimate/tabular.ROCM_LIBRARIES: AMD's ROCm ports, pip packages from its own index
        return (f"{gpu} is an AMD GPU: install AMD's ROCm build of {plan.job.library.value} on the nodes before "
                f"trainplan (pip install amd_{plan.job.library.value} --extra-index-url "
                "https://pypi.amd.com/<rocm-version>/simple, rocm.docs.amd.com ROCm Finance); it keeps the "
                "device='cuda' interface, and has not been run by trainplan's tests")
    return (f"{gpu} is an AMD GPU: install a ROCm build of PyTorch on the nodes before trainplan (PyTorch's ROCm "
            "wheels or AMD's PyTorch container; pip's default torch is the CUDA build). The run takes the same "
            "torch.cuda and nccl (RCCL) paths; it has not been run on ROCm by trainplan's tests, and DeepSpeed's ops "
            "must be built for ROCm where a DeepSpeed strategy is chosen")


def prepare_launch(request: LaunchRequest) -> tuple[LaunchPlan, Rendered]:
    """Resolve the option and render it — every check done, nothing written."""
    run_dir: Path | None = None
    if request.target is Target.SKYPILOT:
        from trainplan.run.targets.skypilot import remote_run_dir
        from trainplan.spec import load_job

        run_dir = remote_run_dir(load_job(request.job_path).name)
    plan = resolve_launch(request, run_dir=run_dir)
    rendered = render(plan)
    if request.target is Target.TORCHTITAN:
        from trainplan.run.targets.torchtitan import checked

        rendered = checked(plan, rendered)
    elif request.target is Target.MEGATRON:
        from trainplan.run.targets.megatron import checked as megatron_checked

        rendered = megatron_checked(plan, rendered)
    return plan, rendered

