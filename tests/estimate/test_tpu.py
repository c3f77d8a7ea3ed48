"""TPU: the XLA SPMD arithmetic against published TPU training figures, per-chip pricing from the catalog, the
rendered SkyPilot TPU VM task and launch commands, and one clear line for what cannot run on a TPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainplan import get_catalog
from trainplan.catalog import find_instance
from trainplan.cli.main import main
from trainplan.errors import SpecError
from trainplan.estimate.tpu import (
    fsdp_ici_bytes_per_chip,
    fsdp_state_bytes_per_chip,
    ici_seconds,
    mfu,
    model_flops_per_token,
    price_per_chip_hour,
    step_seconds,
)
from trainplan.run.tpu import skypilot_tpu_task, tpu_launch

FIXTURES = Path(__file__).parents[1] / "fixtures" / "jobs"


@pytest.fixture(autouse=True)
def _no_calibrations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))


# PaLM 540B (Chowdhery et al. 2022): 540.35e9 parameters, 118 layers, 48 heads x 256 (d_attn 12288), sequence 2048;
# Table 3: 6144 TPU v4 chips, 238.3K tokens/s, 46.2 % MFU; batch 2048 sequences late in training (Sec. 5).
PALM = dict(params=540.35e9, layers=118, seq_len=2048, d_attn=48 * 256, chips=6144, tokens_per_s=238.3e3, mfu=0.462)


def test_palm_mfu_from_its_throughput() -> None:
    cat = get_catalog()
    peak = cat.accelerators["TPUv4"].peak_bf16_tflops  # 275 TFLOPS bf16 per chip (Google's TPU v4 docs)
    per_token = model_flops_per_token(PALM["params"], PALM["layers"], PALM["seq_len"], PALM["d_attn"])
    assert mfu(PALM["tokens_per_s"], per_token, PALM["chips"], peak) == pytest.approx(PALM["mfu"], abs=0.002)


def test_palm_step_time_at_its_mfu() -> None:
    """At PaLM's MFU, one 2048 x 2048-token step takes tokens / throughput: the step-time arithmetic closes."""
    peak = get_catalog().accelerators["TPUv4"].peak_bf16_tflops
    tokens = 2048 * 2048
    per_token = model_flops_per_token(PALM["params"], PALM["layers"], PALM["seq_len"], PALM["d_attn"])
    t = step_seconds(per_token * tokens, PALM["chips"], peak, PALM["mfu"])
    assert t == pytest.approx(tokens / PALM["tokens_per_s"], rel=0.01)


def test_fsdp_sharding_and_ici_traffic_on_v5e() -> None:
    """7B parameters, mixed-precision AdamW (16 B/param), sharded over a v5e-256 slice; ICI 200 GB/s per chip
    one way (instances.csv, from Google's v5e docs: 400 GBps bidirectional)."""
    cat = get_catalog()
    v5e = cat.accelerators["TPUv5e"]
    per_chip = fsdp_state_bytes_per_chip(7e9, 16, 256)
    assert per_chip == pytest.approx(7e9 * 16 / 256)
    assert per_chip / 2**30 < v5e.memory_gib  # fits the 16 GiB HBM with room for activations
    assert fsdp_state_bytes_per_chip(7e9, 16, 4) / 2**30 > v5e.memory_gib  # a v5e-4 slice cannot hold the states
    ici = find_instance("tpu-v5litepod-8", cat).intra_node_bw_gb_s
    sent = fsdp_ici_bytes_per_chip(7e9, 2, 256)
    assert sent == pytest.approx(3 * 7e9 * 2 * 255 / 256)
    assert ici_seconds(sent, ici) == pytest.approx(sent / 200e9)
    with pytest.raises(ValueError):
        fsdp_state_bytes_per_chip(1, 1, 0)


def test_tpu_prices_are_per_chip_hour_with_the_host() -> None:
    """Google's list prices per chip-hour, host included: v4 $3.22, v5e $1.20 (catalog rows' sources)."""
    cat = get_catalog()
    v4, v5e = find_instance("tpu-v4-8", cat), find_instance("tpu-v5litepod-8", cat)
    assert price_per_chip_hour(v4.price_usd_per_h, v4.accelerator_count) == pytest.approx(3.22)
    assert price_per_chip_hour(v5e.price_usd_per_h, v5e.accelerator_count) == pytest.approx(1.20)


def test_skypilot_tpu_task_and_launch_commands() -> None:
    task = skypilot_tpu_task(name="llama", instance="tpu-v5litepod-8", accelerator_id="TPUv5e", nodes=1,
                             framework="torch_xla", script="train.py", setup="pip install torch_xla")  # fmt: skip
    assert task["resources"] == {"accelerators": "tpu-v5litepod-8", "accelerator_args": {"runtime_version": "v2-alpha-tpuv5-lite"}}
    assert task["envs"] == {"PJRT_DEVICE": "TPU"} and task["run"] == "python3 train.py" and task["num_nodes"] == 1
    argv, env = tpu_launch("jax", "train.py", ("--steps", "10"))
    assert argv == ["python3", "train.py", "--steps", "10"] and env == {}
    assert tpu_launch("tf", "train.py")[1] == {"TRAINPLAN_TF_STRATEGY": "TPUStrategy"}
    with pytest.raises(SpecError, match="--instance: p4d.24xlarge is not a TPU slice"):
        skypilot_tpu_task(name="x", instance="p4d.24xlarge", accelerator_id="A100-40GB", nodes=1, framework="jax", script="t.py")
    with pytest.raises(SpecError, match="--framework: must be one of torch_xla, jax, tf"):
        tpu_launch("mxnet", "t.py")


def test_a_job_that_cannot_run_on_a_tpu_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(FIXTURES / "xgboost-10m.yaml"), "--instance", "tpu-v5litepod-8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and out["reason"] == "no GBDT library trains on TPUs"
    assert main(["estimate", str(FIXTURES / "llama7b-sft.yaml"), "--instance", "tpu-v5litepod-8", "--strategy", "zero2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] is False and "DeepSpeed does not run on TPUs" in out["reason"]


def test_the_composer_applies_the_xla_rules_on_a_tpu_slice() -> None:
    """FSDP on a TPU slice: model states are the SPMD shard (fsdp_state_bytes_per_chip), HBM has no CUDA context
    and no caching-allocator reserve (XLA's static buffer assignment)."""
    from trainplan.catalog import get_catalog
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.tpu import fsdp_state_bytes_per_chip
    from trainplan.estimate.transformer import estimate_transformer
    from trainplan.spec import parse_job
    from trainplan.strategies import Strategy

    cat = get_catalog()
    tpu = next(a for a in cat.accelerators.values() if a.kind == "tpu" and a.peak_tflops("bf16"))
    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10,
                     "global_batch": 8})  # fmt: skip
    e = estimate_transformer(job, hardware_for_gpu(tpu, cat, gpus=8), Strategy.FSDP, cat)
    m = e.memory
    assert m.context == 0 and m.fragmentation == 0 and m.reserved == m.allocated
    params = e.params
    # AMP-style FSDP: fp32 weights and gradients (4 + 4) and AdamW's two fp32 states (8) per parameter
    assert m.weights + m.optimizer == pytest.approx(fsdp_state_bytes_per_chip(params, 4 + 8, 8), rel=1e-6)
