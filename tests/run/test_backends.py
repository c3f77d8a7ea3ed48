"""Every backend that runs on a CPU, for real, with two processes (one for `single`).

Each run must start the number of processes it claims, wrap the model the
way its strategy says, and end with identical parameters on every rank.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import TORCH_JOB, load_state, rank_records

pytestmark = pytest.mark.slow

TORCH_ENGINES = ("ddp", "fsdp", "fsdp-grad-op", "fsdp-offload")
DEEPSPEED = ("zero1", "zero2", "zero3", "zero1-offload", "zero2-offload", "zero3-offload")

EXPECTED_WRAP = {
    "single": {"wrapped_as": "Sequential", "sharded_params": False},
    "ddp": {"wrapped_as": "DistributedDataParallel", "sharded_params": False},
    "fsdp": {"sharded_params": True, "offload_params": False},
    "fsdp-grad-op": {"sharded_params": True, "offload_params": False},
    "fsdp-offload": {"sharded_params": True, "offload_params": True},  # FSDP2 CPUOffloadPolicy, over gloo
    "zero1": {"wrapped_as": "DeepSpeedEngine", "zero_stage": 1, "offload_optimizer": False, "offload_param": False},
    "zero2": {"wrapped_as": "DeepSpeedEngine", "zero_stage": 2, "offload_optimizer": False, "offload_param": False},
    "zero3": {"wrapped_as": "DeepSpeedEngine", "zero_stage": 3, "offload_optimizer": False, "offload_param": False},
    "zero1-offload": {"wrapped_as": "DeepSpeedEngine", "zero_stage": 1, "offload_optimizer": True, "offload_param": False},
    "zero2-offload": {"wrapped_as": "DeepSpeedEngine", "zero_stage": 2, "offload_optimizer": True, "offload_param": False},
    "zero3-offload": {"wrapped_as": "DeepSpeedEngine", "zero_stage": 3, "offload_optimizer": True, "offload_param": True},
}


@pytest.mark.parametrize("strategy", ["single", *TORCH_ENGINES, *DEEPSPEED])
def test_backend_trains_with_real_processes(baseline, strategy: str) -> None:
    summary, out = baseline(strategy)
    assert summary.status == "completed", summary.message
    assert summary.exit_code == 0
    processes = 1 if strategy == "single" else 2

    starts = rank_records(out, "start")
    ends = rank_records(out, "end")
    assert len(starts) == len(ends) == processes
    assert len({r["pid"] for r in starts}) == processes  # distinct processes really started
    assert {r["world_size"] for r in starts} == {processes}
    assert sorted(r["rank"] for r in ends) == list(range(processes))
    assert len({r["params_sha256"] for r in ends}) == 1  # every rank ends with identical parameters
    for record in ends:
        for key, value in EXPECTED_WRAP[strategy].items():
            assert record[key] == value, (key, record)

    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "event" not in r] == list(range(1, TORCH_JOB["steps"] + 1))
    assert summary.steps == TORCH_JOB["steps"]
    m = summary.measured
    assert math.isfinite(m["final_loss"]) and m["step_time_s"] > 0 and m["rows_per_s"] > 0 and m["peak_gib"] > 0
    assert m["train_s"] >= m["step_time_s"]
    state = load_state(out / "model.pt")  # the final weights, loadable with weights_only=True
    assert set(state) == {"0.weight", "0.bias", "3.weight", "3.bias"}
    saved = json.loads((out / "summary.json").read_text())
    assert saved["status"] == "completed" and saved["strategy"] == strategy and saved["devices"] == processes


def test_data_parallel_engines_agree(baseline) -> None:
    """DDP and both FSDP modes do the same arithmetic: same final loss (and single sees a different batch split)."""
    losses = {s: baseline(s)[0].measured["final_loss"] for s in TORCH_ENGINES}
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-5)
    assert losses["fsdp-grad-op"] == pytest.approx(losses["ddp"], rel=1e-5)
    assert losses["fsdp-offload"] == pytest.approx(losses["ddp"], rel=1e-5)


def test_deepspeed_stages_agree_with_ddp(baseline) -> None:
    ddp = baseline("ddp")[0].measured["final_loss"]
    for strategy in DEEPSPEED:
        assert baseline(strategy)[0].measured["final_loss"] == pytest.approx(ddp, rel=1e-3), strategy


def test_deepspeed_on_cpu_compiles_no_ops(baseline, extensions_dir) -> None:
    """The job's torch optimizer and the skipped inference-only shm kernel mean no ninja build (minutes in CI)."""
    for strategy in DEEPSPEED:
        assert baseline(strategy)[0].status == "completed"
    assert not any(extensions_dir.iterdir())


def test_zero1_offload_keeps_full_gradients_until_the_boundary(extensions_dir) -> None:
    """What estimate/memory.py counts for DeepSpeed's offloaded stages, on DeepSpeed itself (two ranks over gloo):
    stage 1 keeps every parameter's full gradient on the device between the micro-steps of an accumulation window
    (with or without the optimizer offloaded), stage 2 keeps none (its partitions live in its own buffers, on the host
    when offloaded); at the boundary both are reduced and removed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("zero_grads_support.py")
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir), OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
                          str(worker)], capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("ZERO_GRADS ")), None)
    assert line is not None, run.stderr[-2000:]
    held = json.loads(line.removeprefix("ZERO_GRADS "))
    full = held["params"]
    assert held["1-True"] == held["1-False"] == [full, 0]
    assert held["2-True"] == held["2-False"] == [0, 0]

    from trainplan.estimate.memory import model_state_bytes
    from trainplan.spec import Optimizer, Precision
    from trainplan.strategies import Strategy

    states = {s: model_state_bytes(trainable_params=1e9, frozen_bytes=0.0, precision=Precision.BF16, optimizer=Optimizer.ADAMW,
                                   strategy=s, world_size=8) for s in (Strategy.ZERO1_OFFLOAD, Strategy.ZERO2_OFFLOAD)}  # fmt: skip
    assert states[Strategy.ZERO1_OFFLOAD].gradients == 2e9  # the full 16-bit gradients
    assert states[Strategy.ZERO2_OFFLOAD].gradients == 0.0
    assert states[Strategy.ZERO1_OFFLOAD].optimizer == states[Strategy.ZERO2_OFFLOAD].optimizer == 0.0
    assert states[Strategy.ZERO1_OFFLOAD].host == states[Strategy.ZERO2_OFFLOAD].host > 0
