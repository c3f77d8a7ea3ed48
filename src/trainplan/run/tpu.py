"""Render a run on a Cloud TPU VM: the SkyPilot task and the launch command per framework.

Render only (nothing here is submitted): :func:`tpu_launch` gives the argument
list and environment that start training on every host of the slice, and
:func:`skypilot_tpu_task` the SkyPilot task YAML (as a mapping) that creates the
TPU VM and runs it there.  Frameworks:

* ``torch_xla`` — PyTorch/XLA on the PJRT runtime: ``PJRT_DEVICE=TPU python
  train.py`` (PyTorch/XLA docs, "PJRT runtime");
* ``jax`` — ``python train.py`` on every host; ``jax.distributed.initialize()``
  finds the slice on a TPU VM (JAX docs, "Multi-host and multi-process");
* ``tf`` — Keras / TensorFlow with ``tf.distribute.TPUStrategy`` over
  ``TPUClusterResolver(tpu="local")`` (TensorFlow "Use TPUs" guide); what a
  ``kind: keras`` plan's ``ddp`` maps to on a TPU.
"""

from __future__ import annotations

from typing import Any

from trainplan.errors import SpecError

FRAMEWORKS = ("torch_xla", "jax", "tf")

#: TPU VM software images by accelerator (Google Cloud TPU docs, "TPU software versions"; recalled, not re-read here).
RUNTIME_VERSIONS = {"TPUv4": "tpu-ubuntu2204-base", "TPUv5e": "v2-alpha-tpuv5-lite"}


def tpu_launch(framework: str, script: str, args: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """The command (argument list) and environment that start ``script`` on a TPU VM host."""
    if framework not in FRAMEWORKS:
        raise SpecError(f"must be one of {', '.join(FRAMEWORKS)}, got {framework!r}", field="--framework")
    env = {"PJRT_DEVICE": "TPU"} if framework == "torch_xla" else {}
    if framework == "tf":
        env["TRAINPLAN_TF_STRATEGY"] = "TPUStrategy"
    return ["python3", script, *args], env


def skypilot_tpu_task(
    *,
    name: str,
    instance: str,
    accelerator_id: str,
    nodes: int,
    framework: str,
    script: str,
    setup: str = "",
) -> dict[str, Any]:
    """A SkyPilot task for a TPU VM slice: ``resources.accelerators`` is the slice name (``tpu-v5litepod-8``),
    ``accelerator_args.runtime_version`` its software image; SkyPilot runs ``run`` on every host of the slice."""
    if not instance.startswith("tpu-"):
        raise SpecError(f"{instance} is not a TPU slice (tpu-v4-8, tpu-v5litepod-8, ...)", field="--instance")
    argv, env = tpu_launch(framework, script)
    runtime = RUNTIME_VERSIONS.get(accelerator_id)
    if runtime is None:
        raise SpecError(f"no TPU VM software version known for {accelerator_id}", field="--instance")
    task: dict[str, Any] = {
        "name": name,
        "resources": {"accelerators": instance, "accelerator_args": {"runtime_version": runtime}},
        "num_nodes": nodes,
        "envs": env,
        "run": " ".join(argv),
    }
    if setup:
        task["setup"] = setup
    return task
