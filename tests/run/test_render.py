"""Launch = render + submit: every rendered command and file, checked without launching."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import TABULAR_JOB, TORCH_JOB

from trainplan.run import (
    LaunchSpec,
    RunConfig,
    deepspeed_config,
    render,
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
     ("zero1-offload", 1, True, False), ("zero2-offload", 2, True, False), ("zero3-offload", 3, True, True)],
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


def test_submit_writes_files_and_returns_the_exit_code(tmp_path) -> None:
    marker = tmp_path / "files" / "hello.txt"
    code = "import os,sys; print(open(os.environ['F']).read()); sys.exit(4)"
    spec = LaunchSpec(argv=[sys.executable, "-c", code], env={"F": str(marker)}, files={marker: "hi there"})
    polls: list[int] = []
    rc = submit(spec, log_path=tmp_path / "log.txt", poll=lambda: polls.append(1), poll_interval_s=0.01)
    assert rc == 4 and polls
    log = (tmp_path / "log.txt").read_text()
    assert log.startswith("$ ") and "hi there" in log


# ----------------------------------------------------------------------------- cluster targets (trainplan launch)


@pytest.mark.parametrize("hours,margin,expected", [
    (0.001, 0.25, "0-00:10:00"),  # at least 10 minutes
    (2.2, 0.25, "0-02:45:00"),  # 2.2 h × 1.25 = 165 min
    (30.0, 0.5, "1-21:00:00"),  # days
    (1.0, 0.0, "0-01:00:00"),
])  # fmt: skip
def test_slurm_time_limit(hours, margin, expected) -> None:
    from trainplan.run.targets.slurm import time_limit

    assert time_limit(hours, margin) == expected


def test_hostfile_lines(tmp_path) -> None:
    from trainplan.errors import SpecError
    from trainplan.run.targets.common import read_hostfile

    good = tmp_path / "good"
    good.write_text("# cluster\nnode-a slots=8   # first\n\nnode-b slots=4\n")
    assert read_hostfile(good) == {"node-a": 8, "node-b": 4}
    for text, message in [("node-a\n", "expected 'HOST slots=N'"), ("node-a slots=0\n", "expected"),
                          ("a slots=1\na slots=2\n", "listed twice"), ("# nothing\n", "names no host")]:  # fmt: skip
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(SpecError, match=message):
            read_hostfile(bad)
    with pytest.raises(SpecError, match="--hostfile: cannot read"):
        read_hostfile(tmp_path / "missing")


@pytest.mark.parametrize("address,target,expected", [
    ("10.0.0.5:6379", "ray", ("10.0.0.5", 6379)),
    ("ray://head:10001", "ray", ("head", 10001)),
    ("ray://head", "ray", ("head", 10001)),
    ("http://head:8265", "ray", ("head", 8265)),
    ("head", "ray", ("head", 6379)),
    ("tcp://sched:8786", "dask", ("sched", 8786)),
    ("sched", "dask", ("sched", 8786)),
])  # fmt: skip
def test_cluster_addresses(address, target, expected) -> None:
    from trainplan.run.targets import Target
    from trainplan.run.targets.submit import host_port

    assert host_port(address, Target(target)) == expected


def test_torchrun_on_gpu_nodes_renders_one_command_per_node(tmp_path) -> None:
    from trainplan.cli.common import example_path
    from trainplan.run.targets import LaunchOptions, LaunchRequest, Target, prepare_launch

    request = LaunchRequest(job_path=example_path("llama7b-sft.yaml"), target=Target.TORCHRUN, out=tmp_path / "out",
                            gpu="H100-80GB", gpus=8, nodes=4, strategy="fsdp",
                            options=LaunchOptions(master_addr="10.0.0.1", iface="ens5"))  # fmt: skip
    plan, rendered = prepare_launch(request)
    assert not (tmp_path / "out").exists()  # rendering writes nothing
    assert plan.config.world_size == 32 and plan.config.dist_backend == "nccl" and plan.config.precision.value == "bf16"
    assert [c.where for c in rendered.commands][:1] == ["node 0 of 4 (the rendezvous host)"] and len(rendered.commands) == 4
    for rank, cmd in enumerate(rendered.commands):
        for arg in ("--nnodes=4", f"--node-rank={rank}", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500", "--nproc-per-node=8"):
            assert arg in cmd.argv
        assert cmd.env["NCCL_SOCKET_IFNAME"] == "ens5" and cmd.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert cmd.env["OMP_NUM_THREADS"] == str(plan.placement.cpus_per_node // 8)
