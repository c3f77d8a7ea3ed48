"""The public surface of ``trainplan.run`` and ``trainplan.runtime`` is frozen: changing it must be a
deliberate edit of this file (after httpx's tests/test_exported_members.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainplan.run
import trainplan.run.runtime
import trainplan.runtime

RUN_API = [
    "LaunchPlan",
    "LaunchRequest",
    "LaunchSpec",
    "PREEMPTED_EXIT_CODE",
    "RunConfig",
    "RunRequest",
    "RunStatus",
    "RunSummary",
    "WorkerResult",
    "deepspeed_config",
    "Target",
    "execute",
    "prepare_launch",
    "render",
    "submit",
    "write_rendered",
]

RUNTIME_API = ["Context", "FAULT_RANK_ENV", "FAULT_STEP_ENV", "init"]

#: what a training script calls on the context (docs/run.md, "Your own script")
CONTEXT_API = [
    "autocast",
    "backward",
    "barrier",
    "describe_wrapping",
    "distributed",
    "end_of_step",
    "finish",
    "full_model_state",
    "is_main",
    "log_event",
    "param_fingerprint",
    "peak_bytes",
    "pipeline_step",
    "pipelined",
    "resume",
    "save_checkpoint",
    "step",
    "stop_requested",
    "wrap",
]


def test_run_exports_are_frozen() -> None:
    assert sorted(trainplan.run.__all__) == sorted(RUN_API)
    for name in RUN_API:
        assert getattr(trainplan.run, name) is not None, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        trainplan.run.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("trainplan.run.no_such_name did not raise")


def test_runtime_is_the_run_runtime_under_a_stable_name() -> None:
    assert sorted(trainplan.runtime.__all__) == sorted(RUNTIME_API)
    assert sorted(trainplan.run.runtime.__all__) == sorted(RUNTIME_API)
    for name in RUNTIME_API:
        assert getattr(trainplan.runtime, name) is getattr(trainplan.run.runtime, name), name


def test_context_methods_scripts_use() -> None:
    public = sorted(n for n in dir(trainplan.runtime.Context) if not n.startswith("_"))
    assert public == sorted(CONTEXT_API)


def test_importing_trainplan_run_is_light() -> None:
    """The package and its configuration load without torch; names load on first use."""
    code = "import sys, trainplan.run, trainplan.run.config, trainplan.run.results; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("target", ["deepspeed", "skypilot", "torchtitan"])
def test_launch_renders_without_torch(target: str, tmp_path: Path) -> None:
    """Rendering a launch is planning: a laptop or a login node without torch renders every target (torch is
    blocked in the child process, so any import of it fails)."""
    from trainplan.cli.common import example_path

    if target == "torchtitan":
        job = tmp_path / "job.yaml"
        job.write_text(example_path("llama3-405b-pretrain.yaml").read_text().replace("precision: bf16", "precision: fp8"))
        args = ["--gpu", "H100-80GB", "--gpus", "8", "--nodes", "64", "--tp", "8", "--pp", "16", "--strategy", "fsdp",
                "--master-addr", "h0"]  # fmt: skip
    else:
        job = example_path("llama7b-sft.yaml")
        args = ["--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2"]
    code = ("import sys; sys.modules['torch'] = None\n"
            "from trainplan.cli.main import main\n"
            f"sys.exit(main(['launch', {str(job)!r}, '--to', {target!r}, '--out', {str(tmp_path / 'out')!r}, *{args!r}]))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRAINPLAN_TORCHTITAN_PYTHON": "/nonexistent/python"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "out" / "launch.json").is_file()
