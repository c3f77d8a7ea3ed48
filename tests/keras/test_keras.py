"""kind: keras — the job file, XLA's HLO and buffer assignment read right, five models' parameters and FLOPs
against Keras' own count and the textbook formulas, the plan, and `trainplan run` on CPU: one process with
measured-vs-predicted peak, and two MultiWorkerMirroredStrategy workers on localhost ending with identical weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainplan.errors import SpecError
from trainplan.spec import KerasJob, parse_job
from trainplan.strategies import Strategy

REPO = Path(__file__).parents[2]
MODELS = "tests.keras.models"


def keras_job(model: str, inputs: list[dict], loss: str = "sparse_categorical_crossentropy", **kw: object) -> KerasJob:
    data = {"kind": "keras", "model": f"{MODELS}:{model}", "inputs": inputs, "loss": loss, "micro_batch": 32, "steps": 10}
    data.update(kw)
    job = parse_job(data)
    assert isinstance(job, KerasJob)
    return job


# --------------------------------------------------------------------------- the job file (no TensorFlow needed)


def test_keras_job_parses_and_rejects_bad_fields() -> None:
    job = keras_job("dense", [{"shape": [64]}])
    assert job.kind.value == "keras" and job.precision.value == "fp32"
    with pytest.raises(SpecError, match="loss: must be one of mse"):
        keras_job("dense", [{"shape": [64]}], loss="hinge_of_doom")
    with pytest.raises(SpecError, match="adam8bit is bitsandbytes"):
        keras_job("dense", [{"shape": [64]}], optimizer="adam8bit")
    with pytest.raises(SpecError, match="model: .*import path"):
        parse_job({"kind": "keras", "model": "no_colon", "inputs": [{"shape": [4]}], "micro_batch": 1, "steps": 1})
    with pytest.raises(SpecError, match="kind: must be one of transformer, tabular, torch, keras"):
        parse_job({"kind": "kears"})


def test_strategy_maps_to_tf_distribute() -> None:
    from trainplan.run.workloads.keras import tf_distribute_strategy, tf_config

    assert tf_distribute_strategy(Strategy.SINGLE, processes=1) == "OneDeviceStrategy"
    assert tf_distribute_strategy(Strategy.DDP, processes=4, accelerator="cuda") == "MirroredStrategy"
    assert tf_distribute_strategy(Strategy.DDP, processes=2, accelerator="cpu") == "MultiWorkerMirroredStrategy"
    assert tf_distribute_strategy(Strategy.DDP, processes=8, nodes=2, accelerator="cuda") == "MultiWorkerMirroredStrategy"
    assert tf_distribute_strategy(Strategy.DDP, processes=8, accelerator="tpu") == "TPUStrategy"
    with pytest.raises(SpecError, match="--strategy: Keras jobs run single or ddp"):
        tf_distribute_strategy(Strategy.ZERO2, processes=2)
    cfg = json.loads(tf_config(1, [12345, 12346]))
    assert cfg == {"cluster": {"worker": ["localhost:12345", "localhost:12346"]}, "task": {"type": "worker", "index": 1}}


HLO = """HloModule m, entry_computation_layout={(f32[8,4]{1,0})->f32[8,3]{1,0}}

