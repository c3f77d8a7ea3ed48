"""`trainplan launch --to skypilot` for a TPU option: the rendered Cloud TPU VM task parsed by SkyPilot's own parser
(`sky.Task.from_yaml`) — the slice name, its software image (`accelerator_args.runtime_version`, `tpu_vm`), one node
per slice (SkyPilot runs `run` on every host of a multi-host slice) and the command per job kind (trainplan's Keras
worker under TPUStrategy; the user's torch_xla script for transformer / torch jobs); every other target refuses a
TPU option in one line, writing nothing.  The Keras worker's TPUStrategy choice is checked with a stand-in `tf`
(no TPU here) and its per-replica batch split under a real two-replica MirroredStrategy on CPU.

SkyPilot looks TPU slices up in its GCP catalog; the test writes a local one (v8 layout) from trainplan's rows,
so nothing is fetched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from conftest import write_job
from launch_support import render_to
from test_launch_skypilot import sky_python

from trainplan.catalog import get_catalog
from trainplan.cli.common import example_path
from trainplan.cli.main import main
from trainplan.errors import SpecError
from trainplan.run.targets.wheel import installed_wheel
from trainplan.run.tpu import CHIPS_PER_HOST, runtime_version, slice_hosts

REPO = Path(__file__).resolve().parents[2]

PARSE = r"""
import json, sys
import sky
out = []
for path in sys.argv[1:]:
    task = sky.Task.from_yaml(path)
    out.append({"num_nodes": task.num_nodes, "run": task.run, "envs": dict(task.envs), "setup": task.setup,
                "resources": [{"cloud": str(r.cloud), "accelerators": r.accelerators, "use_spot": r.use_spot,
                               "accelerator_args": r.accelerator_args} for r in task.resources]})
print(json.dumps(out))
"""


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(REPO)  # the Keras job's model factory (tests.keras.models) imports from the repository root


def sky_parse(tmp_path: Path, *tasks: Path) -> list[dict[str, Any]]:
    home = tmp_path / "skyhome"
    rows = ["InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"]
    for i in get_catalog().instances:  # GCP lists a TPU slice as an accelerator row without an instance type
        if i.name.startswith("tpu-"):
            rows.append(f",{i.name},1,,,{i.name},{i.price_usd_per_h},{i.spot_price_usd_per_h or ''},{i.region},{i.region}-a")
    path = home / ".sky" / "catalogs" / "v8" / "gcp" / "vms.csv"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(rows) + "\n")
    env = {**os.environ, "HOME": str(home), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    proc = subprocess.run([sky_python(), "-c", PARSE, *map(str, tasks)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def keras_job(path: Path, **changes: Any) -> Path:
    base = {"name": "dense-tpu", "kind": "keras", "model": "tests.keras.models:dense",
            "model_args": {"features": 256, "hidden": 1024}, "inputs": [{"shape": [256]}],
            "loss": "sparse_categorical_crossentropy", "micro_batch": 32, "global_batch": 256, "precision": "bf16",
            "steps": 100, "constraints": {"clouds": ["gcp"]}}  # fmt: skip
    return write_job(path, base, **changes)


def reference_job(path: Path, **changes: Any) -> Path:
    """The reference LLaMA-7B fine-tune (global batch 128) with full activation checkpointing, the plan's own hint
    for 16 GiB v5e chips."""
    return write_job(path, yaml.safe_load(example_path("llama7b-sft.yaml").read_text()), activation_checkpointing="full",
                     **changes)  # fmt: skip


def test_slice_hosts_and_runtime_versions() -> None:
    """Google's tables (run/tpu.py): chips per host and the software image per chip and framework."""
    assert [slice_hosts("TPUv4", 4), slice_hosts("TPUv4", 8), slice_hosts("TPUv5e", 8), slice_hosts("TPUv5e", 16)] == [1, 2, 1, 2]
    assert [slice_hosts("TPUv5p", 4), slice_hosts("TPUv5p", 8), slice_hosts("TPUv6e", 8), slice_hosts("TPUv5e", 1)] == [1, 2, 1, 1]
    assert {a: runtime_version(a, "torch_xla") for a in CHIPS_PER_HOST} == {
        "TPUv4": "tpu-ubuntu2204-base", "TPUv5e": "v2-alpha-tpuv5-lite", "TPUv5p": "v2-alpha-tpuv5", "TPUv6e": "v2-alpha-tpuv6e"}  # fmt: skip
    assert runtime_version("TPUv5e", "tf") == "tpu-vm-tf-2.16.1-pjrt"
    assert runtime_version("TPUv4", "tf", hosts=2) == "tpu-vm-tf-2.16.1-pod-pjrt"
    with pytest.raises(SpecError, match="no TPU VM software version known for A100-80GB"):
        runtime_version("A100-80GB", "jax")
    # every TPU slice in the catalog has a chips-per-host figure and a software image
    for i in get_catalog().instances:
        if i.accelerator and i.accelerator.startswith("TPU"):
            assert slice_hosts(i.accelerator, i.accelerator_count) >= 1 and runtime_version(i.accelerator, "jax")


