"""Golden tests of the per-quantity estimators against published numbers (each cited)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml

from trainplan.catalog import get_catalog, resolve_model
from trainplan.estimate import architecture as arch_mod
from trainplan.estimate.compute import training_step_flops
from trainplan.estimate.memory import layer_activation_bytes, model_state_bytes
from trainplan.estimate.published import compare
from trainplan.spec import Checkpointing, Optimizer, Precision
from trainplan.strategies import Strategy

GB = 1e9
DATA = Path(__file__).parent / "data" / "published_llm.yaml"


@pytest.mark.parametrize(
    "strategy, expected_gb",
    [
        # Rajbhandari et al. 2020, "ZeRO", Figure 1: Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam).
        (Strategy.DDP, 120.0),
        (Strategy.ZERO1, 31.4),
        (Strategy.ZERO2, 16.6),
        (Strategy.ZERO3, 1.9),
    ],
)
def test_model_states_match_zero_paper_figure_1(strategy: Strategy, expected_gb: float) -> None:
    # DDP as DeepSpeed runs it (stage 0 = 2Ψ + 2Ψ + 12Ψ); trainplan's DDP is PyTorch AMP (4Ψ + 4Ψ + 8Ψ): same 16Ψ total.
    states = model_state_bytes(
        trainable_params=7.5e9, frozen_bytes=0, precision=Precision.BF16, optimizer=Optimizer.ADAMW,
        strategy=strategy, world_size=64,
    )  # fmt: skip
    total = states.weights + states.gradients + states.optimizer
    assert total / GB == pytest.approx(expected_gb, rel=0.02)


def test_zero2_offload_moves_optimizer_state_to_host() -> None:
    # ZeRO-Offload (Ren et al. 2021, Sec. 4): GPU keeps 2Ψ fp16 weights; host keeps 12Ψ/N + 4Ψ/N fp32 grads.
    s = model_state_bytes(
        trainable_params=1e9, frozen_bytes=0, precision=Precision.BF16, optimizer=Optimizer.ADAMW,
        strategy=Strategy.ZERO2_OFFLOAD, world_size=4,
    )  # fmt: skip
    assert s.weights == pytest.approx(2e9)
    assert s.optimizer == 0 and s.gradients == 0
    assert s.host == pytest.approx(16e9 / 4)


def test_gpt_block_activations_match_korthikanti_equation_1() -> None:
    # Korthikanti et al. 2022, eq. 1: sbh(34 + 5as/h) bytes for a GPT block in fp16 with dropout, no recompute.
    s, b, h, a = 2048, 4, 6144, 48
    got = layer_activation_bytes(
        seq_len=s, micro_batch=b, hidden=h, heads=a, q_dim=h, kv_dim=h, ffn_hidden=4 * h, mlp="gelu",
        norm="layernorm", precision=Precision.FP16, flash_attention=False, dropout=True,
    )  # fmt: skip
    expected = s * b * h * (34 + 5 * a * s / h)
    # our LayerNorm also keeps fp32 mean/rstd (8 bytes per token per norm), which the paper omits
    assert got == pytest.approx(expected, rel=0.001)


def test_selective_recompute_drops_attention_core() -> None:
    kw = dict(seq_len=2048, micro_batch=1, hidden=4096, heads=32, q_dim=4096, kv_dim=4096, ffn_hidden=16384,
              mlp="gelu", norm="layernorm", precision=Precision.FP16, flash_attention=False, dropout=True)  # fmt: skip
    full = layer_activation_bytes(**kw)  # type: ignore[arg-type]
    sel = layer_activation_bytes(**kw, checkpointing=Checkpointing.SELECTIVE)  # type: ignore[arg-type]
    # Korthikanti Sec. 4.2: selective recompute leaves 34·sbh
    assert sel == pytest.approx(2048 * 4096 * 34, rel=0.001)
    assert full > sel


def test_training_flops_match_palm_appendix_b() -> None:
    # PaLM (Chowdhery et al. 2022), App. B: training FLOPs per token = 6N + 12·L·H·Q·T.
    arch = resolve_model("gpt2-xl")
    c = arch_mod.param_counts(arch)
    seq = 1024
    f = training_step_flops(
        tokens=seq, matmul_params=c.matmul_per_token, trainable_matmul_params=c.matmul_per_token, adapter_params=0,
        layers=arch.layers, seq_len=seq, attn_dim=arch.hidden, checkpointing=Checkpointing.NONE,
        lm_head_params=arch.vocab * arch.hidden,
    )  # fmt: skip
    per_token = f.model / seq
    assert per_token == pytest.approx(6 * c.matmul_per_token + 12 * arch.layers * arch.hidden * seq, rel=1e-9)


def test_lora_backward_skips_frozen_weight_gradients() -> None:
    kw = dict(tokens=1000, matmul_params=1e9, adapter_params=0, layers=1, seq_len=1, attn_dim=1,
              checkpointing=Checkpointing.NONE, lm_head_params=0)  # fmt: skip
    full = training_step_flops(trainable_matmul_params=1e9, **kw)  # type: ignore[arg-type]
    frozen = training_step_flops(trainable_matmul_params=0, **kw)  # type: ignore[arg-type]
    assert full.backward == pytest.approx(2 * full.forward, rel=1e-3)
    assert frozen.backward == pytest.approx(frozen.forward, rel=1e-3)


def test_full_recompute_adds_one_forward_of_the_blocks() -> None:
    kw = dict(tokens=512, matmul_params=2e9, trainable_matmul_params=2e9, adapter_params=0, layers=24, seq_len=512,
              attn_dim=2048, lm_head_params=1e8)  # fmt: skip
    none = training_step_flops(checkpointing=Checkpointing.NONE, **kw)  # type: ignore[arg-type]
    full = training_step_flops(checkpointing=Checkpointing.FULL, **kw)  # type: ignore[arg-type]
    assert full.recompute == pytest.approx(none.forward - 2 * 1e8 * 512)
    assert full.model == none.model


def test_qlora_weights_are_about_half_a_byte_per_parameter() -> None:
    # Dettmers et al. 2023 (QLoRA), Sec. 3: NF4 + double quantisation = 4.127 bits per parameter.
    assert arch_mod.QLORA_BITS_PER_PARAM == pytest.approx(4.127, abs=0.001)


def test_lora_parameter_count_llama_7b_q_v_rank_8() -> None:
    # Hu et al. 2021: r·(d_in + d_out) per adapted matrix; LLaMA-7B q,v at r=8: 32 layers × 2 × 8 × 8192 = 4,194,304
    # (the count PEFT prints for this setting: "trainable params: 4,194,304").
    from trainplan.spec import LoraSpec

    assert arch_mod.lora_params(resolve_model("llama-7b"), LoraSpec(rank=8, targets=("q_proj", "v_proj"))) == 4_194_304


@pytest.fixture(scope="module")
def published() -> list:
    recs = yaml.safe_load(DATA.read_text())
    return [c for c in (compare(r) for r in recs) if c is not None]


FP8_IDS = {r["id"] for r in yaml.safe_load(DATA.read_text()) if r.get("precision") == "fp8"}


def test_published_throughput_median_error_within_25_percent(published: list) -> None:
    """Against 200+ measured runs (llm-foundry, torchtitan, torchtune, TinyLlama) with default efficiencies."""
    errs = [c.throughput_error for c in published if c.throughput_error is not None and c.id not in FP8_IDS]
    assert len(errs) >= 150
    # pinned just above where they stand (docs/benchmarks.md: 12.2% median |err|, bias +12.1%, 73% within 25%),
    # so that a regression fails; the brief's target is 15% median
    assert statistics.median(abs(e) for e in errs) <= 0.13
    assert abs(statistics.median(errs)) <= 0.13
    assert sum(abs(e) <= 0.25 for e in errs) / len(errs) >= 0.70


def test_published_fp8_runs_are_estimated_within_the_h100_error(published: list) -> None:
    """precision fp8 (issue 19): the llm-foundry H100 FP8 table (Transformer Engine) is modelled now; its error is the
    H100 bf16 table's (+10% to +32%, docs/benchmarks.md), and the predicted FP8 / bf16 speed-up of each pair measured
    in both precisions lies within the published range (1.00 to 1.35)."""
    fp8 = {c.id: c for c in published if c.id in FP8_IDS and c.throughput_error is not None}
    assert len(fp8) >= 8
    assert statistics.median(abs(c.throughput_error) for c in fp8.values()) <= 0.23
    bf16 = {c.id: c for c in published if c.id not in FP8_IDS}
    pairs = 0
    for rid, c in fp8.items():
        twin = bf16.get(rid.replace("-fp8-", "-"))
        if twin is None or not twin.measured_tokens_per_s_per_gpu:
            continue
        pairs += 1
        predicted = c.predicted_tokens_per_s_per_gpu / twin.predicted_tokens_per_s_per_gpu
        measured = c.measured_tokens_per_s_per_gpu / twin.measured_tokens_per_s_per_gpu
        assert 1.0 <= predicted <= 1.35 and 0.95 <= measured <= 1.4, (rid, predicted, measured)
    assert pairs >= 4


def test_published_fit_verdicts_mostly_right(published: list) -> None:
    verdicts = [c.predicted_fits == c.measured_fits for c in published if c.measured_fits is not None]
    assert len(verdicts) >= 150
    # pinned at where it stands (221/226): a regression of two verdicts fails
    assert sum(verdicts) / len(verdicts) >= 0.97


def test_out_of_memory_runs_are_predicted_not_to_fit(published: list) -> None:
    ooms = [c for c in published if c.measured_fits is False]
    assert ooms, "the published set has OOM records"
    assert sum(not c.predicted_fits for c in ooms) / len(ooms) >= 0.75


def test_reference_case_verdicts() -> None:
    """LLaMA-7B full fine-tune: DDP never fits (model states > 100 GiB); ZeRO-2 on 4×A100-80GB fits, on 4×A100-40GB not."""
    from trainplan.cli.common import example_path
    from trainplan.catalog import find_accelerator
    from trainplan.estimate.transformer import estimate_transformer
    from trainplan.planner.candidates import hardware_for_gpu
    from trainplan.spec import load_job

    cat = get_catalog()
    job = load_job(example_path("llama7b-sft.yaml"))

    def est(gpu: str, n: int, s: Strategy):
        return estimate_transformer(job, hardware_for_gpu(find_accelerator(gpu), cat, gpus=n), s, cat)

    ddp = est("A100-80GB", 8, Strategy.DDP)
    assert not ddp.fits
    assert (ddp.memory.weights + ddp.memory.gradients + ddp.memory.optimizer) / 2**30 > 100
    assert est("A100-80GB", 4, Strategy.ZERO2).fits
    assert not est("A100-40GB", 4, Strategy.ZERO2).fits
    assert est("A100-40GB", 4, Strategy.ZERO2_OFFLOAD).fits


def test_stated_stack_memory_and_verdicts_stay_where_they_stand() -> None:
    """The stated-stack records (tests/data/published_stacks.yaml + the stacked rows of published_llm.yaml): peak
    memory median |err| 4.6% in-sample and verdicts 59/59 (docs/benchmarks.md), pinned so a regression fails.
    In-sample figures: the mechanisms were chosen on these records (issue 22 keeps a new held-out set)."""
    from trainplan.estimate.published import memory_errors

    stacks = yaml.safe_load(DATA.with_name("published_stacks.yaml").read_text())
    assert memory_errors(stacks, heldout=False).median <= 0.05
    verdicts = [c for c in (compare(r) for r in stacks) if c is not None and c.measured_fits is not None]
    assert len(verdicts) >= 59 and all(c.predicted_fits == c.measured_fits for c in verdicts)

