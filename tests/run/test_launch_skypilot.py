"""`trainplan launch --to skypilot`: the rendered task YAML, parsed by SkyPilot's own parser
(`sky.Task.from_yaml`) — resources, nodes, the checkpoint bucket mount, setup and run — without a cloud account.

SkyPilot checks an instance type against its catalog, which it downloads on first use; the test gives it
a local catalog file (SkyPilot's v8 column layout) made from trainplan's own catalog rows, so nothing is
fetched.  SkyPilot pins an older click than Hugging Face's hub wants, so CI installs it in its own
environment and names its interpreter in $TRAINPLAN_SKYPILOT_PYTHON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml
from conftest import write_job
from launch_support import render_to

from trainplan.catalog import get_catalog
from trainplan.cli.common import example_path
from trainplan.errors import SpecError
from trainplan.run.targets.skypilot import SKY_ACCELERATORS
from trainplan.run.targets.wheel import installed_wheel

PARSE = r"""
import json, sys
import sky
out = []
for path in sys.argv[1:]:
    task = sky.Task.from_yaml(path)
    res = []
    for r in task.resources:
        res.append({"cloud": str(r.cloud) if r.cloud else None, "instance_type": r.instance_type,
                    "accelerators": r.accelerators, "use_spot": r.use_spot})
    out.append({"name": task.name, "num_nodes": task.num_nodes, "resources": res, "workdir": task.workdir,
                "storage": {k: {"name": v.name, "mode": str(v.mode)} for k, v in task.storage_mounts.items()},
                "setup": task.setup, "run": task.run, "envs": dict(task.envs)})
