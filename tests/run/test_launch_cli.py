"""`trainplan launch` on the command line: what it prints and writes, `--to local` as `trainplan run`,
Horovod's rendering, and bad input — one `error:` line naming the option, exit code 2, nothing written."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from conftest import TABULAR_JOB, write_job
from launch_support import free_port

from trainplan.cli.common import example_path
from trainplan.cli.main import main

LLAMA = str(example_path("llama7b-sft.yaml"))


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, err: str, starts: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {starts}"), err
    assert "Traceback" not in err


def test_render_prints_files_and_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ds"
    code, stdout, err = cli(capsys, "launch", LLAMA, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2",
                            "--to", "deepspeed", "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert "llama7b-sft on 4xA100-80GB, zero2, 1 node(s) × 4 process(es) on cuda" in err
    for name in ("hostfile", "ds_config.json", "run.json", "job.yaml", "launch.json", "deepspeed_env"):
        assert f"{out / name}\n" in stdout and (out / name).exists()
    command = [ln for ln in stdout.splitlines() if "deepspeed.launcher.runner" in ln]
    assert len(command) == 1
    assert shlex.split(command[0]) == json.loads((out / "launch.json").read_text())["commands"][0]["argv"]


@pytest.mark.parametrize(
    "args,starts",
    [
        (["--to", "dask", "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2"], "--to: dask cannot run this plan: Dask runs tabular jobs"),
        (["--to", "slurm", "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2"], "--partition: SLURM needs a partition"),
        (["--to", "skypilot", "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2", "--cloud", "lambda"], "--cloud: lambda was not considered"),
        (["--to", "deepspeed", "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "fsdp"], "--to: deepspeed cannot run this plan"),
        (["--to", "torchrun", "--gpu", "A100-80GB", "--gpus", "8", "--nodes", "2", "--strategy", "zero3"], "--master-addr: torchrun on 2 nodes"),
        (["--to", "torchrun", "--option", "100000"], "--option: the plan has"),
        (["--to", "torchrun", "--option", "2", "--nodes", "4"], "--nodes: applies to hardware named with --gpu"),
        (["--to", "torchrun", "--gpu", "A100-80GB", "--gpus", "1", "--strategy", "ddp"], "--strategy: the plan rejects 1xA100-80GB"),
        (["--to", "horovod", "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2"], "--to: horovod cannot run this plan: Horovod is data parallel"),
        (["--to", "mesos", "--option", "1"], "--to: must be one of local, torchrun"),
        (["--to", "local", "--gpu", "A100-80GB"], "--gpu: --to local runs on this machine"),
    ],
)
def test_a_target_that_cannot_run_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], starts: str) -> None:
    out = tmp_path / "out"
    code, _, err = cli(capsys, "launch", LLAMA, *args, "--out", str(out))
    one_error(code, err, starts)
    assert not out.exists()  # nothing rendered half-way


def test_hostfile_with_fewer_slots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu-node-1 slots=2\n")
    code, _, err = cli(capsys, "launch", LLAMA, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2", "--to", "deepspeed",
                       "--hostfile", str(hostfile), "--out", str(tmp_path / "out"))  # fmt: skip
    one_error(code, err, "--hostfile: gpu-node-1 has 2 slot(s); the plan needs 4 per node")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("target,address", [("ray", "127.0.0.1:{port}"), ("dask", "tcp://127.0.0.1:{port}")])
def test_unreachable_cluster_address(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, address: str) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB)
    addr = address.format(port=free_port())  # nothing listens there
    code, _, err = cli(capsys, "launch", str(job), "--to", target, "--cpus", "2", "--address", addr, "--submit", "--out", str(tmp_path / "out"))
    one_error(code, err, f"--address: cannot reach the {target} cluster at {addr}")
    assert not (tmp_path / "out").exists()


def test_existing_out_is_not_clobbered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    # the reference configuration (4 x A100-80GB, ZeRO-2): a data-parallel option torchrun runs
    hw = ("--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2")
    code, _, err = cli(capsys, "launch", LLAMA, *hw, "--to", "torchrun", "--out", str(out))
    one_error(code, err, "--out:")
    code, _, err = cli(capsys, "launch", LLAMA, *hw, "--to", "torchrun", "--out", str(out), "--overwrite")
    one_error(code, err, "--overwrite:")
    assert (out / "notes.txt").read_text() == "mine"


def test_horovod_renders_horovodrun(tmp_path: Path, torch_job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "launch", str(torch_job), "--gpu", "A100-80GB", "--gpus", "8", "--strategy", "ddp", "--to", "horovod",
                       "--out", str(tmp_path / "none"))  # fmt: skip
    one_error(code, err, "--script: Horovod runs your Horovod script")
    script = tmp_path / "train_hvd.py"
    script.write_text("import horovod.torch as hvd\nhvd.init()\n")
    out = tmp_path / "hvd"
    code, _, err = cli(capsys, "launch", str(torch_job), "--gpu", "A100-80GB", "--gpus", "8", "--strategy", "ddp", "--to", "horovod",
                       "--script", str(script), "--script-arg=--epochs=1", "--horovod", "mpi", "--out", str(out), "--json")  # fmt: skip
    assert code == 0, err
    argv = json.loads((out / "launch.json").read_text())["commands"][0]["argv"]
    assert argv[:6] == ["horovodrun", "-np", "8", "-H", "localhost:8", "--mpi"]
    assert argv[-2:] == [str(script.resolve()), "--epochs=1"]


@pytest.mark.slow
def test_local_is_trainplan_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB)
    code, launched, err = cli(capsys, "launch", str(job), "--to", "local", "--out", str(tmp_path / "a"), "--json")
    assert code == 0, err
    code, ran, err = cli(capsys, "run", str(job), "--out", str(tmp_path / "b"), "--json")
    assert code == 0, err
    a, b = json.loads(launched.splitlines()[-1]), json.loads(ran.splitlines()[-1])
    assert a["status"] == b["status"] == "completed"
    for key in ("kind", "strategy", "devices", "accelerator", "steps"):
        assert a[key] == b[key]
    assert a["measured"]["final_loss"] == pytest.approx(b["measured"]["final_loss"], rel=1e-9)  # the same training


def test_rich_markup_in_a_path_is_printed_as_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x[/bold][red]"
    code, stdout, err = cli(capsys, "launch", LLAMA, "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2",
                            "--to", "torchrun", "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert f"files in {out}" in " ".join(err.split())
    assert "Traceback" not in err and (out / "run.json").exists()


def test_negative_checkpoint_minutes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "run", LLAMA, "--checkpoint-minutes", "-1", "--out", str(tmp_path / "r"))
    one_error(code, err, "Invalid value for '--checkpoint-minutes'")
    assert not (tmp_path / "r").exists()


def test_a_model_parallel_option_is_refused_not_rendered_as_data_parallel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The 405B plan's options split the model (tensor / pipeline parallel); torchrun runs trainplan's data-parallel
    worker, so it must say so (and name the target that renders layouts) instead of rendering the option's strategy
    without its layout."""
    from trainplan.planner.core import plan_job
    from trainplan.spec import load_job

    job = str(example_path("llama3-405b-pretrain.yaml"))
    plan = plan_job(load_job(job), hints=False)
    n = next(i + 1 for i, e in enumerate(plan.options) if e.hardware.layout.model_parallel)
    code, out, err = cli(capsys, "launch", job, "--option", str(n), "--to", "torchrun", "--out", str(tmp_path / "o"))
    one_error(code, err, "--option:")
    assert "torchrun does not run" in err and "--to torchtitan or megatron renders it" in err and "tp" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("target", ["dask", "ray"])
def test_catboost_is_refused_by_the_cluster_engines(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str) -> None:
    """Neither Dask nor Ray Train has a CatBoost trainer: one line that says where it runs instead, nothing written."""
    job = write_job(tmp_path / "job.yaml", TABULAR_JOB, library="catboost")
    code, _, err = cli(capsys, "launch", str(job), "--to", target, "--cpus", "2", "--out", str(tmp_path / "o"))
    one_error(code, err, "--to:")
    assert "CatBoost" in err and "--to local" in err
    assert not (tmp_path / "o").exists()
