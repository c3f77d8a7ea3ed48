"""The trace engine, proved against measured peaks.

The heart of this file is :func:`test_traced_peak_matches_measured_cpu_peak`:
for each configuration in :data:`CASES` it runs the REAL training step on CPU
(real tensors), measures its peak with ``torch.profiler`` memory events, and
checks that the trace of the same step on the fake CPU device predicts that
peak within 10%.  Run this file as a script to print the validation table that
``docs/trace.md`` quotes::

    PYTHONPATH=src python tests/estimate/test_trace.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from trainplan.estimate.trace import (  # noqa: E402
    MemoryBreakdown,
    TraceError,
    TraceResult,
    build_hf_causal_lm,
    load_factory,
    trace_training_step,
)
from trainplan.estimate.trace.inputs import make_inputs  # noqa: E402
from trainplan.estimate.trace.lora import peft_available  # noqa: E402
from trainplan.estimate.trace.loss import forward_and_loss  # noqa: E402
from trainplan.estimate.trace.optimizers import make_optimizer  # noqa: E402
from trainplan.estimate.trace.precision import autocast_context  # noqa: E402
from trainplan.estimate.trace.prepare import prepare_model  # noqa: E402
from trainplan.spec import Checkpointing, InputSpec, LoraSpec, Optimizer, Precision  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 0.10  # PRODUCT.md accuracy target for peak memory

# --------------------------------------------------------------------------- models


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 256))


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


class UNet(nn.Module):
    """A two-level U-Net: conv blocks, max-pool down, upsample + skip concat up."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.ReLU())

        self.down = nn.ModuleList([block(1, c), block(c, 2 * c)])
        self.mid = block(2 * c, 2 * c)
        self.up = nn.ModuleList([block(4 * c, c), block(2 * c, c)])
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for b in self.down:
            x = b(x)
            skips.append(x)
            x = nn.functional.max_pool2d(x, 2)
        x = self.mid(x)
        for b in self.up:
            x = nn.functional.interpolate(x, scale_factor=2.0)
            x = b(torch.cat([x, skips.pop()], dim=1))
        return self.out(x)


LLAMA_TINY = dict(
    model_type="llama",
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=4000,
    max_position_embeddings=512,
)
GPT2_TINY = dict(
    model_type="gpt2",
    n_embd=256,
    n_layer=2,
    n_head=4,
    vocab_size=4000,
    n_positions=512,
    bos_token_id=0,
    eos_token_id=0,
)


def llama() -> nn.Module:
    return build_hf_causal_lm(LLAMA_TINY)


def gpt2() -> nn.Module:
    return build_hf_causal_lm(GPT2_TINY)


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], nn.Module]
    inputs: tuple[InputSpec, ...]
    micro_batch: int
    precision: str = "fp32"
    optimizer: str = "adamw"
    checkpointing: str = "none"
    loss: str = "mean"
    lora: LoraSpec | None = None
    lora_backend: str = "builtin"


VEC = (InputSpec(shape=(256,)),)
IMG = (InputSpec(shape=(3, 48, 48)),)
GRAY = (InputSpec(shape=(1, 64, 64)),)
TOK = (InputSpec(shape=(256,), dtype="int64", high=4000),)
QV = LoraSpec(rank=8, targets=("q_proj", "v_proj"))