@pytest.mark.slow
def test_skypilot_parses_the_rendered_tpu_tasks(tmp_path: Path) -> None:
    pytest.importorskip("tensorflow")
    keras, keras_out = render_to(keras_job(tmp_path / "k.yaml"), "skypilot", tmp_path / "keras",
                                 instance="tpu-v5litepod-8", strategy="ddp")  # fmt: skip
    script = tmp_path / "train_xla.py"
    script.write_text("import torch_xla  # the user's PyTorch/XLA training script\n")
    ref, ref_out = render_to(reference_job(tmp_path / "r.yaml"), "skypilot", tmp_path / "ref", instance="tpu-v5litepod-8",
                             strategy="fsdp", options={"script": script, "script_args": ("--steps", "10")})  # fmt: skip
    multi, multi_out = render_to(reference_job(tmp_path / "m.yaml", constraints={"clouds": ["gcp"], "spot": True}),
                                 "skypilot", tmp_path / "multi", instance="tpu-v5p-16", strategy="fsdp",
                                 options={"script": script})  # fmt: skip
    k, r, m = sky_parse(tmp_path, keras.out / "task.yaml", ref.out / "task.yaml", multi.out / "task.yaml")

    # Keras: trainplan's worker under TPUStrategy, on TensorFlow's TPU image (single host: no -pod)
    assert k["num_nodes"] == 1
    assert k["resources"] == [{"cloud": "GCP", "accelerators": {"tpu-v5litepod-8": 1}, "use_spot": False,
                               "accelerator_args": {"runtime_version": "tpu-vm-tf-2.16.1-pjrt", "tpu_vm": True}}]  # fmt: skip
    assert k["run"].splitlines()[-1] == "python3 -m trainplan.run.workloads.keras run.json"
    assert k["envs"]["TRAINPLAN_TF_STRATEGY"] == "TPUStrategy" and "PJRT_DEVICE" not in k["envs"]
    # the TF image brings TensorFlow (tensorflow-cpu would replace it): the rendered wheel of trainplan, no extras
    assert k["setup"].strip() == f"pip install ./{installed_wheel()[0]}"
    run_json = json.loads((keras.out / "run.json").read_text())
    assert run_json["world_size"] == 8 and run_json["grad_accum"] == 1  # 8 chips × 32 = the global batch of 256
    assert any("8 TPUv5e chips on 1 TPU VM host" in n for n in keras_out.notes)

    # the reference job: the user's script under torch_xla (PJRT runtime), uploaded with the workdir
    assert r["resources"][0]["accelerators"] == {"tpu-v5litepod-8": 1}
    assert r["resources"][0]["accelerator_args"] == {"runtime_version": "v2-alpha-tpuv5-lite", "tpu_vm": True}
    assert r["envs"]["PJRT_DEVICE"] == "TPU" and r["run"].splitlines()[-1] == "python3 train_xla.py --steps 10"
    assert json.loads((ref.out / "run.json").read_text())["grad_accum"] == 4  # 128 = 8 chips × 4 × 4 micro-steps
    assert (ref.out / "train_xla.py").read_text() == script.read_text()

    # a multi-host slice: still one SkyPilot node (SkyPilot runs `run` on both hosts); spot → a managed job
    assert m["num_nodes"] == 1 and m["resources"][0]["use_spot"] is True
    assert m["resources"][0]["accelerators"] == {"tpu-v5p-16": 1}
    assert m["resources"][0]["accelerator_args"]["runtime_version"] == "v2-alpha-tpuv5"
    assert multi_out.commands[0].argv[:3] == ("sky", "jobs", "launch")
    assert any("8 TPUv5p chips on 2 TPU VM host(s)" in n for n in multi_out.notes)


