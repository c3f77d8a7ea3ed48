"""precision: fp8 (issue 19): the linear layers' GEMMs on the FP8 tensor cores, the casts that feed them, bf16 memory;
planned only where FP8 units exist, refused elsewhere in one line."""

from __future__ import annotations

import pytest

from trainplan.catalog import get_catalog
from trainplan.errors import SpecError
from trainplan.estimate import architecture as arch_mod
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.result import RejectKind
from trainplan.estimate.transformer import estimate_transformer, fp8_gemm_terms
from trainplan.spec import parse_job
from trainplan.strategies import Strategy

BASE = {"kind": "transformer", "model": "llama-3.1-8b", "seq_len": 4096, "micro_batch": 1, "steps": 10,
        "activation_checkpointing": "selective", "flash_attention": "true"}  # fmt: skip


def _est(precision: str, gpu: str = "H100-80GB", **extra):
    cat = get_catalog()
    job = parse_job({**BASE, "precision": precision, **extra})
    return estimate_transformer(job, hardware_for_gpu(cat.accelerators[gpu], cat, gpus=8), Strategy.FSDP, cat)


def test_fp8_on_h100_is_faster_within_the_published_range_and_keeps_bf16_memory() -> None:
    bf16, fp8 = _est("bf16"), _est("fp8")
    assert bf16.fits and fp8.fits
    # published FP8 / bf16 speed-ups on H100: 1.00-1.35 (llm-foundry's FP8 table against its bf16 one; torchtitan's
    # Float8 Llama 3 8B 6,667 -> 8,532 tokens/s/GPU = 1.28)
    assert 1.05 < fp8.throughput / bf16.throughput < 1.35
    # torchao saves the 16-bit input and weight for backward: the same activations, the same peak
    assert fp8.memory.peak == pytest.approx(bf16.memory.peak)
    # longer sequences: attention (bf16) takes more of the step, the FP8 gain shrinks
    long_bf16, long_fp8 = _est("bf16", seq_len=16384), _est("fp8", seq_len=16384)
    assert long_fp8.throughput / long_bf16.throughput < fp8.throughput / bf16.throughput


def test_fp8_needs_fp8_tensor_cores() -> None:
    e = _est("fp8", gpu="A100-80GB")
    assert not e.fits and e.rejection.kind is RejectKind.PRECISION
    assert "A100-80GB has no FP8 tensor cores" in e.reason and "use precision: bf16" in e.reason
    # Blackwell has FP8 units: planned, and faster than its own bf16
    assert _est("fp8", gpu="B200").fits and _est("fp8", gpu="B200").throughput > _est("bf16", gpu="B200").throughput


def test_the_casts_feeding_the_fp8_gemms() -> None:
    job = parse_job({**BASE, "precision": "fp8"})
    from trainplan.catalog import resolve_model

    arch = resolve_model("llama-3.1-8b")
    weights, (fwd, bwd) = fp8_gemm_terms(job, arch)
    shapes = arch_mod.linear_shapes(arch).values()
    ins, outs = sum(i for i, _ in shapes), sum(o for _, o in shapes)
    assert weights == sum(i * o for i, o in shapes) * arch.layers
    tokens = 4096
    # amax pass + scale-and-cast pass: 2 reads of the bf16 operand and one 1-byte write
    assert fwd == 5 * (tokens * ins * arch.layers + weights)
    assert bwd == 5 * (tokens * (2 * outs + ins) * arch.layers + weights)


@pytest.mark.parametrize(
    ("job", "needle"),
    [
        ({**BASE, "precision": "fp8", "method": "lora"}, "LoRA / QLoRA train in bf16"),
        ({"kind": "torch", "model": "m:f", "inputs": [{"shape": [4]}], "micro_batch": 2, "steps": 1, "precision": "fp8"},
         "fp8 is planned for kind: transformer"),
    ],
)
def test_fp8_where_it_is_not_modelled_is_one_line(job: dict, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_job(job)


def test_fp8_for_moe_is_refused_and_run_does_not_train_it() -> None:
    with pytest.raises(SpecError, match="dense decoder models"):
        _est("fp8", model="mixtral-8x7b", seq_len=1024)
    from trainplan.run.workloads.checks import check_supported
    from trainplan.catalog import resolve_model

    job = parse_job({**BASE, "precision": "fp8"})
    with pytest.raises(SpecError, match="fp8 is planned, not run here") as exc:
        check_supported(job, resolve_model("llama-3.1-8b"))
    assert exc.value.field == "precision"
