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


def test_v4_slices_have_an_ici_figure_so_fsdp_is_estimated() -> None:
    """Google's v4 page: 'All-reduce bandwidth per Pod 1.1 PB/s' over 4096 chips -> 268 GB/s per chip (derived in the
    rows); with it, FSDP on a v4 slice is estimated instead of rejected for a missing figure."""
    from trainplan.estimate.hardware import hardware_for_instance
    from trainplan.estimate.result import RejectKind
    from trainplan.estimate.transformer import estimate_transformer
    from trainplan.spec import parse_job
    from trainplan.strategies import Strategy

    cat = get_catalog()
    for name in ("tpu-v4-8", "tpu-v4-16"):
        assert find_instance(name, cat).intra_node_bw_gb_s == pytest.approx(1.1e15 / 4096 / 1e9, rel=0.01)
    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10,
                     "global_batch": 8})  # fmt: skip
    e = estimate_transformer(job, hardware_for_instance(find_instance("tpu-v4-16", cat), cat), Strategy.FSDP, cat)
    assert e.rejection is None or e.rejection.kind is not RejectKind.MISSING_FIGURE
    assert 0 < e.step_time_s < float("inf")


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


# MaxText's published TPU training figures (AI-Hypercomputer/maxtext, docs/reference/models/tiering.md, "Trillium
# (v6e)" Gold table; read via the search tool 2026-12-03): Llama 2 70B on 256 v6e chips, BF16, sequence 4096:
# 43.8 % MFU at about 900 tokens/s per chip; Llama 3.1 8B on 256 v6e chips, BF16, sequence 8192: 45.46 % MFU at
# 7,207 tokens/s per chip.  MaxText counts the matmul weights (the input embedding is a lookup, not a matmul) and
# full (not causal-halved) attention — 6·N_matmul + 12·L·d·T per token, the PaLM formula on the matmul count.
MAXTEXT_V6E = [
    ("llama-2-70b", 4096, 900.0, 0.438),
    ("llama-3.1-8b", 8192, 7207.0, 0.4546),
]


@pytest.mark.parametrize(("model", "seq", "tokens_per_chip", "published_mfu"), MAXTEXT_V6E)
def test_v6e_mfu_from_maxtext_throughput(model: str, seq: int, tokens_per_chip: float, published_mfu: float) -> None:
    """The catalog's v6e peak (918 TFLOPS bf16, Google's v6e docs) and the PaLM FLOPs formula turn MaxText's
    published tokens/s into its published MFU: 43.6 % for 43.8 % (its 900 tokens/s is rounded), 45.47 % for 45.46 %."""
    from trainplan import resolve_model
    from trainplan.estimate.architecture import param_counts

    arch = resolve_model(model)
    per_token = model_flops_per_token(param_counts(arch).matmul_per_token, arch.layers, seq, arch.hidden)
    peak = get_catalog().accelerators["TPUv6e"].peak_bf16_tflops
    assert peak == 918
    assert mfu(tokens_per_chip * 256, per_token, 256, peak) == pytest.approx(published_mfu, abs=0.003)


def test_v5p_and_v5e_peaks_are_what_maxtext_divides_by() -> None:
    """MaxText's runtime-performance tables give achieved TFLOP/s per chip and the MFU it makes of them: v5p-128, 32B
    model, 328 TFLOP/s = 71.47 % (docs/reference/performance results, "TPU v5p"); v5e-256, 16B model, 120 TFLOP/s =
    61.10 % (MaxText/configs/v5e/README.md).  Dividing by the catalog's peaks (459 and 197 TFLOPS bf16, Google's v5p
    and v5e docs) gives the same MFU: the catalog rows are the peaks MaxText's figures are relative to."""
    acc = get_catalog().accelerators
    assert 328 / acc["TPUv5p"].peak_bf16_tflops == pytest.approx(0.7147, abs=0.001)
    assert 120 / acc["TPUv5e"].peak_bf16_tflops == pytest.approx(0.6110, abs=0.003)  # 120 is rounded from 120.4


