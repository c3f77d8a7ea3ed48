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
    assert a["setup"].strip() == "pip install 'trainplan[torch,deepspeed]'"
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