print(json.dumps(out))
"""


def sky_python() -> str:
    explicit = os.environ.get("TRAINPLAN_SKYPILOT_PYTHON")
    if explicit:
        return explicit
    if find_spec("sky") is not None:
        return sys.executable
    if os.environ.get("CI"):
        pytest.fail("SkyPilot is not installed: .ci/run installs it and sets TRAINPLAN_SKYPILOT_PYTHON")
    pytest.skip("SkyPilot is not installed here (pip install skypilot, or set TRAINPLAN_SKYPILOT_PYTHON)")


def local_sky_catalog(home: Path) -> None:
    """SkyPilot's AWS catalog file, from trainplan's catalog rows (instance, accelerator, count, vCPUs, RAM, prices)."""
    rows = ["InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"]
    for i in get_catalog().instances:
        if i.cloud == "aws":
            acc = SKY_ACCELERATORS.get(i.accelerator or "", "")
            rows.append(f"{i.name},{acc},{i.accelerator_count if acc else ''},{i.vcpus},{i.ram_gib},,"
                        f"{i.price_usd_per_h},{i.spot_price_usd_per_h or ''},{i.region},{i.region}a")  # fmt: skip
    path = home / ".sky" / "catalogs" / "v8" / "aws" / "vms.csv"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(rows) + "\n")


def parse(tmp_path: Path, *tasks: Path) -> list[dict]:
    home = tmp_path / "home"
    local_sky_catalog(home)
    env = {**os.environ, "HOME": str(home), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    proc = subprocess.run([sky_python(), "-c", PARSE, *map(str, tasks)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_skypilot_parses_the_rendered_tasks(tmp_path: Path) -> None:
    ref, _ = render_to(example_path("llama7b-sft.yaml"), "skypilot", tmp_path / "ref", gpu="A100-80GB", gpus=4, strategy="zero2")
    spot_job = write_job(tmp_path / "spot.yaml", yaml.safe_load(example_path("llama7b-sft.yaml").read_text()),
                         constraints={"spot": True, "clouds": ["aws"]})  # fmt: skip
    multi, rendered = render_to(spot_job, "skypilot", tmp_path / "multi", instance="p4de.24xlarge", nodes=2, strategy="zero3")
    a, b = parse(tmp_path, ref.out / "task.yaml", multi.out / "task.yaml")

    # the reference case: 1 node with 4 A100-80GB on any cloud the job allows, ZeRO-2 through the rendered torchrun
    assert a["num_nodes"] == 1 and a["workdir"] == str(ref.out)
    assert sorted(r["cloud"] for r in a["resources"]) == ["AWS", "Azure", "GCP"]
    assert all(r["accelerators"] == {"A100-80GB": 4} and not r["use_spot"] for r in a["resources"])
    assert a["storage"] == {"/checkpoints": {"name": "trainplan-llama7b-sft-ckpt", "mode": "StorageMode.MOUNT"}}
    wheel, _ = installed_wheel()  # trainplan is not on the package index: the task carries a wheel of this one
    assert a["setup"].strip() == f"pip install './{wheel}[torch,deepspeed]'" and (ref.out / wheel).is_file()
    assert "--standalone" in a["run"] and "--nproc-per-node=4" in a["run"] and a["run"].rstrip().endswith("trainplan.run.worker run.json")
    assert json.loads((ref.out / "run.json").read_text())["out_dir"] == "/checkpoints/llama7b-sft"  # resumes from the bucket
    assert json.loads((ref.out / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2

    # two spot nodes of the plan's instance: node rank and rendezvous host from SkyPilot's variables; a managed job
    assert b["num_nodes"] == 2
    assert b["resources"] == [{"cloud": "AWS", "instance_type": "p4de.24xlarge", "accelerators": {"A100-80GB": 8}, "use_spot": True}]
    assert "--node-rank=${SKYPILOT_NODE_RANK}" in b["run"] and "--rdzv-endpoint=${MASTER_ADDR}:29500" in b["run"]
    assert 'MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n 1)' in b["run"] and "--nnodes=2" in b["run"]
    assert rendered.commands[0].argv[:3] == ("sky", "jobs", "launch")


def test_a_cloud_the_plan_did_not_consider(tmp_path: Path) -> None:
    job = example_path("llama7b-sft.yaml")
    with pytest.raises(SpecError, match="--cloud: lambda was not considered by the plan"):
        render_to(job, "skypilot", tmp_path / "a", gpu="A100-80GB", gpus=4, strategy="zero2", options={"cloud": "lambda"})
    with pytest.raises(SpecError, match="--cloud: the option is aws:p4de.24xlarge on aws"):
        render_to(job, "skypilot", tmp_path / "b", instance="p4de.24xlarge", strategy="zero2", options={"cloud": "gcp"})
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    plan, _ = render_to(job, "skypilot", tmp_path / "c", gpu="A100-80GB", gpus=4, strategy="zero2", options={"cloud": "GCP"})
    assert yaml.safe_load((plan.out / "task.yaml").read_text())["resources"]["infra"] == "gcp"


@pytest.mark.slow
def test_the_rendered_setup_installs_this_trainplan_in_a_fresh_environment(tmp_path: Path) -> None:
    """The task's `setup` line, run in a fresh virtual environment from the task's workdir, installs the rendered wheel.

    The fresh environment sees this one's packages through a .pth file (the dependencies: no index is needed), but
    not trainplan's editable install, so `import trainplan` works only if the wheel was installed.
    """
    plan, _ = render_to(example_path("llama7b-sft.yaml"), "skypilot", tmp_path / "task", gpu="A100-80GB", gpus=4,
                        strategy="zero2")  # fmt: skip
    task = yaml.safe_load((plan.out / "task.yaml").read_text())
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    import sysconfig

    (Path(purelib) / "base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # the venv's own (older) setuptools would shadow this environment's, which torch's requirement needs
    subprocess.run([str(py), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], capture_output=True, timeout=120)
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "PIP_NO_INDEX": "1",
           "PYTHONPATH": "", "VIRTUAL_ENV": str(venv)}  # fmt: skip
    setup = subprocess.run(["bash", "-c", task["setup"]], cwd=plan.out, env=env, capture_output=True, text=True, timeout=300)
    assert setup.returncode == 0, setup.stderr[-2000:]
    where = subprocess.run([str(py), "-c", "import trainplan, trainplan.run.worker; print(trainplan.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()).is_relative_to(Path(purelib))  # the wheel's copy, not this checkout
    assert (venv / "bin" / "trainplan").is_file()  # the console script came with it


def test_nodes_run_the_interpreter_named_with_python(tmp_path: Path) -> None:
    plan, rendered = render_to(example_path("llama7b-sft.yaml"), "slurm", tmp_path / "slurm", gpu="A100-80GB", gpus=4,
                               strategy="zero2", options={"partition": "gpu", "python": "/opt/env/bin/python3"})  # fmt: skip
    script = (plan.out / "job.sbatch").read_text()
    assert "srun --nodes=1 --ntasks-per-node=1 /opt/env/bin/python3 -c 'import trainplan'" in script
    assert "/opt/env/bin/python3 -m torch.distributed.run" in script and sys.executable not in script
    wheel, data = installed_wheel()
    assert (plan.out / wheel).read_bytes() == data and any(f"pip install '{plan.out / wheel}[torch,deepspeed]'" in n for n in rendered.notes)
    plan, rendered = render_to(example_path("llama7b-sft.yaml"), "torchrun", tmp_path / "tr", gpu="A100-80GB", gpus=4,
                               strategy="zero2", options={"python": "python3.12"})  # fmt: skip
    assert rendered.commands[0].argv[0] == "python3.12"