@pytest.mark.parametrize("target", ["torchrun", "deepspeed", "slurm", "ray", "dask", "horovod"])
def test_other_targets_refuse_a_tpu_option_in_one_line(target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    job = reference_job(tmp_path / "r.yaml")
    code = main(["launch", str(job), "--to", target, "--instance", "tpu-v5litepod-8", "--strategy", "fsdp", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert err == (f"error: --to: {target} cannot run this plan: the option is a TPU slice, which runs as a Cloud TPU VM; "
                   "use --to skypilot")  # fmt: skip


def test_what_cannot_run_on_a_tpu_vm_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = reference_job(tmp_path / "r.yaml")
    cases = [
        (["--to", "skypilot", "--instance", "tpu-v5litepod-8", "--strategy", "fsdp"],
         "error: --script: kind: transformer on a TPU runs your own torch_xla script: give --script TRAIN.py"),
        (["--to", "skypilot", "--instance", "tpu-v5litepod-8", "--strategy", "fsdp", "--cloud", "aws", "--script", __file__],
         "error: --cloud: the option is a TPU slice (gcp:tpu-v5litepod-8); TPU VMs run on gcp, not aws"),
        (["--to", "skypilot", "--instance", "tpu-v5litepod-8", "--strategy", "fsdp", "--device", "cpu"],
         "error: --device: the option is a TPU slice (gcp:tpu-v5litepod-8); --device cpu/cuda rehearses GPU plans"),
        (["--to", "skypilot", "--instance", "tpu-v5litepod-8", "--strategy", "zero2", "--script", __file__],
         "error: --strategy: the plan rejects gcp:tpu-v5litepod-8 with zero2: DeepSpeed does not run on TPUs"),
        (["--to", "local", "--instance", "tpu-v5litepod-8"],
         "error: --instance: --to local runs on this machine, like `trainplan run`; --instance names other hardware"),
    ]  # fmt: skip
    for n, (args, line) in enumerate(cases):
        out = tmp_path / f"out{n}"
        assert main(["launch", str(job), *args, "--out", str(out)]) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.startswith(line) and "\n" not in err, (args, err)
        assert not out.exists()


@pytest.mark.slow
def test_keras_on_a_multi_host_slice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tensorflow")
    job = keras_job(tmp_path / "k.yaml", micro_batch=16)
    out = tmp_path / "out"
    assert main(["launch", str(job), "--to", "skypilot", "--instance", "tpu-v5litepod-16", "--strategy", "ddp", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --instance: tpu-v5litepod-16 spans 2 TPU VM hosts; trainplan's Keras worker runs TPUStrategy on one host")
    assert not out.exists()


# ----------------------------------------------------------------------------- the Keras worker on a TPU VM


class _FakeTF:
    """What make_strategy calls on ``tf``, recorded (there is no TPU here to build a real TPUStrategy on)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        rec = self.calls
        resolver = SimpleNamespace(name="resolver")
        self.distribute = SimpleNamespace(
            cluster_resolver=SimpleNamespace(TPUClusterResolver=lambda tpu: rec.append(("resolver", tpu)) or resolver),
            TPUStrategy=lambda r: rec.append(("TPUStrategy", r)) or "tpu-strategy",
            MultiWorkerMirroredStrategy=lambda: rec.append(("MultiWorkerMirroredStrategy", None)) or "mwms",
            get_strategy=lambda: "default",
        )
        self.config = SimpleNamespace(experimental_connect_to_cluster=lambda r: rec.append(("connect", r)))
        self.tpu = SimpleNamespace(experimental=SimpleNamespace(initialize_tpu_system=lambda r: rec.append(("initialize", r))))


def test_the_keras_worker_picks_tpu_strategy_on_a_tpu_vm(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainplan.run.workloads.keras import STRATEGY_ENV, make_strategy

    monkeypatch.delenv(STRATEGY_ENV, raising=False)
    tf = _FakeTF()
    assert make_strategy(tf, SimpleNamespace(world_size=1)) == "default"
    assert make_strategy(tf, SimpleNamespace(world_size=2)) == "mwms"  # CPU workers: unchanged
    monkeypatch.setenv(STRATEGY_ENV, "TPUStrategy")
    tf = _FakeTF()
    assert make_strategy(tf, SimpleNamespace(world_size=8)) == "tpu-strategy"
    names = [c[0] for c in tf.calls]
    assert names == ["resolver", "connect", "initialize", "TPUStrategy"] and tf.calls[0] == ("resolver", "local")


SPLIT = r"""
import json, os
os.environ["KERAS_BACKEND"] = "tensorflow"
import numpy as np, tensorflow as tf
tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from trainplan.run.workloads.keras import replica_shards, replicated_step

def build():
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return m

x = np.random.default_rng(1).normal(size=(8, 8)).astype("float32")
y = np.random.default_rng(2).normal(size=(8, 1)).astype("float32")
two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
parts = [v.numpy() for v in two.experimental_local_results(replica_shards(tf, two, x))]
with two.scope():
    m2 = build()
m1 = build()
m1.optimizer.build(m1.trainable_variables)
step2, step1 = replicated_step(tf, two, m2, "mse", split=True), replicated_step(tf, tf.distribute.get_strategy(), m1, "mse")
for _ in range(3):
    l2, l1 = step2(x, y), step1(x, y)
print(json.dumps({"parts": [p.tolist() for p in parts], "loss": [float(l1), float(l2)],
                  "weights_equal": all(np.allclose(a.numpy(), b.numpy(), atol=1e-6) for a, b in zip(m1.weights, m2.weights)),
                  "moved": not np.allclose(m1.weights[0].numpy(), build().weights[0].numpy())}))
"""


@pytest.mark.slow
def test_one_process_feeds_every_replica_its_own_rows() -> None:
    """TPUStrategy's data path, under a real two-replica MirroredStrategy on two logical CPUs (the same tf.distribute
    calls): replica r gets rows [4r, 4r + 4) of the host's batch of 8, and three steps equal three single-device
    steps on the whole batch (the mean of the replicas' means is the global mean)."""
    pytest.importorskip("tensorflow")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", SPLIT], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    import numpy as np

    x = np.random.default_rng(1).normal(size=(8, 8)).astype("float32")
    assert np.allclose(out["parts"][0], x[:4]) and np.allclose(out["parts"][1], x[4:])
    assert out["loss"][0] == pytest.approx(out["loss"][1], rel=1e-5)
    assert out["weights_equal"] and out["moved"]