@pytest.mark.parametrize(("model", "seq", "tokens_per_chip", "published_mfu"), MAXTEXT_V6E)
def test_the_estimate_against_maxtext_on_256_v6e_chips(model: str, seq: int, tokens_per_chip: float, published_mfu: float) -> None:
    """trainplan's own estimate of the same runs (FSDP over 256 v6e chips, one sequence per chip, full activation
    checkpointing; MaxText's batch and remat settings are not in the table): within 12 % of the published tokens/s
    per chip — 6,713 vs 7,207 (−6.9 %) for Llama 3.1 8B, 968 vs 900 (+7.6 %) for Llama 2 70B (docs/benchmarks.md)."""
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.transformer import estimate_transformer
    from trainplan.spec import parse_job
    from trainplan.strategies import Strategy

    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": model, "seq_len": seq, "micro_batch": 1, "steps": 10,
                     "precision": "bf16", "activation_checkpointing": "full"})  # fmt: skip
    e = estimate_transformer(job, hardware_for_gpu(cat.accelerators["TPUv6e"], cat, gpus=256), Strategy.FSDP, cat)
    assert e.fits
    assert e.throughput / 256 == pytest.approx(tokens_per_chip, rel=0.12)


def test_v5p_and_v6e_prices_per_chip_hour() -> None:
    """The SkyPilot GCP catalog's us-central1 rows: v5p $4.20 and v6e (Trillium) $2.70 per chip-hour, the host included;
    a multi-host slice costs its chips × the same rate (tpu-v5p-16: 8 chips, tpu-v5litepod-16: 16 chips)."""
    cat = get_catalog()
    for name, rate in (("tpu-v5p-8", 4.20), ("tpu-v6e-8", 2.70), ("tpu-v5p-16", 4.20), ("tpu-v5litepod-16", 1.20),
                       ("tpu-v4-16", 3.22)):  # fmt: skip
        inst = find_instance(name, cat)
        assert price_per_chip_hour(inst.price_usd_per_h, inst.accelerator_count) == pytest.approx(rate), name


def test_plan_says_why_a_tpu_kwh_is_unknown() -> None:
    """A TPU without a published board power (v5e, v5p, v6e) gets '?' kWh in plan's table and the reason under it —
    not a silent 0 — and estimate's energy line names the unknown board power instead of '0 W per device'."""
    from rich.console import Console

    from trainplan.cli.tables import estimate_panel, plan_table
    from trainplan.planner.core import plan_job
    from trainplan.spec import parse_job

    job = parse_job({"kind": "transformer", "seq_len": 256, "micro_batch": 2, "global_batch": 16, "steps": 100,
                     "precision": "bf16", "constraints": {"clouds": ["gcp"]},
                     "model": {"layers": 2, "hidden": 256, "heads": 4, "ffn_hidden": 688, "vocab": 32000}})  # fmt: skip
    plan = plan_job(job, get_catalog())
    unknown = [e for e in plan.options if e.energy and e.energy.kwh is None]
    assert unknown and all(e.hardware.accelerator.kind == "tpu" and e.hardware.accelerator.tdp_w is None for e in unknown)
    table = plan_table(plan, top=len(plan.options), title="t")
    assert table.caption and table.caption.startswith("kWh ?: no board power (tdp_w) for TPUv")
    console = Console(width=250, record=True)
    console.print(estimate_panel(unknown[0]))
    text = console.export_text()
    assert f"{unknown[0].hardware.accelerator.id} board power unknown" in text and "0 W per device" not in text


def test_gradient_accumulation_on_a_tpu_slice_keeps_gradients_sharded() -> None:
    """PyTorch FSDP accumulates unsharded gradients inside no_sync (memory.model_state_bytes); an SPMD step on a TPU
    slice accumulates into gradients sharded like the parameters (MaxText gradient_accumulation.py), so 4 micro-steps
    on 8 v5e chips hold 1/8 of the fp32 gradients, as one micro-step does — not all of them (25 GiB for LLaMA-7B)."""
    from trainplan.estimate.hardware import hardware_for_instance
    from trainplan.estimate.transformer import estimate_transformer
    from trainplan.spec import parse_job
    from trainplan.strategies import Strategy

    cat = get_catalog()
    hw = hardware_for_instance(find_instance("tpu-v5litepod-8", cat), cat)
    grads = {}
    for gb in (32, 128):  # 1 and 4 micro-steps of 4 sequences per chip
        job = parse_job({"kind": "transformer", "model": "llama-7b", "seq_len": 512, "micro_batch": 4, "global_batch": gb,
                         "steps": 10, "precision": "bf16", "activation_checkpointing": "full"})  # fmt: skip
        e = estimate_transformer(job, hw, Strategy.FSDP, cat)
        grads[gb] = e.memory.gradients
    assert grads[128] == pytest.approx(grads[32])
    assert grads[128] == pytest.approx(fsdp_state_bytes_per_chip(6_738_415_616, 4, 8), rel=1e-6)