%fused_dot (param_0: f32[8,4], param_1: f32[4,3]) -> f32[8,3] {
  %param_0 = f32[8,4]{1,0} parameter(0)
  %param_1 = f32[4,3]{1,0} parameter(1)
  ROOT %d = f32[8,3]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%cond (p: (s32[], f32[8,3])) -> pred[] {
  %p = (s32[], f32[8,3]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (q: (s32[], f32[8,3])) -> (s32[], f32[8,3]) {
  %q = (s32[], f32[8,3]{1,0}) parameter(0)
  %h = f32[8,3]{1,0} get-tuple-element(%q), index=1
  %w = f32[3,3]{1,0} constant({...})
  %m = f32[8,3]{1,0} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (s32[], f32[8,3]{1,0}) tuple(%i2, %m)
}

ENTRY %main (x: f32[8,4], k: f32[2,3,3,4]) -> f32[8,3] {
  %x = f32[8,4]{1,0} parameter(0)
  %k = f32[3,3,4,6]{3,2,1,0} parameter(1)
  %img = f32[1,10,10,4]{3,2,1,0} parameter(2)
  %c = f32[1,10,10,6]{3,2,1,0} convolution(%img, %k), window={size=3x3 pad=1_1x1_1}, dim_labels=b01f_01io->b01f
  %w0 = f32[4,3]{1,0} constant({...})
  %f = f32[8,3]{1,0} fusion(%x, %w0), kind=kOutput, calls=%fused_dot
  %init = (s32[], f32[8,3]{1,0}) tuple(%zero, %f)
  %loop = (s32[], f32[8,3]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,3]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_hlo_matmul_flops_counts_fusions_loops_and_convolutions() -> None:
    from trainplan.estimate.keras import hlo_matmul_flops

    fused = 2 * 8 * 3 * 4  # dot in a fusion, called once
    loop = 5 * (2 * 8 * 3 * 3)  # dot in a while body, 5 trips (condition bound)
    conv = 2 * (1 * 10 * 10 * 6) * (3 * 3 * 4)  # per output: 3x3 window x 4 input features
    assert hlo_matmul_flops(HLO) == fused + loop + conv


def test_buffer_assignment_bytes() -> None:
    from trainplan.estimate.keras import buffer_assignment_bytes

    text = """allocation 0: size 1024, parameter 2, shape |f32[16,16]| at ShapeIndex {}, maybe-live-out:
allocation 1: size 512, parameter 0, shape |f32[8,16]| at ShapeIndex {}:
allocation 2: size 4096, preallocated-temp:
allocation 3: size 64, output shape is |(f32[])|, maybe-live-out:
allocation 4: size 4, constant:
"""
    b = buffer_assignment_bytes(text)
    assert b == {"temp": 4096, "state": 1024, "inputs": 512, "other": 68, "total": 5700}


# --------------------------------------------------------------------------- with TensorFlow

FIVE = {
    # name: (inputs, loss, analytic forward FLOPs per micro-batch of 32 (2 FLOPs per multiply-accumulate), params)
    "dense": ([{"shape": [64]}], "sparse_categorical_crossentropy",
              2 * 32 * (64 * 256 + 256 * 256 + 256 * 10), (64 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10)),
    "cnn": ([{"shape": [32, 32, 3]}], "sparse_categorical_crossentropy",
            2 * 32 * (32 * 32 * 16 * 27 + 16 * 16 * 32 * 144 + 32 * 10), (27 * 16 + 16) + (144 * 32 + 32) + (32 * 10 + 10)),
    "transformer_block": ([{"shape": [32], "dtype": "int32", "high": 500}], "sparse_categorical_crossentropy",
                          2 * 32 * 32 * (4 * 64 * 64 + 2 * 32 * 64 + 2 * 64 * 256 + 64 * 500),
                          500 * 64 + 4 * (64 * 64 + 64) + 2 * 2 * 64 + (64 * 256 + 256) + (256 * 64 + 64) + (64 * 500 + 500)),
    "rnn": ([{"shape": [20, 16]}], "sparse_categorical_crossentropy",
            2 * 32 * (20 * 4 * 64 * (16 + 64) + 64 * 5), 4 * 64 * (16 + 64 + 1) + 64 * 5 + 5),
    "two_tower": ([{"shape": [32]}, {"shape": [16]}], "mse",
                  2 * 32 * (32 * 128 + 16 * 64 + 192 * 128 + 128), (32 * 128 + 128) + (16 * 64 + 64) + (192 * 128 + 128) + 129),
}


@pytest.fixture(scope="module")
def analyses() -> dict[str, dict]:
    pytest.importorskip("tensorflow")
    from trainplan.estimate.keras import analyse_keras_jobs

    import os

    cwd = os.getcwd()
    os.chdir(REPO)  # the factories are imported as tests.keras.models from the repository root
    try:
        jobs = {name: keras_job(name, inputs, loss) for name, (inputs, loss, _, _) in FIVE.items()}
        return dict(zip(jobs, analyse_keras_jobs(list(jobs.values()))))
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("name", list(FIVE))
def test_params_and_flops_of_five_models(analyses: dict[str, dict], name: str) -> None:
    _, _, flops, params = FIVE[name]
    a = analyses[name]
    assert a["params"] == a["count_params"] == params  # ours = Keras' count_params = the formula
    assert a["flops_forward"] == pytest.approx(flops, rel=1e-9 if name != "transformer_block" else 0.01)
    backward = a["flops_step"] - a["flops_forward"]
    assert 1.4 * a["flops_forward"] < backward <= 2.0 * a["flops_forward"] + 1  # dX and dW, less the input layer's dX
    x = a["xla"]
    assert x["state"] >= 12 * a["trainable_params"]  # fp32 weights + AdamW's two moments
    assert x["temp"] >= 4 * a["trainable_params"]  # the gradients live in XLA's temp buffer


def test_profile_and_plan(analyses: dict[str, dict]) -> None:
    from trainplan.catalog import get_catalog
    from trainplan.estimate.compose import compose
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.keras import profile_from_analysis
    from trainplan.catalog import find_accelerator

    job = keras_job("cnn", FIVE["cnn"][0])
    prof = profile_from_analysis(job, analyses["cnn"])
    cat = get_catalog()
    hw = hardware_for_gpu(find_accelerator("A100-80GB", cat), cat, gpus=2)
    ddp = compose(job, prof, hw, Strategy.DDP, cat)
    assert ddp.fits and ddp.params == analyses["cnn"]["params"] and ddp.step_time_s > 0
    zero = compose(job, prof, hw, Strategy.ZERO2, cat)
    assert not zero.fits and "keras" in zero.reason and "deepspeed" in zero.reason


def _run(args: list[str], cwd: Path) -> dict:
    from trainplan.cli.main import main

    import contextlib
    import io
    import os

    old = os.getcwd()
    os.chdir(cwd)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            code = main(args)
    finally:
        os.chdir(old)
    assert code == 0, buf.getvalue()[-2000:]
    return json.loads(buf.getvalue().strip().splitlines()[-1])


@pytest.mark.slow
def test_run_one_process_and_two_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One process: checkpoints, measured (TF's BFC allocator) against predicted (XLA) peak; two
    MultiWorkerMirroredStrategy workers on localhost: identical weights on both at the end."""
    pytest.importorskip("tensorflow")
    import numpy as np

    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))
    spec = ("kind: keras\nmodel: tests.keras.models:dense\nmodel_args: {features: 256, hidden: 1024}\n"
            "inputs: [{shape: [256]}]\nloss: sparse_categorical_crossentropy\nsteps: 4\nlearning_rate: 0.001\n")
    job_file = tmp_path / "dense.yaml"
    job_file.write_text("name: keras-dense\nmicro_batch: 256\n" + spec)
    one = _run(["run", str(job_file), "--out", str(tmp_path / "one"), "--json", "--checkpoint-every", "2"], REPO)
    assert one["status"] == "completed" and one["strategy"] == "single" and one["steps"] == 4
    assert "get_memory_info" in one["peak_method"]
    measured, predicted = one["measured"]["peak_gib"], one["predicted"]["peak_gib"]
    assert predicted and measured and abs(predicted - measured) / measured < 0.3  # benchmarks: -14 % for this model
    assert (tmp_path / "one" / "checkpoints" / "keras" / "checkpoint").exists()

    job_file = tmp_path / "dense2.yaml"
    job_file.write_text("name: keras-dense-2w\nmicro_batch: 32\nglobal_batch: 64\n" + spec)
    two = _run(["run", str(job_file), "--out", str(tmp_path / "two"), "--json", "--strategy", "ddp", "--devices", "2"], REPO)
    assert two["status"] == "completed" and two["devices"] == 2
    digests = [json.loads((tmp_path / "two" / f"keras_rank{r}.json").read_text())["weights_sha256"] for r in (0, 1)]
    assert digests[0] == digests[1]
    w0, w1 = (np.load(tmp_path / "two" / f"keras_weights_rank{r}.npz") for r in (0, 1))
    start = np.load(tmp_path / "one" / "keras_weights_rank0.npz")
    assert all(np.array_equal(w0[k], w1[k]) for k in w0.files)
    assert any(not np.array_equal(w0[k], start[k]) for k in w0.files)  # it trained (other data than the single run)
