"""`trainplan launch --to deepspeed`: the DeepSpeed launcher with the rendered hostfile and DeepSpeed JSON.

The reference case (LLaMA-7B full fine-tuning on 4×A100-80GB with ZeRO-2) is rendered and checked; a
tiny job rehearsed on CPUs (2 slots) really runs under the launcher: two processes, ZeRO-2 over gloo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launch_support import free_port, logs, processes, records, render_to

from trainplan.cli.common import example_path
from trainplan.errors import SpecError


def test_reference_llama7b_zero2_on_4xa100(tmp_path: Path) -> None:
    plan, rendered = render_to(example_path("llama7b-sft.yaml"), "deepspeed", tmp_path / "ds",
                               gpu="A100-80GB", gpus=4, strategy="zero2")  # fmt: skip
    out = plan.out
    assert (out / "hostfile").read_text() == "localhost slots=4\n"
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["zero_optimization"] == {"stage": 2, "reduce_bucket_size": 200_000_000, "allgather_bucket_size": 200_000_000}
    assert ds["bf16"] == {"enabled": True}  # A100 has bf16; the job asks for it
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] * 4 == 128
    run = json.loads((out / "run.json").read_text())
    assert run["world_size"] == 4 and run["accelerator"] == "cuda" and run["deepspeed"] == ds
    (cmd,) = rendered.commands
    argv = list(cmd.argv)
    assert argv[1:3] == ["-m", "deepspeed.launcher.runner"]
    for flag, value in (("--hostfile", str(out / "hostfile")), ("--num_nodes", "1"), ("--num_gpus", "4")):
        assert argv[argv.index(flag) + 1] == value
    assert argv[-3:] == ["--module", "trainplan.run.worker", str(out / "run.json")]
    assert json.loads((out / "launch.json").read_text())["commands"][0]["argv"] == argv


def test_two_nodes_need_a_hostfile_with_enough_slots(tmp_path: Path, torch_job: Path) -> None:
    kw = dict(gpu="A100-80GB", gpus=4, nodes=2, strategy="zero3")
    with pytest.raises(SpecError, match="--hostfile: the plan has 2 nodes"):
        render_to(torch_job, "deepspeed", tmp_path / "a", **kw)
    short = tmp_path / "short"
    short.write_text("node-a slots=4\nnode-b slots=2\n")
    with pytest.raises(SpecError, match=r"--hostfile: node-b has 2 slot\(s\); the plan needs 4 per node"):
        render_to(torch_job, "deepspeed", tmp_path / "b", options={"hostfile": short}, **kw)
    good = tmp_path / "good"
    good.write_text("# two nodes\nnode-a slots=8\nnode-b slots=8\nnode-c slots=8\n")
    plan, rendered = render_to(torch_job, "deepspeed", tmp_path / "c", options={"hostfile": good}, **kw)
    argv = list(rendered.commands[0].argv)
    assert (plan.out / "hostfile").read_text() == "node-a slots=8\nnode-b slots=8\n"  # the plan's two nodes
    assert argv[argv.index("--master_addr") + 1] == "node-a" and "--no_ssh_check" not in argv
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing rendered half-way


@pytest.mark.slow
def test_launcher_runs_two_cpu_processes_with_zero2(tmp_path: Path, torch_job: Path) -> None:
    # H200: the planner's reserved-memory figure for this tiny traced model under ZeRO-1/2 is far too high (118 GiB)
    plan, rendered = render_to(torch_job, "deepspeed", tmp_path / "run", gpu="H200", gpus=2, strategy="zero2",
                               device="cpu", checkpoint_every=6, options={"master_port": free_port()})  # fmt: skip
    assert (plan.out / "hostfile").read_text() == "localhost slots=2\n"
    (cmd,) = rendered.commands
    with processes() as procs:
        procs.start(cmd.argv, env=cmd.env, cwd=cmd.cwd, log=tmp_path / "ds.log")
        codes = procs.wait_all(timeout=300)
    assert codes == [0], logs(tmp_path / "ds.log")
    starts = records(plan.out, "start")
    assert [r["rank"] for r in starts] == [0, 1] and len({r["pid"] for r in starts}) == 2  # two processes really ran
    ends = records(plan.out, "end")
    assert ends[0]["params_sha256"] == ends[1]["params_sha256"]
    assert ends[0]["wrapped_as"] == "DeepSpeedEngine" and ends[0]["zero_stage"] == 2
    result = json.loads((plan.out / "result.json").read_text())
    assert result["status"] == "completed" and result["steps"] == 12


def _exported(env_file: Path, tmp_path: Path) -> dict[str, str]:
    """The values each node's shell ends up with: DeepSpeed's own reading of deepspeed_env (runner.py: split on the
    first '=') and its own quoting (PDSHRunner.add_export), then bash running the export line."""
    import subprocess

    from deepspeed.launcher.multinode_runner import PDSHRunner

    runner = PDSHRunner.__new__(PDSHRunner)
    runner.exports = {}
    for line in env_file.read_text().splitlines(keepends=True):
        key, val = line.split("=", maxsplit=1)
        runner.add_export(key, val)
    exports = "".join(f"export {k}={v}; " for k, v in runner.exports.items())
    script = exports + "".join(f'printf "%s\\0" "${k}"; ' for k in runner.exports)
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    return dict(zip(runner.exports, out.split("\0")))


def test_env_values_reach_the_nodes_unchanged(tmp_path: Path, torch_job: Path) -> None:
    out = tmp_path / "run dir, with spaces"
    plan, rendered = render_to(torch_job, "deepspeed", out, gpu="A100-80GB", gpus=2, strategy="zero2")
    written = dict(line.split("=", 1) for line in (plan.out / "deepspeed_env").read_text().splitlines())
    assert _exported(plan.out / "deepspeed_env", tmp_path) == written


@pytest.mark.parametrize("hostile", ["$(touch pwned)", "`touch pwned`", 'a"b', "a\\b"])
def test_an_out_path_the_nodes_shell_would_expand_is_refused(tmp_path: Path, torch_job: Path, hostile: str) -> None:
    with pytest.raises(SpecError, match=r"--out: .*would be expanded by the shell on every node"):
        render_to(torch_job, "deepspeed", tmp_path / hostile, gpu="A100-80GB", gpus=2, strategy="zero2")
    assert not (tmp_path / "pwned").exists()