CASES: tuple[Case, ...] = (
    Case("mlp fp32 sgd", mlp, VEC, 256, optimizer="sgd"),
    Case("mlp fp32 adamw", mlp, VEC, 256),
    Case("mlp bf16 adamw", mlp, VEC, 256, precision="bf16"),
    Case("mlp fp32 adamw ckpt-full", mlp, VEC, 256, checkpointing="full"),
    Case("mlp fp32 lion", mlp, VEC, 256, optimizer="lion"),
    Case("mlp fp32 adafactor", mlp, VEC, 256, optimizer="adafactor"),
    Case("cnn fp32 sgd", cnn, IMG, 32, optimizer="sgd", loss="cross_entropy"),
    Case("cnn bf16 adamw", cnn, IMG, 32, precision="bf16", loss="cross_entropy"),
    Case("cnn fp32 adamw ckpt-full", cnn, IMG, 32, checkpointing="full", loss="cross_entropy"),
    Case("unet fp32 adamw", UNet, GRAY, 8, loss="mse"),
    Case("unet fp32 adamw ckpt-full", UNet, GRAY, 8, checkpointing="full", loss="mse"),
    Case("llama fp32 adamw", llama, TOK, 4, loss="cross_entropy"),
    Case("llama bf16 adamw", llama, TOK, 4, precision="bf16", loss="cross_entropy"),
    Case("llama bf16 adamw ckpt-full", llama, TOK, 4, precision="bf16", checkpointing="full", loss="cross_entropy"),
    Case(
        "llama bf16 adamw ckpt-selective",
        llama,
        TOK,
        4,
        precision="bf16",
        checkpointing="selective",
        loss="cross_entropy",
    ),
    Case("llama bf16-pure adamw", llama, TOK, 4, precision="bf16-pure", loss="cross_entropy"),
    Case("gpt2 fp32 sgd", gpt2, TOK, 4, optimizer="sgd", loss="cross_entropy"),
    Case("gpt2 bf16 adamw ckpt-full", gpt2, TOK, 4, precision="bf16", checkpointing="full", loss="cross_entropy"),
    Case(
        "llama bf16 lora-qv adamw (peft)",
        llama,
        TOK,
        4,
        precision="bf16",
        loss="cross_entropy",
        lora=QV,
        lora_backend="peft",
    ),
    Case(
        "llama fp32 lora-all sgd",
        llama,
        TOK,
        4,
        optimizer="sgd",
        loss="cross_entropy",
        lora=LoraSpec(rank=8, targets=("all-linear",)),
    ),
)

# --------------------------------------------------------------------------- measuring


def peak_in_window(events: Sequence[Any], window: str) -> int:
    """Peak live bytes inside the ``record_function(window)`` range of a profile.

    Live bytes are the running sum of every CPU ``[memory]`` event since the
    profile started (allocations positive, frees negative), so memory allocated
    before the window but inside the profile — the model, the optimizer state,
    the batch — counts, as it does on the device.
    """
    marks = [e for e in events if e.name() == window]
    if len(marks) != 1:
        raise AssertionError(f"expected one {window!r} range in the profile, found {len(marks)}")
    start, end = marks[0].start_ns(), marks[0].end_ns()
    cpu = torch.autograd.DeviceType.CPU
    mem = sorted(
        (e.start_ns(), i, e.nbytes()) for i, e in enumerate(events) if e.name() == "[memory]" and e.device_type() == cpu
    )
    live = peak = 0
    for t, _, nbytes in mem:
        live += nbytes
        if start <= t <= end:
            peak = max(peak, live)
    return peak


def measure_cpu_step_peak(case: Case) -> int:
    """Peak bytes of the second real training step of ``case`` on CPU (the first creates optimizer state)."""
    torch.manual_seed(0)
    precision = Precision(case.precision)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = prepare_model(
            case.build(),
            precision=precision,
            checkpointing=Checkpointing(case.checkpointing),
            lora=case.lora,
            lora_backend=case.lora_backend,
        ).model
        pure = torch.bfloat16 if precision is Precision.BF16_PURE else None
        batch = make_inputs(case.inputs, case.micro_batch, float_dtype=pure)
        opt = make_optimizer(model.parameters(), Optimizer(case.optimizer), foreach=False)

        def step() -> None:
            with autocast_context(precision, "cpu"):
                loss = forward_and_loss(model, batch, case.loss)
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()
        with record_function("trainplan_step"):
            step()
    return peak_in_window(prof.profiler.kineto_results.events(), "trainplan_step")


def trace_case(case: Case) -> TraceResult:
    return trace_training_step(
        case.build,
        case.inputs,
        micro_batch=case.micro_batch,
        precision=case.precision,
        optimizer=case.optimizer,
        activation_checkpointing=case.checkpointing,
        loss=case.loss,
        lora=case.lora,
        lora_backend=case.lora_backend,
        device="cpu",
    )


