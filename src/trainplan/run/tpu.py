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

``trainplan launch --to skypilot`` uses these for a TPU option
(run/targets/skypilot.py): the software image per chip and framework
(:func:`runtime_version`, from Google's table), the slice's hosts
(:func:`slice_hosts`), and the command — trainplan's Keras worker, or the
user's torch_xla script.
"""

from __future__ import annotations

from typing import Any

from trainplan.errors import SpecError

FRAMEWORKS = ("torch_xla", "jax", "tf")

#: TPU VM software images (runtime versions) for PyTorch and JAX, by chip.  Google Cloud "TPU software versions",
#: https://docs.cloud.google.com/tpu/docs/runtimes (read via the search tool 2026-12-03), table "PyTorch and JAX":
#: Trillium (v6e) v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v4 and older tpu-ubuntu2204-base.
#: SkyPilot's own defaults (sky/resources.py, skypilot 0.14.1) differ for v5e: v2-alpha-tpuv5 for every tpu-v5*.
RUNTIME_VERSIONS = {
    "TPUv4": "tpu-ubuntu2204-base",
    "TPUv5e": "v2-alpha-tpuv5-lite",
    "TPUv5p": "v2-alpha-tpuv5",
    "TPUv6e": "v2-alpha-tpuv6e",
}

#: TensorFlow's TPU VM images are named ``tpu-vm-tf-x.y.z[-pod][-{device_api}]`` (same page, "TensorFlow"):
#: ``-pod`` on a multi-host slice; from TensorFlow 2.15.0 a device API is required, ``-pjrt`` (or ``-se``);
#: v6e, v5e and v5p support TensorFlow 2.15.0 and later, v4 with TensorFlow >= 2.10.1 follows the v2/v3 naming.
#: 2.16.1 is the newest version the page lists by name (``tpu-vm-tf-2.16.1-pjrt``); TensorFlow 2.16 ships Keras 3.
TF_TPU_VERSION = "2.16.1"

#: Chips per TPU VM host (Google's TPU docs): v4 4 (https://docs.cloud.google.com/tpu/docs/v4: v4-8 is one host
#: of 4 chips), v5e 8 ("Chips per host 8"; slice 4x4 = 16 chips on 2 hosts, https://docs.cloud.google.com/tpu/docs/v5e),
#: v5p 4 ("4-chip VM"; 2x2x2 = 8 chips on 2 hosts, https://docs.cloud.google.com/tpu/docs/v5p), v6e 8
#: ("Chips per host 8", https://docs.cloud.google.com/tpu/docs/v6e).
CHIPS_PER_HOST = {"TPUv4": 4, "TPUv5e": 8, "TPUv5p": 4, "TPUv6e": 8}


def slice_hosts(accelerator_id: str, chips: int) -> int:
    """TPU VM hosts of a slice of ``chips`` chips (slices smaller than one host use part of one)."""
    per_host = CHIPS_PER_HOST.get(accelerator_id)
    if per_host is None:
        raise SpecError(f"no chips-per-host figure for {accelerator_id}", field="--instance")
    return max(1, -(-chips // per_host))


def runtime_version(accelerator_id: str, framework: str, *, hosts: int = 1) -> str:
    """The TPU VM software image for ``framework`` on a slice of ``accelerator_id`` chips spread over ``hosts`` hosts."""
    if framework == "tf":
        if accelerator_id not in RUNTIME_VERSIONS:
            raise SpecError(f"no TPU VM software version known for {accelerator_id}", field="--instance")
        return f"tpu-vm-tf-{TF_TPU_VERSION}{'-pod' if hosts > 1 else ''}-pjrt"
    runtime = RUNTIME_VERSIONS.get(accelerator_id)
    if runtime is None:
        raise SpecError(f"no TPU VM software version known for {accelerator_id}", field="--instance")
    return runtime


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
    runtime = runtime_version(accelerator_id, framework)
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
