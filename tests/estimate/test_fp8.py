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


def test_fp8_all_gather_gathers_the_float8_weights_in_one_byte_under_fsdp_only() -> None:
    """knobs.fp8_all_gather (torchao enable_fsdp_float8_all_gather): FSDP's parameter all-gathers move 1 byte per
    float8 linear weight instead of 2; the other parameters, the gradient reduce-scatter and DeepSpeed's ZeRO-3 stay
    16-bit."""
    from trainplan.estimate.comms import collective_seconds, comm_plan
    from trainplan.estimate.steptime import links_for
    from trainplan.estimate.transformer import transformer_profile
    from trainplan.spec import Precision
    from trainplan.strategies import Layout

    cat = get_catalog()
    job = parse_job({**BASE, "precision": "fp8", "knobs": {"fp8_all_gather": True}})
    profile = transformer_profile(job, cat)
    arch = _arch(job)
    linear = sum(i * o for i, o in arch_mod.linear_shapes(arch).values()) * arch.blocks
    assert profile.fp8_gather_fraction == pytest.approx(linear / profile.params.total)
    assert 0.8 < profile.fp8_gather_fraction < 0.95  # Llama 3.1 8B: the block linears, not the embeddings and head
    hw = hardware_for_gpu(cat.accelerators["H100-80GB"], cat, gpus=8, nodes=4)
    links, total, f = links_for(hw, cat), profile.params.total, profile.fp8_gather_fraction
    kw = dict(layout=hw.layout, links=links, trainable_params=total, total_params=total, precision=Precision.FP8)
    plain, fp8 = comm_plan(Strategy.FSDP, **kw), comm_plan(Strategy.FSDP, fp8_gather_fraction=f, **kw)
    assert plain.per_micro_forward == pytest.approx(collective_seconds(2 * total, 1, hw.layout, links))
    assert fp8.per_micro_forward == pytest.approx(collective_seconds(total * (2 - f), 1, hw.layout, links))
    rs = plain.per_micro_backward - plain.per_micro_forward  # the gradients' reduce-scatter: 16-bit either way
    assert fp8.per_micro_backward == pytest.approx(fp8.per_micro_forward + rs)
    assert comm_plan(Strategy.ZERO3, fp8_gather_fraction=f, **kw) == comm_plan(Strategy.ZERO3, **kw)
    # where the gathers are exposed (short sequences over 16 nodes), the step gets shorter by the bytes saved
    short = {**BASE, "precision": "fp8", "seq_len": 1024, "global_batch": 128}
    many = hardware_for_gpu(cat.accelerators["H100-80GB"], cat, gpus=8, nodes=16)
    off = estimate_transformer(parse_job(short), many, Strategy.FSDP, cat)
    on = estimate_transformer(parse_job({**short, "knobs": {"fp8_all_gather": True}}), many, Strategy.FSDP, cat)
    assert 0 < on.time_breakdown["comm_exposed_s"] < off.time_breakdown["comm_exposed_s"]
    assert on.time_breakdown["compute_s"] == pytest.approx(off.time_breakdown["compute_s"])


def _arch(job):  # noqa: ANN001, ANN202
    from trainplan.estimate.transformer import resolve_transformer

    return resolve_transformer(job, get_catalog()).arch


def test_fp8_all_gather_needs_precision_fp8(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # noqa: ANN001
    import yaml

    from trainplan.cli.main import main

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**BASE, "name": "x", "precision": "bf16", "knobs": {"fp8_all_gather": True}}))
    assert main(["estimate", str(job), "--gpu", "H100-80GB", "--gpus", "8", "--strategy", "fsdp"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "knobs.fp8_all_gather" in lines[0] and "precision: fp8" in lines[0]