def relative_error(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def agrees(predicted: float, measured: float, tolerance: float = TOLERANCE) -> bool:
    """True when ``predicted`` is within ``tolerance`` (relative) of ``measured``."""
    return measured > 0 and abs(relative_error(predicted, measured)) <= tolerance


# --------------------------------------------------------------------------- the proof


def test_profiler_measures_known_allocations() -> None:
    """The measuring tool itself: known allocations inside and outside the window."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        before = torch.empty(1 << 20, dtype=torch.uint8)  # 1 MiB, alive in the window
        with record_function("window"):
            a = torch.empty(3 << 20, dtype=torch.uint8)  # +3 MiB
            del a
            b = torch.empty(2 << 20, dtype=torch.uint8)  # +2 MiB
            del b
        del before
    assert peak_in_window(prof.profiler.kineto_results.events(), "window") == 4 << 20


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_traced_peak_matches_measured_cpu_peak(case: Case) -> None:
    if case.lora_backend == "peft" and not peft_available():
        pytest.skip("peft not installed")
    measured = measure_cpu_step_peak(case)
    result = trace_case(case)
    assert result.peak_bytes == result.at_peak.total
    assert agrees(result.peak_bytes, measured), (
        f"{case.name}: traced {result.peak_bytes:,} B vs measured {measured:,} B "
        f"({relative_error(result.peak_bytes, measured):+.1%}), peak in {result.peak_phase}"
    )


def test_comparison_reports_a_wrong_expectation() -> None:
    """The check can fail: a weights+gradients+optimizer-only estimate (no activations,
    what DeepSpeed's estimators give) is reported as a mismatch for a CNN whose peak is
    mostly activations, and so is a 20% overestimate."""
    case = next(c for c in CASES if c.name == "cnn fp32 sgd")
    measured = measure_cpu_step_peak(case)
    result = trace_case(case)
    states_only = result.state_bytes.total
    assert not agrees(states_only, measured)
    assert not agrees(measured * 1.2, measured)
    assert agrees(result.peak_bytes, measured)


# --------------------------------------------------------------------------- counts and FLOPs


@pytest.mark.parametrize("build", [mlp, cnn, UNet, llama, gpt2], ids=["mlp", "cnn", "unet", "llama", "gpt2-tied"])
def test_param_counts_are_exact(build: Callable[[], nn.Module]) -> None:
    real = build()
    expected = sum(p.numel() for p in real.parameters())
    inputs = TOK if build in (llama, gpt2) else (VEC if build is mlp else (IMG if build is cnn else GRAY))
    r = trace_training_step(build, inputs, micro_batch=2, precision="fp32", optimizer="sgd", device="cpu")
    assert r.params == expected
    assert r.trainable_params == expected
    # fp32 master weights: 4 bytes per parameter, plus buffers (BatchNorm statistics, rotary tables).
    buffers = sum(b.numel() * b.element_size() for b in real.buffers())
    assert r.state_bytes.parameters == 4 * expected + buffers
    assert r.state_bytes.gradients == 4 * expected
    assert r.state_bytes.optimizer >= 4 * expected  # SGD momentum: one fp32 buffer per parameter


def test_linear_stack_flops_are_2mnk_and_backward_doubles() -> None:
    m, k, n1, n2 = 64, 128, 256, 32

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(k, n1, bias=False), nn.ReLU(), nn.Linear(n1, n2, bias=False))

    forward = 2 * m * (k * n1 + n1 * n2)

    def leaf_batch(b: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(b, k, requires_grad=True),)

    with_input_grad = trace_training_step(build, leaf_batch, micro_batch=m, precision="fp32", device="cpu")
    assert with_input_grad.flops_forward == forward
    assert with_input_grad.flops_backward == 2 * forward  # grad wrt inputs and wrt weights
    assert with_input_grad.flops_recompute == 0

    plain = trace_training_step(build, [InputSpec(shape=(k,))], micro_batch=m, precision="fp32", device="cpu")
    assert plain.flops_backward == 2 * forward - 2 * m * k * n1  # no grad for the batch itself
    assert plain.flops_per_step == plain.flops_forward + plain.flops_backward


@pytest.mark.parametrize(("h_q", "h_kv"), [(8, 8), (8, 2), (32, 8)])
def test_fused_attention_flops_count_grouped_query_attention(h_q: int, h_kv: int) -> None:
    """trainplan's own formulas for the CPU flash-attention op: 2·b·h·s²·(d_q + d_v) forward and (3·d_q + 2·d_v)
    backward with the query heads — what PyTorch's GQA-aware formulas (torch >= 2.12) count, and what older PyTorch
    asserted on (grouped-query attention used to be untraceable there)."""
    from torch.utils import flop_counter

    from trainplan.estimate.trace.flops import EXTRA_FLOP_FORMULAS

    aten = torch.ops.aten
    fwd = EXTRA_FLOP_FORMULAS[aten._scaled_dot_product_flash_attention_for_cpu]
    bwd = EXTRA_FLOP_FORMULAS[aten._scaled_dot_product_flash_attention_for_cpu_backward]
    b, s, d = 2, 128, 64
    q, kv, out = (b, h_q, s, d), (b, h_kv, s, d), (b, h_q, s, d)
    assert fwd(q, kv, kv) == 2 * b * h_q * s * s * (d + d)
    assert bwd(out, q, kv, kv) == 2 * b * h_q * s * s * (3 * d + 2 * d)
    if h_q == h_kv or torch.__version__ >= "2.12":  # PyTorch's own formulas agree where they accept the shapes
        assert fwd(q, kv, kv) == flop_counter.sdpa_flop_count(q, kv, kv)
        assert bwd(out, q, kv, kv) == flop_counter.sdpa_backward_flop_count(out, q, kv, kv)
    with pytest.raises(ValueError):
        fwd((b, 6, s, d), (b, 4, s, d), (b, 4, s, d))  # 4 K/V heads cannot serve 6 query heads


def test_checkpointing_recomputes_and_lowers_activations() -> None:
    kwargs = dict(micro_batch=4, precision="bf16", loss="cross_entropy", device="cuda")
    none = trace_training_step(llama, TOK, activation_checkpointing="none", **kwargs)
    full = trace_training_step(llama, TOK, activation_checkpointing="full", **kwargs)
    selective = trace_training_step(llama, TOK, activation_checkpointing="selective", **kwargs)
    assert none.flops_recompute == 0
    assert 0 < full.flops_recompute <= full.flops_forward
    assert selective.flops_recompute < full.flops_recompute  # matmuls are saved, not recomputed
    assert full.flops_forward == none.flops_forward
    assert full.activation_peak_bytes < selective.activation_peak_bytes < none.activation_peak_bytes


def test_cuda_target_uses_fused_attention_even_with_dropout() -> None:
    """GPT-2 has attention dropout; on CPU PyTorch then materializes (B, H, S, S) attention
    weights, on CUDA FlashAttention does not.  The CUDA trace follows CUDA."""
    kwargs = {"micro_batch": 4, "precision": "bf16", "loss": "cross_entropy"}
    cpu = trace_training_step(gpt2, TOK, device="cpu", **kwargs)
    cuda = trace_training_step(gpt2, TOK, device="cuda", **kwargs)
    heads, seq = GPT2_TINY["n_head"], TOK[0].shape[0]
    attention_weights = 4 * heads * seq * seq * 2  # one layer's bf16 (B, H, S, S)
    assert cpu.activation_peak_bytes - cuda.activation_peak_bytes > attention_weights
    assert cuda.flops_forward == pytest.approx(cpu.flops_forward, rel=1e-6)


@pytest.mark.parametrize("backend", ["builtin", "peft"])
def test_lora_trainable_params_are_exact(backend: str) -> None:
    if backend == "peft" and not peft_available():
        pytest.skip("peft not installed")
    rank, h, layers = 8, LLAMA_TINY["hidden_size"], LLAMA_TINY["num_hidden_layers"]
    kv = h // LLAMA_TINY["num_attention_heads"] * LLAMA_TINY["num_key_value_heads"]
    per_layer = rank * (h + h) + rank * (h + kv)  # q_proj: h->h, v_proj: h->kv
    r = trace_training_step(
        llama, TOK, micro_batch=1, precision="bf16", loss="cross_entropy", lora=QV, lora_backend=backend, device="cpu"
    )
    base = sum(p.numel() for p in llama().parameters())
    assert r.trainable_params == layers * per_layer
    assert r.params == base + layers * per_layer
    # Only adapters have gradients and AdamW state (fp32 masters): 4 and 8 bytes each.
    assert r.state_bytes.gradients == 4 * r.trainable_params
    assert 8 * r.trainable_params <= r.state_bytes.optimizer <= 8 * r.trainable_params + 4 * 64
    # The frozen base is stored in bf16.
    assert r.state_bytes.parameters < 2.1 * base + 4 * r.trainable_params + 1e6


def test_qlora_counts_frozen_linear_weights_at_4_bits() -> None:
    lora = trace_training_step(llama, TOK, micro_batch=1, precision="bf16", loss="cross_entropy", lora=QV, device="cpu")
    qlora = trace_training_step(
        llama, TOK, micro_batch=1, precision="bf16", loss="cross_entropy", lora=QV, qlora=True, device="cpu"
    )
    real = llama()
    linear = sum(
        m.weight.numel() for n, m in real.named_modules() if isinstance(m, nn.Linear) and m is not real.lm_head
    )
    saved = lora.state_bytes.parameters - qlora.state_bytes.parameters
    assert saved == pytest.approx(linear * (2 - 4.127 / 8), rel=1e-3)
    assert any("qlora" in n for n in qlora.notes)


def test_adam8bit_state_is_two_bytes_per_parameter() -> None:
    r = trace_training_step(mlp, VEC, micro_batch=8, precision="bf16", optimizer="adam8bit", device="cpu")
    weights = 256 * 1024 + 1024 * 1024 + 1024 * 256  # >= 4096 elements each: 8-bit states
    biases = 1024 + 1024 + 256  # under 4096 elements: fp32 states
    expected = 2 * weights + 2 * 4 * (-(-256 * 1024 // 256) + -(-1024 * 1024 // 256) + -(-1024 * 256 // 256))
    assert r.state_bytes.optimizer == expected + 2 * 4 * biases


def test_peak_phase_and_breakdown_for_full_adamw() -> None:
    r = trace_training_step(mlp, VEC, micro_batch=8, precision="fp32", optimizer="adamw", device="cuda")
    n = r.params
    assert r.peak_phase == "optimizer"  # AdamW's foreach temporaries on top of all model states
    assert isinstance(r.at_peak, MemoryBreakdown)
    assert r.at_peak.parameters == r.state_bytes.parameters
    assert r.at_peak.gradients == r.state_bytes.gradients >= 4 * n
    assert r.state_bytes.optimizer >= 8 * n
    # foreach AdamW: one fp32 parameter-sized buffer (sqrt of exp_avg_sq), not an activation
    assert r.at_peak.temporaries == r.optimizer_temporary_bytes >= 4 * n
    assert r.activation_peak_bytes < r.optimizer_temporary_bytes
    assert r.state_bytes.activations == r.state_bytes.temporaries == 0
    assert r.peak_bytes % 512 == 0  # CUDA allocator rounding


# --------------------------------------------------------------------------- errors


def test_factory_path_that_does_not_import() -> None:
    with pytest.raises(TraceError, match="cannot import module 'no_such_pkg_trainplan.models' .*No module named"):
        load_factory("no_such_pkg_trainplan.models:build")


def test_factory_path_errors_name_the_problem() -> None:
    with pytest.raises(TraceError, match="has no attribute 'no_such_factory'"):
        load_factory("json:no_such_factory")
    with pytest.raises(TraceError, match="package.module:function"):
        load_factory("just_a_module")
    assert load_factory("json:dumps") is json.dumps


def test_factory_that_raises() -> None:
    def broken_factory() -> nn.Module:
        raise ValueError("channels must be positive")

    with pytest.raises(TraceError, match="factory .*broken_factory failed: ValueError: channels must be positive"):
        trace_training_step(broken_factory, VEC, micro_batch=2, device="cpu")


def test_factory_that_returns_no_module() -> None:
    with pytest.raises(TraceError, match="not a torch.nn.Module"):
        trace_training_step(lambda: 42, VEC, micro_batch=2, device="cpu")  # type: ignore[arg-type, return-value]


def test_batch_that_does_not_match_the_model() -> None:
    with pytest.raises(
        TraceError, match=r"inputs \[\(2, 100\) float32\] do not fit the model .*\[2, 100\] X \[256, 1024\]"
    ):
        trace_training_step(mlp, [InputSpec(shape=(100,))], micro_batch=2, device="cpu")


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.lin(x)
        return x


def test_data_dependent_control_flow() -> None:
    with pytest.raises(TraceError, match="data-dependent control flow"):
        trace_training_step(DataDependent, [InputSpec(shape=(8,))], micro_batch=2, device="cpu")


def test_bad_settings() -> None:
    with pytest.raises(TraceError, match="precision must be one of"):
        trace_training_step(mlp, VEC, micro_batch=2, precision="fp8")
    with pytest.raises(TraceError, match="loss must be"):
        trace_training_step(mlp, VEC, micro_batch=2, loss="hinge")
    with pytest.raises(TraceError, match="LoRA targets q_proj match no linear layer"):
        trace_training_step(mlp, VEC, micro_batch=2, lora=LoraSpec(rank=4, targets=("q_proj",)))


# --------------------------------------------------------------------------- scale


def test_llama_7b_traces_in_seconds_without_real_memory() -> None:
    psutil = pytest.importorskip("psutil")
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    )
    rss_before = psutil.Process().memory_info().rss
    start = time.perf_counter()
    r = trace_training_step(
        lambda: build_hf_causal_lm(config),
        [InputSpec(shape=(512,), dtype="int64", high=32000)],
        micro_batch=1,
        precision="bf16",
        loss="cross_entropy",
        device="cuda",
    )
    seconds = time.perf_counter() - start
    grown = psutil.Process().memory_info().rss - rss_before
    assert r.params == pytest.approx(6_738_415_616, rel=1e-3)
    assert seconds < 30, f"tracing LLaMA-7B took {seconds:.1f} s"
    assert grown < 1 << 30, f"tracing allocated {grown / 2**30:.1f} GiB of real memory"
    # fp32 master weights and gradients, two fp32 AdamW states: 16 bytes per parameter.
    assert r.state_bytes.parameters + r.state_bytes.gradients + r.state_bytes.optimizer == pytest.approx(
        16 * r.params, rel=1e-3
    )
    assert r.peak_bytes > 16 * r.params
    # 6 x params x tokens (Kaplan et al. 2020) is within 10% of the counted matmul FLOPs.
    assert r.flops_per_step == pytest.approx(6 * r.params * 512, rel=0.1)


# --------------------------------------------------------------------------- GPU benchmark script


def _gpu_validate() -> Any:
    path = REPO / "benchmarks" / "gpu_validate.py"
    spec = importlib.util.spec_from_file_location("gpu_validate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_validate"] = module
    spec.loader.exec_module(module)
    return module


def test_gpu_validate_grid_covers_the_issue() -> None:
    grid = _gpu_validate().GRID
    assert len(grid) >= 30
    assert {c.model for c in grid} >= {"gpt2-124m", "gpt2-1.5b", "llama-1b", "llama-7b"}
    assert any(c.lora for c in grid) and any(not c.lora for c in grid)
    assert {c.checkpointing for c in grid} >= {"none", "full"}
    assert len({c.micro_batch for c in grid}) >= 3
    assert min(c.seq for c in grid if c.is_lm) == 512 and max(c.seq for c in grid if c.is_lm) >= 2048
    # issue 22's mechanisms: eager attention, bf16-pure with a large vocabulary, an fp32 frozen LoRA base
    assert sum(c.attn == "eager" for c in grid) >= 3
    assert any(c.precision == "bf16-pure" and _vocab(c) > 100_000 for c in grid)
    assert any(c.fp32_base and c.lora for c in grid)


def _vocab(c: Any) -> int:
    return int(_gpu_validate().HF_MODELS.get(c.model, {}).get("vocab_size", 0))


def test_gpu_validate_calibrates_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU path's bookkeeping (calibration, OOM, errors, summary) with the GPU replaced by fixed numbers."""
    from trainplan.catalog import get_catalog

    module = _gpu_validate()
    flops = [1e15, 2e15, 1e15, 4e15, 1e15]
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(module.torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(module.torch.cuda, "get_device_properties", lambda *a: type("P", (), {"total_memory": 141e9}))
    monkeypatch.setattr(
        module,
        "trace_all",
        lambda cfgs, workers: [
            {"peak": 10 * 2**30, "reserved": 11 * 2**30, "phase": "backward", "flops": f, "seconds": 0.1, "breakdown": {}}
            for f in flops
        ],
    )
    measured = iter([(10 * 2**30, 11 * 2**30, 2.0), (11 * 2**30, 12 * 2**30, 4.0), (9 * 2**30, 10 * 2**30, 2.2), None,
                     (10 * 2**30, 11 * 2**30, 2.0)])  # fmt: skip

    def fake_measure(cfg: Any, snapshot: bool = False) -> tuple[int, int, float, float, list[Any]]:
        m = next(measured)
        if m is None:
            raise torch.cuda.OutOfMemoryError("out of memory")
        return (*m, m[2] / 10, [])

    monkeypatch.setattr(module, "measure_on_gpu", fake_measure)
    out = tmp_path / "gpu.json"
    assert module.main(["--limit", "5", "--workers", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "oom", "ok"]
    assert [r["calibration"] for r in rows] == [True, True, False, False, False]
    assert rows[1]["reserved_error"] == pytest.approx(11 / 12 - 1) and rows[3]["reserved_error"] is None
    assert report["peak_tflops"] == get_catalog().accelerators["H200"].peak_bf16_tflops  # the catalog's row, 989.5
    # 1e15 FLOP in 2 s on a 989.5 TFLOP/s GPU: 50.5% of peak; both calibration configs agree.
    assert report["efficiency"] == pytest.approx(1e15 / 2.0 / 989.5e12)
    assert rows[2]["time_error"] == pytest.approx(2.0 / 2.2 - 1)
    assert rows[1]["peak_error"] == pytest.approx(10 / 11 - 1)
    summary = report["summary"]
    assert summary["oom"] == 1 and summary["measured"] == 4
    assert summary["peak_error_worst"] == pytest.approx(10 / 9 - 1)
    # the planner's analytic estimate of the same job, against the same measurement
    assert rows[0]["analytic_allocated_bytes"] > 2**30 and rows[0]["analytic_step_seconds"] > 0
    assert rows[0]["analytic_allocated_error"] == pytest.approx(rows[0]["analytic_allocated_bytes"] / (10 * 2**30) - 1)
    assert rows[2]["analytic_time_error"] == pytest.approx(rows[2]["analytic_step_seconds"] / 2.2 - 1)
    assert rows[3]["analytic_allocated_error"] is None  # out of memory: nothing measured
    assert summary["analytic_allocated_error_median"] is not None


def test_gpu_validate_measures_a_configuration_without_a_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LoRA on an fp32 frozen base under autocast has no traced counterpart: it is measured against the analytic
    estimate alone, whose frozen_weights_fp32 knob counts the base at 4 bytes a parameter (more than the 16-bit base)."""
    module = _gpu_validate()
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(module.torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(module.torch.cuda, "get_device_properties", lambda *a: type("P", (), {"total_memory": 141e9}))
    monkeypatch.setattr(module, "measure_on_gpu", lambda cfg, snapshot=False: (30 * 2**30, 32 * 2**30, 0.1, 0.01, []))
    out = tmp_path / "gpu.json"
    assert module.main(["--only", "llama3.2-1b lora mb4 seq2048", "--workers", "1", "--out", str(out)]) == 0
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    fp32, half = rows["llama3.2-1b lora mb4 seq2048 ckpt-none fp32-base"], rows["llama3.2-1b lora mb4 seq2048 ckpt-none"]
    assert fp32["status"] == "ok" and fp32["peak_error"] is None and "no trace" in fp32["note"]
    assert fp32["analytic_allocated_error"] == pytest.approx(fp32["analytic_allocated_bytes"] / (30 * 2**30) - 1)
    # 1.24B parameters: 2 more bytes each for the fp32 base
    assert fp32["analytic_allocated_bytes"] - half["analytic_allocated_bytes"] > 2 * 1.2e9
    assert half["peak_error"] is not None  # the 16-bit base is traced as well


def test_gpu_validate_names_who_holds_the_peak() -> None:
    """The replay of a memory-history snapshot: the blocks alive at the largest running total, by allocating frame."""
    module = _gpu_validate()

    def frame(name: str, line: int) -> list[dict[str, Any]]:
        return [{"filename": "/x/gpu_validate.py", "line": 1, "name": "step"},
                {"filename": f"/site/transformers/{name}.py", "line": line, "name": name}]  # fmt: skip

    events = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": frame("mlp", 10)},
        {"action": "alloc", "addr": 2, "size": 300, "frames": frame("attn", 20)},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 3, "size": 50, "frames": frame("mlp", 10)},
        {"action": "alloc", "addr": 4, "size": 150, "frames": frame("mlp", 10)},  # peak: 300 + 50 + 150 = 500
        {"action": "free_completed", "addr": 2, "size": 300},
        {"action": "free_completed", "addr": 99, "size": 7},  # allocated before recording: ignored
    ]
    owners = module.peak_owners({"device_traces": [events]})
    assert owners[0] == {"owner": "transformers/attn.py:20 attn", "bytes": 300, "blocks": 1}
    assert owners[1] == {"owner": "transformers/mlp.py:10 mlp", "bytes": 200, "blocks": 2}
    assert owners[-1] == {"owner": "(total at peak)", "bytes": 500, "blocks": 3}


def test_gpu_validate_refuses_a_damaged_traces_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = _gpu_validate()
    bad = tmp_path / "traces.json"
    for text in ("{not json", '{"rows": 3}', "[]"):
        bad.write_text(text)
        assert module.main(["--dry-run", "--traces", str(bad), "--out", str(tmp_path / "o.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --traces:") and err.count("\n") == 1
    assert not (tmp_path / "o.json").exists()


def test_gpu_validate_dry_run(tmp_path: Path) -> None:
    module = _gpu_validate()
    out = tmp_path / "table.json"
    assert module.main(["--dry-run", "--only", "gpt2-124m", "--limit", "2", "--workers", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2
    assert all(row["predicted_peak_bytes"] > 0 and row["flops_per_step"] > 0 for row in rows)


# --------------------------------------------------------------------------- the table for docs/trace.md


def _print_table() -> None:
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs\n")
    print("| configuration | traced peak (MiB) | measured peak (MiB) | error | peak phase |")
    print("|---|---:|---:|---:|---|")
    for case in CASES:
        if case.lora_backend == "peft" and not peft_available():
            continue
        measured = measure_cpu_step_peak(case)
        r = trace_case(case)
        print(
            f"| {case.name} | {r.peak_bytes / 2**20:.2f} | {measured / 2**20:.2f} | "
            f"{relative_error(r.peak_bytes, measured):+.1%} | {r.peak_phase} |"
        )


if __name__ == "__main__":
    _print_table()
