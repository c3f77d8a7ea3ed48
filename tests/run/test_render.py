"""Launch = render + submit: every rendered command and file, checked without launching."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TABULAR_JOB, TORCH_JOB

from trainplan.run import (
    LaunchSpec,
    RunConfig,
    deepspeed_config,
    render,
    render_dask,
    render_deepspeed_multinode,
    render_ray,
    render_skypilot,
    render_torchrun_multinode,
    submit,
)
from trainplan.run.config import CONFIG_ENV
from trainplan.strategies import Strategy


def config(tmp_path: Path, strategy: str = "ddp", world: int = 2, accelerator: str = "cpu", **kw) -> RunConfig:
    ds = None
    if Strategy(strategy).engine.value == "deepspeed":
        ds = deepspeed_config(
            Strategy(strategy), micro_batch=4, grad_accum=2, world_size=world, precision=kw.get("precision", "fp32"),
            accelerator=accelerator,
        )
    base = dict(
        job=kw.pop("job", TORCH_JOB),
        out_dir=str(tmp_path / "run"),
        strategy=strategy,
        world_size=world,
        accelerator=accelerator,
        threads_per_process=kw.pop("threads", 1),
        total_steps=10,
        grad_accum=2,
        micro_batch=4,
        global_batch=4 * 2 * world,
        deepspeed=ds,
    )
    return RunConfig(**{**base, **kw})


def test_single_process_runs_the_worker_directly(tmp_path) -> None:
    spec = render(config(tmp_path, "single", 1, threads=2))
    run_json = str(tmp_path / "run" / "run.json")
    assert spec.argv == [sys.executable, "-m", "trainplan.run.worker", run_json]
    assert spec.env[CONFIG_ENV] == run_json and spec.env["OMP_NUM_THREADS"] == "2"
    assert set(spec.files) == {Path(run_json)}
    assert RunConfig.from_json(json.loads(spec.files[Path(run_json)])) == config(tmp_path, "single", 1, threads=2)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp-grad-op", "zero1", "zero2", "zero3", "zero2-offload"])
def test_multi_process_strategies_run_under_torchrun(tmp_path, strategy) -> None:
    spec = render(config(tmp_path, strategy), max_restarts=3)
    assert spec.argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in spec.argv and "--nproc-per-node=2" in spec.argv and "--max-restarts=3" in spec.argv
    assert spec.argv[-3:] == ["--module", "trainplan.run.worker", str(tmp_path / "run" / "run.json")]
    assert isinstance(spec.argv, list) and all(isinstance(a, str) for a in spec.argv)  # an argument list, never a shell string
    has_ds = Strategy(strategy).engine.value == "deepspeed"
    assert (tmp_path / "run" / "ds_config.json" in spec.files) == has_ds


def test_one_device_offload_still_uses_torchrun(tmp_path) -> None:
    spec = render(config(tmp_path, "zero3-offload", 1))
    assert "--nproc-per-node=1" in spec.argv


def test_user_script_gets_the_launcher_and_its_arguments(tmp_path) -> None:
    script = tmp_path / "train.py"
    spec = render(config(tmp_path, "ddp"), script=script, script_args=("--lr", "0.1"))
    assert spec.argv[-3:] == [str(script), "--lr", "0.1"]
    assert "--module" not in spec.argv


@pytest.mark.parametrize(
    "strategy,stage,opt_off,param_off",
    [("zero1", 1, False, False), ("zero2", 2, False, False), ("zero3", 3, False, False),
     ("zero2-offload", 2, True, False), ("zero3-offload", 3, True, True)],
)
def test_deepspeed_config_per_strategy(strategy, stage, opt_off, param_off) -> None:
    cfg = deepspeed_config(Strategy(strategy), micro_batch=4, grad_accum=3, world_size=2, precision="fp32", accelerator="cpu")
    zero = cfg["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == opt_off and ("offload_param" in zero) == param_off
    assert cfg["train_batch_size"] == 4 * 3 * 2 and cfg["gradient_accumulation_steps"] == 3
    assert cfg["zero_force_ds_cpu_optimizer"] is False  # the torch optimizer: no cpu_adam compilation
    assert "bf16" not in cfg and "fp16" not in cfg


def test_gpu_render_uses_nccl_and_half_precision(tmp_path) -> None:
    cfg = config(tmp_path, "zero2", 8, accelerator="cuda", precision="bf16", threads=4)
    assert cfg.dist_backend == "nccl"
    spec = render(cfg)
    assert "--nproc-per-node=8" in spec.argv and spec.env["OMP_NUM_THREADS"] == "4"
    ds = json.loads(spec.files[tmp_path / "run" / "ds_config.json"])
    assert ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"]["stage"] == 2
    fp16 = deepspeed_config(Strategy.ZERO3, micro_batch=1, grad_accum=1, world_size=8, precision="fp16", accelerator="cuda")
    assert fp16["fp16"]["enabled"] and fp16["fp16"]["loss_scale"] == 0  # dynamic loss scaling
    assert config(tmp_path, "ddp", 2).dist_backend == "gloo"


def test_tabular_threads_are_per_fit(tmp_path) -> None:
    cfg = config(tmp_path, "single", 1, job=TABULAR_JOB, threads=8, parallel_fits=2, threads_per_fit=4)
    assert render(cfg).env["OMP_NUM_THREADS"] == "4"


def test_torchrun_multinode(tmp_path) -> None:
    spec = render_torchrun_multinode(config(tmp_path, "fsdp", 8), nnodes=4, node_rank=2, master_addr="10.0.0.1")
    for arg in ("--nnodes=4", "--node-rank=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "--nproc-per-node=8"):
        assert arg in spec.argv
    assert "--standalone" not in spec.argv
    with pytest.raises(ValueError):
        render_torchrun_multinode(config(tmp_path), nnodes=2, node_rank=2, master_addr="h")


def test_deepspeed_launcher_with_hostfile(tmp_path) -> None:
    spec = render_deepspeed_multinode(
        config(tmp_path, "zero3", 8), hosts={"worker-1": 8, "worker-2": 8}, master_addr="worker-1", master_port=29600
    )
    assert spec.argv[:7] == ["deepspeed", "--hostfile", str(tmp_path / "run" / "hostfile"), "--master_addr", "worker-1", "--master_port", "29600"]
    assert spec.files[tmp_path / "run" / "hostfile"] == "worker-1 slots=8\nworker-2 slots=8\n"
    assert f"{CONFIG_ENV}=" in spec.files[Path(".deepspeed_env")]
    assert json.loads(spec.files[tmp_path / "run" / "ds_config.json"])["zero_optimization"]["stage"] == 3


def test_ray_driver(tmp_path) -> None:
    spec = render_ray(config(tmp_path, "ddp", 4, accelerator="cuda"))
    source = spec.files[tmp_path / "run" / "ray_driver.py"]
    ast.parse(source)
    assert "TorchTrainer" in source and "ScalingConfig(num_workers=4, use_gpu=True)" in source
    assert spec.argv == ["python", str(tmp_path / "run" / "ray_driver.py")]


def test_dask_driver_for_xgboost(tmp_path) -> None:
    spec = render_dask(config(tmp_path, "single", 1, job=TABULAR_JOB), scheduler="tcp://sched:8786")
    source = spec.files[tmp_path / "run" / "dask_driver.py"]
    ast.parse(source)
    assert "xgb.dask.train" in source and "import xgboost.dask" in source and "tcp://sched:8786" in source
    with pytest.raises(ValueError):
        render_dask(config(tmp_path, "single", 1, job={**TABULAR_JOB, "library": "lightgbm"}), scheduler="x")


@pytest.mark.parametrize("nodes", [1, 2])
def test_skypilot_task(tmp_path, nodes) -> None:
    spec = render_skypilot(config(tmp_path, "zero2", 8), job_file="job.yaml", accelerators="A100:8", nodes=nodes, infra="aws", use_spot=True)
    task = yaml.safe_load(spec.files[tmp_path / "run" / "sky_task.yaml"])
    assert task["num_nodes"] == nodes
    assert task["resources"] == {"accelerators": "A100:8", "infra": "aws", "use_spot": True}
    if nodes == 1:
        assert task["run"].strip() == f"trainplan run job.yaml --out {tmp_path / 'run'} --strategy zero2 --devices 8"
    else:
        assert "$SKYPILOT_NODE_RANK" in task["run"] and "--nnodes=2" in task["run"] and "--nproc-per-node=8" in task["run"]
    assert spec.argv[:3] == ["sky", "launch", "-c"]


def test_submit_writes_files_and_returns_the_exit_code(tmp_path) -> None:
    marker = tmp_path / "files" / "hello.txt"
    code = "import os,sys; print(open(os.environ['F']).read()); sys.exit(4)"
    spec = LaunchSpec(argv=[sys.executable, "-c", code], env={"F": str(marker)}, files={marker: "hi there"})
    polls: list[int] = []
    rc = submit(spec, log_path=tmp_path / "log.txt", poll=lambda: polls.append(1), poll_interval_s=0.01)
    assert rc == 4 and polls
    log = (tmp_path / "log.txt").read_text()
    assert log.startswith("$ ") and "hi there" in log
