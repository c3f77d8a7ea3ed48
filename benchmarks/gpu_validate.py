#!/usr/bin/env python
"""Validate traced memory and step-time predictions on one CUDA GPU.

For each configuration of a grid (GPT-2 124M-1.5B and LLaMA-style 1B-7B
layouts with random weights, a ResNet and a U-Net; full fine-tuning and LoRA;
bf16 mixed precision; activation checkpointing off / full / selective; several
micro-batches; sequence 512-2048) it

1. traces one training step on the fake device with
   ``trainplan.estimate.trace.trace_training_step(device="cuda")`` (on CPU, in
   a pool of worker processes, before the GPU is touched);
2. runs the real step on the GPU with a plain training loop (autocast bf16,
   ``loss.backward()``, ``optimizer.step()``, ``zero_grad(set_to_none=True)``):
   2 warm-up steps, then 3 timed steps, after ``torch.cuda.reset_peak_memory_stats()``;
3. compares the traced peak with ``torch.cuda.max_memory_allocated()`` and the
   predicted step time with the measured one;
4. compares the planner's own analytic estimate of the same job (what ``trainplan
   estimate`` prints for the catalog's H200, one GPU, default efficiencies: nothing
   calibrated here) with the measured allocated and reserved peaks and step time.

The grid also holds issue 22's mechanisms: eager attention (the s x s scores kept),
bf16-pure with 128K-152K vocabularies, and LoRA with an fp32 frozen base under bf16
autocast (no traced counterpart: analytic only).

Step time is predicted as ``flops_per_step / (peak_flops * efficiency)``.
``peak_flops`` is the GPU's dense bf16 tensor peak, the catalog's row for
``torch.cuda.get_device_name()`` (accelerators.csv, with its datasheet source) or
``--peak-tflops``; ``efficiency`` is calibrated on this GPU as the
mean achieved fraction of peak over the first ``--calibrate`` (2) measured
configurations, which are then left out of the time-error statistics.

Configurations that run out of memory are recorded as ``oom``; the run stops
starting new configurations when ``--time-budget-s`` is spent (default 420 s, so
the whole script stays under 8 minutes on one H200).  ``--dry-run`` traces on
CPU only and prints predictions (no CUDA needed).

Needs only torch and transformers; trainplan is imported from ``src/`` of this
repository.  Usage::

    python benchmarks/gpu_validate.py --out gpu_validate.json
    python benchmarks/gpu_validate.py --dry-run --limit 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from torch import nn  # noqa: E402

from trainplan.estimate.trace import build_hf_causal_lm, trace_training_step  # noqa: E402
from trainplan.estimate.trace.inputs import make_inputs  # noqa: E402
from trainplan.estimate.trace.optimizers import make_optimizer  # noqa: E402
from trainplan.estimate.trace.prepare import prepare_model  # noqa: E402
from trainplan.spec import Checkpointing, InputSpec, LoraSpec, Optimizer, Precision  # noqa: E402

# Without --peak-tflops the GPU's dense bf16 peak comes from the catalog (catalog/data/accelerators.csv, each row with
# its datasheet source), found from the driver's name as `trainplan probe` finds it (measure/probe.canonical_gpu_id).

# --------------------------------------------------------------------------- models

HF_MODELS: dict[str, dict[str, Any]] = {
    # GPT-2 family (Radford et al. 2019, Table 2); vocab 50257, context 1024 (2048 here to allow longer runs).
    "gpt2-124m": dict(model_type="gpt2", n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=2048),
    "gpt2-355m": dict(model_type="gpt2", n_embd=1024, n_layer=24, n_head=16, vocab_size=50257, n_positions=2048),
    "gpt2-774m": dict(model_type="gpt2", n_embd=1280, n_layer=36, n_head=20, vocab_size=50257, n_positions=2048),
    "gpt2-1.5b": dict(model_type="gpt2", n_embd=1600, n_layer=48, n_head=25, vocab_size=50257, n_positions=2048),
    # LLaMA-style layouts: TinyLlama-1.1B, OpenLLaMA-3B, LLaMA-7B (Touvron et al. 2023, Table 2).
    "llama-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        max_position_embeddings=2048,
    ),
    "llama-3b": dict(
        model_type="llama",
        hidden_size=3200,
        intermediate_size=8640,
        num_hidden_layers=26,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=2048,
    ),
    "llama-7b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=2048,
    ),
    # 2024-2026 small families with large vocabularies (the cross-entropy and logits terms dominate at long
    # sequences): Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json) and Qwen2.5 0.5B (Qwen/Qwen2.5-0.5B config.json:
    # q/k/v biases, tied head).
    "llama3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    # held-out shapes (HELDOUT_GRID): SmolLM2-360M, Qwen2.5-1.5B, Mistral-7B-v0.1 and Llama-3.2-3B config.json values
    "smollm2-360m": dict(
        model_type="llama",
        hidden_size=960,
        intermediate_size=2560,
        num_hidden_layers=32,
        num_attention_heads=15,
        num_key_value_heads=5,
        vocab_size=49152,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
    "mistral-7b": dict(
        model_type="mistral",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=32768,
        rope_theta=10000.0,
        sliding_window=None,
    ),
    "llama3.2-3b": dict(
        model_type="llama",
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=True,
    ),
}
for _cfg in HF_MODELS.values():
    if _cfg["model_type"] == "gpt2":
        _cfg.update(bos_token_id=0, eos_token_id=0)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.skip(x))


class ResNet18(nn.Module):
    """ResNet-18 (He et al. 2016, Table 1), 1000 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        widths = [64, 128, 256, 512]
        blocks: list[nn.Module] = []
        cin = 64
        for i, w in enumerate(widths):
            blocks += [_BasicBlock(cin, w, 1 if i == 0 else 2), _BasicBlock(w, w, 1)]
            cin = w
        self.layers = nn.Sequential(*blocks)
        self.head = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


class UNet(nn.Module):
    """A 4-level U-Net (Ronneberger et al. 2015) with base width 32."""

    def __init__(self, c: int = 32) -> None:
        super().__init__()

        def block(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.ReLU())

        self.down = nn.ModuleList([block(3, c), block(c, 2 * c), block(2 * c, 4 * c), block(4 * c, 8 * c)])
        self.up = nn.ModuleList([block(16 * c, 4 * c), block(8 * c, 2 * c), block(4 * c, c), block(2 * c, c)])
        self.mid = block(8 * c, 8 * c)
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


def build_model(name: str, attn: str = "sdpa") -> nn.Module:
    if name in HF_MODELS:
        return build_hf_causal_lm({**HF_MODELS[name], "attn_implementation": attn})
    if name == "resnet18":
        return ResNet18()
    if name == "unet":
        return UNet()
    raise ValueError(f"unknown model {name!r}")


# --------------------------------------------------------------------------- grid


@dataclass(frozen=True)
class Config:
    model: str
    micro_batch: int
    seq: int = 0  # tokens per sample (language models) or image side (vision models)
    lora: bool = False
    checkpointing: str = "none"
    precision: str = "bf16"
    optimizer: str = "adamw"
    attn: str = "sdpa"  # transformers' attn_implementation: "eager" keeps the s x s scores for backward
    # LoRA under bf16 autocast with the frozen base kept in fp32 (Lightning / LitGPT "bf16-mixed"; issue 22); the
    # trace has no such precision, so only the analytic estimate (knob frozen_weights_fp32) is compared
    fp32_base: bool = False

    @property
    def name(self) -> str:
        method = "lora" if self.lora else "full"
        shape = f"{'seq' if self.is_lm else 'img'}{self.seq}"
        extra = "".join(
            [f" {self.precision}" if self.precision != "bf16" else "", " eager" if self.attn == "eager" else "",
             " fp32-base" if self.fp32_base else ""]
        )  # fmt: skip
        return f"{self.model} {method} mb{self.micro_batch} {shape} ckpt-{self.checkpointing}{extra}"

    @property
    def is_lm(self) -> bool:
        return self.model in HF_MODELS

    @property
    def loss(self) -> str:
        return "cross_entropy" if self.model != "unet" else "mse"

    def inputs(self) -> tuple[InputSpec, ...]:
        if self.is_lm:
            vocab = HF_MODELS[self.model]["vocab_size"]
            return (InputSpec(shape=(self.seq,), dtype="int64", high=vocab),)
        return (InputSpec(shape=(3, self.seq, self.seq)),)

    def lora_spec(self) -> LoraSpec | None:
        if not self.lora:
            return None
        targets = ("q_proj", "k_proj", "v_proj", "o_proj") if self.model.startswith("llama") else ("all-linear",)
        return LoraSpec(rank=16, targets=targets)


GRID: tuple[Config, ...] = (
    # calibration configs first: mid-size, compute-bound
    Config("gpt2-355m", 8, 1024),
    Config("llama-1b", 4, 2048, checkpointing="full"),
    Config("gpt2-124m", 8, 1024),
    Config("gpt2-124m", 16, 1024, checkpointing="full"),
    Config("gpt2-124m", 8, 512, precision="fp32"),
    Config("gpt2-124m", 8, 2048, lora=True),
    Config("gpt2-355m", 4, 1024, checkpointing="full"),
    Config("gpt2-355m", 8, 1024, lora=True),
    Config("gpt2-774m", 4, 1024),
    Config("gpt2-774m", 8, 1024, checkpointing="full"),
    Config("gpt2-774m", 8, 1024, lora=True, checkpointing="full"),
    Config("gpt2-1.5b", 2, 1024),
    Config("gpt2-1.5b", 8, 1024, checkpointing="full"),
    Config("gpt2-1.5b", 4, 1024, lora=True),
    Config("gpt2-1.5b", 8, 2048, lora=True, checkpointing="full"),
    Config("llama-1b", 2, 2048),
    Config("llama-1b", 4, 2048, checkpointing="selective"),
    Config("llama-1b", 8, 1024, lora=True),
    Config("llama-1b", 8, 2048, lora=True, checkpointing="full"),
    Config("llama-3b", 2, 512),
    Config("llama-3b", 2, 2048, checkpointing="full"),
    Config("llama-3b", 2, 2048, lora=True),
    Config("llama-3b", 4, 2048, lora=True, checkpointing="selective"),
    Config("llama-7b", 1, 512, checkpointing="full"),
    Config("llama-7b", 1, 2048, lora=True),
    Config("llama-7b", 2, 2048, lora=True, checkpointing="full"),
    Config("llama-7b", 4, 1024, lora=True, checkpointing="full"),
    Config("llama-7b", 8, 512, lora=True, checkpointing="selective"),
    # issue 22's mechanisms, on the same loop: eager attention that keeps its s x s scores, bf16-pure with a large
    # vocabulary (cross-entropy on bf16 logits), LoRA with an fp32 frozen base under autocast, and 2024-2026 families
    Config("gpt2-124m", 8, 1024, attn="eager"),
    Config("gpt2-355m", 4, 1024, lora=True, attn="eager"),
    Config("llama-1b", 2, 2048, attn="eager"),
    Config("llama-1b", 4, 1024, lora=True, checkpointing="full", attn="eager"),
    Config("llama3.2-1b", 4, 2048),
    Config("llama3.2-1b", 4, 2048, precision="bf16-pure"),
    Config("llama3.2-1b", 8, 2048, precision="bf16-pure", checkpointing="full"),
    Config("llama3.2-1b", 4, 2048, lora=True),
    Config("llama3.2-1b", 4, 2048, lora=True, fp32_base=True),
    Config("llama-7b", 2, 1024, lora=True, checkpointing="full", fp32_base=True),
    Config("qwen2.5-0.5b", 8, 2048),
    Config("qwen2.5-0.5b", 8, 4096, precision="bf16-pure", checkpointing="full"),
    Config("qwen2.5-0.5b", 8, 2048, lora=True, attn="eager"),
    Config("resnet18", 128, 224),
    Config("resnet18", 256, 224, checkpointing="full"),
    Config("unet", 16, 256),
    Config("unet", 32, 256, checkpointing="full"),
)

# A held-out grid, fixed on 2026-12-04 after the first H200 run of GRID and before any estimator change that run
# suggested: models and shapes GRID does not have. Do not edit it, and do not choose a change by its figures; report it
# apart from GRID (docs/benchmarks.md). Selected with --grid heldout.
HELDOUT_GRID: tuple[Config, ...] = (
    Config("smollm2-360m", 8, 2048),
    Config("smollm2-360m", 16, 1024, lora=True, checkpointing="full"),
    Config("qwen2.5-1.5b", 4, 2048, checkpointing="full"),
    Config("qwen2.5-1.5b", 4, 2048, precision="bf16-pure"),
    Config("qwen2.5-1.5b", 8, 2048, lora=True),
    Config("mistral-7b", 2, 2048, lora=True, checkpointing="full"),
    Config("mistral-7b", 4, 4096, lora=True, checkpointing="full"),
    Config("mistral-7b", 1, 1024, precision="bf16-pure", checkpointing="full"),
    Config("llama3.2-3b", 2, 4096, checkpointing="full"),
    Config("llama3.2-3b", 4, 2048, lora=True, attn="eager"),
    Config("gpt2-355m", 4, 1024, precision="fp32"),
    Config("gpt2-774m", 4, 1024, attn="eager"),
)

# --------------------------------------------------------------------------- trace


@dataclass
class Row:
    config: str
    status: str = "pending"  # ok | oom | error | skipped | traced
    predicted_peak_bytes: int = 0
    predicted_peak_phase: str = ""
    flops_per_step: float = 0.0
    trace_seconds: float = 0.0
    measured_peak_bytes: int | None = None
    peak_error: float | None = None
    predicted_reserved_bytes: int = 0  # the trace's own allocations through the caching-allocator simulation
    measured_reserved_bytes: int | None = None  # torch.cuda.max_memory_reserved
    reserved_error: float | None = None
    measured_step_seconds: float | None = None
    predicted_step_seconds: float | None = None
    time_error: float | None = None
    calibration: bool = False
    # the planner's own analytic estimate of the same job on the catalog's H200, single GPU, default efficiencies
    # (what `trainplan estimate` prints; nothing calibrated on this run)
    analytic_allocated_bytes: int | None = None
    analytic_reserved_bytes: int | None = None
    analytic_step_seconds: float | None = None
    analytic_allocated_error: float | None = None
    analytic_reserved_error: float | None = None
    analytic_time_error: float | None = None
    # where the time goes: the optimizer step alone (CUDA events around opt.step()), and the analytic terms
    measured_optimizer_seconds: float | None = None
    analytic_optimizer_seconds: float | None = None
    analytic_compute_seconds: float | None = None
    peak_owners: list[dict[str, Any]] = field(default_factory=list)  # --snapshot: who holds the allocated peak
    note: str = ""
    breakdown: dict[str, int] = field(default_factory=dict)


def trace_config(cfg: Config) -> dict[str, Any]:
    """Trace one configuration on the fake device (CPU); returns a plain dict (picklable)."""
    start = time.perf_counter()
    if cfg.fp32_base:
        raise ValueError("no traced counterpart (fp32 frozen base under autocast)")
    r = trace_training_step(
        lambda: build_model(cfg.model, cfg.attn),
        cfg.inputs(),
        micro_batch=cfg.micro_batch,
        precision=cfg.precision,
        optimizer=cfg.optimizer,
        activation_checkpointing=cfg.checkpointing,
        loss=cfg.loss,
        lora=cfg.lora_spec(),
        device="cuda",
    )
    return {
        "peak": r.peak_bytes,
        "reserved": int(r.peak_bytes + r.reserve_bytes),
        "phase": r.peak_phase,
        "flops": r.flops_per_step,
        "seconds": time.perf_counter() - start,
        "breakdown": asdict(r.at_peak),
    }


def analytic_config(cfg: Config, accelerator: str = "H200") -> dict[str, Any]:
    """The planner's analytic estimate of ``cfg`` on one catalog GPU (language models only)."""
    from trainplan.catalog import get_catalog
    from trainplan.estimate.hardware import hardware_for_gpu
    from trainplan.estimate.transformer import estimate_transformer
    from trainplan.hfconfig import arch_from_hf_config
    from trainplan.spec import parse_job
    from trainplan.strategies import Strategy

    if not cfg.is_lm:
        raise ValueError("no analytic counterpart (not a language model)")
    data: dict[str, Any] = {
        "kind": "transformer", "name": cfg.name.replace(" ", "_"), "model": arch_from_hf_config(dict(HF_MODELS[cfg.model])),
        "method": "lora" if cfg.lora else "full", "seq_len": cfg.seq, "micro_batch": cfg.micro_batch,
        "precision": cfg.precision, "optimizer": cfg.optimizer, "activation_checkpointing": cfg.checkpointing,
        "steps": 1, "stack": "plain",
    }  # fmt: skip
    lora = cfg.lora_spec()
    if lora is not None:
        data["lora"] = {"rank": lora.rank, "targets": list(lora.targets)}
    if cfg.attn == "eager":
        data["flash_attention"] = False
    if cfg.fp32_base:
        data["knobs"] = {"frozen_weights_fp32": True}
    cat = get_catalog()
    hw = hardware_for_gpu(cat.accelerators[accelerator], cat, gpus=1, nodes=1)
    e = estimate_transformer(parse_job(data), hw, Strategy.SINGLE, cat)
    return {"allocated": e.memory.allocated, "reserved": e.memory.reserved, "step_s": e.step_time_s,
            "optimizer_s": e.time_breakdown.get("optimizer_s"), "compute_s": e.time_breakdown.get("compute_s")}  # fmt: skip


def _from_earlier(row: dict[str, Any] | None) -> dict[str, Any] | str:
    """An earlier run's traced prediction, in trace_config's form; its note when it had none."""
    if row is None:
        return "not in the earlier run"
    if not row.get("flops_per_step"):
        return str(row.get("note") or "no trace in the earlier run")
    return {"peak": row["predicted_peak_bytes"], "reserved": row["predicted_reserved_bytes"],
            "phase": row["predicted_peak_phase"], "flops": row["flops_per_step"], "seconds": row["trace_seconds"],
            "breakdown": row.get("breakdown", {})}  # fmt: skip


def trace_all(configs: Sequence[Config], workers: int) -> list[dict[str, Any] | str]:
    """Trace every configuration; an error becomes its one-line message."""

    def safe(cfg: Config) -> dict[str, Any] | str:
        try:
            return trace_config(cfg)
        except Exception as exc:  # noqa: BLE001 - recorded per configuration
            return f"{type(exc).__name__}: {exc}".splitlines()[0]

    if workers <= 1:
        return [safe(c) for c in configs]
    out: list[dict[str, Any] | str] = []
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=get_context("spawn"), initializer=torch.set_num_threads, initargs=(1,)
    ) as pool:
        futures = [pool.submit(trace_config, c) for c in configs]
        for f in futures:
            try:
                out.append(f.result())
            except Exception as exc:  # noqa: BLE001
                out.append(f"{type(exc).__name__}: {exc}".splitlines()[0])
    return out


# --------------------------------------------------------------------------- measure


def peak_owners(snapshot: dict[str, Any], top: int = 25) -> list[dict[str, Any]]:
    """The blocks alive when the allocated total peaked, grouped by the innermost Python frame that allocated them.

    ``snapshot`` is ``torch.cuda.memory._snapshot()`` taken with ``_record_memory_history`` on: its
    ``device_traces`` events (``alloc`` / ``free_completed`` with ``addr``, ``size`` and ``frames``) are replayed in
    order; the set alive at the largest running total is grouped by ``file:line name`` of its first frame in
    Python source (PyTorch's or transformers' own, not this script's loop), largest first.
    """
    alive: dict[int, tuple[int, str]] = {}
    total = best = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for trace in snapshot.get("device_traces", []):
        for ev in trace:
            action, addr, size = ev.get("action"), ev.get("addr"), int(ev.get("size", 0))
            if action == "alloc":
                alive[addr] = (size, _owner(ev.get("frames") or []))
                total += size
                if total > best:
                    best, at_peak = total, dict(alive)
            elif action in ("free_completed",) and addr in alive:
                total -= alive.pop(addr)[0]
    groups: dict[str, list[int]] = {}
    for size, owner in at_peak.values():
        g = groups.setdefault(owner, [0, 0])
        g[0] += size
        g[1] += 1
    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
    return [{"owner": k, "bytes": v[0], "blocks": v[1]} for k, v in ranked] + [{"owner": "(total at peak)", "bytes": best,
                                                                               "blocks": len(at_peak)}]  # fmt: skip


def _owner(frames: list[dict[str, Any]]) -> str:
    """``file:line function`` of the first Python frame (innermost) outside this script's loop, else the first."""
    py = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    for f in py:
        name = str(f.get("filename", ""))
        if "gpu_validate" in name or "/autograd/" in name:
            continue
        tail = "/".join(name.split("/")[-2:])
        return f"{tail}:{f.get('line')} {f.get('name')}"
    f = (py or frames or [{}])[0]
    return f"{f.get('filename', '?')}:{f.get('line', '?')} {f.get('name', '?')}"


def measure_on_gpu(cfg: Config, warmup: int = 2, timed: int = 3,
                   snapshot: bool = False) -> tuple[int, int, float, float, list[dict[str, Any]]]:  # fmt: skip
    """(max_memory_allocated, max_memory_reserved over the timed steps, mean seconds per step, mean seconds of the
    optimizer step alone, the owners of the peak — only with ``snapshot``) of the real step.

    The model, optimizer and batch are locals: they are freed when this returns
    (the caller then empties the CUDA cache before the next configuration).
    """
    precision = Precision(cfg.precision)
    with torch.device("cuda"):
        model = build_model(cfg.model, cfg.attn)
        # an fp32 frozen base: prepared as fp32 (base and adapters stay fp32), then run under bf16 autocast below
        stored = Precision.FP32 if cfg.fp32_base else precision
        model = prepare_model(
            model, precision=stored, checkpointing=Checkpointing(cfg.checkpointing), lora=cfg.lora_spec()
        ).model
        (x,) = make_inputs(cfg.inputs(), cfg.micro_batch)
        target = x  # language models: the labels are the inputs
        if cfg.model == "resnet18":
            target = torch.zeros(cfg.micro_batch, dtype=torch.long)
        elif cfg.model == "unet":
            target = torch.zeros(cfg.micro_batch, 1, cfg.seq, cfg.seq)
    # building in fp32 and casting leaves the fp32 segments cached: a LoRA 7B then "reserves" 38 GiB for a 15 GiB peak
    # (the runs of 2026-12-04 recorded that). A model loaded in its dtype never holds them, so drop them first.
    torch.cuda.empty_cache()
    opt = make_optimizer(model.parameters(), Optimizer(cfg.optimizer))  # PyTorch's CUDA default: foreach
    autocast_on = precision in (Precision.BF16, Precision.FP16)  # fp32_base: precision is bf16, so autocast on
    half = torch.float16 if precision is Precision.FP16 else torch.bfloat16

    opt_events: list[tuple[Any, Any]] = []

    def step(timed_step: bool = False) -> None:
        with torch.autocast("cuda", dtype=half, enabled=autocast_on):
            if cfg.is_lm:
                loss = model(input_ids=x, labels=target).loss
            elif cfg.model == "resnet18":
                loss = nn.functional.cross_entropy(model(x), target)
            else:
                loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        del loss
        if timed_step:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            opt.step()
            b.record()
            opt_events.append((a, b))
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()  # reserved keeps the segments of the warm-up steps, as in training
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(timed):
        step(timed_step=True)
    end.record()
    torch.cuda.synchronize()
    seconds = begin.elapsed_time(end) / 1000 / timed
    opt_seconds = sum(a.elapsed_time(b) for a, b in opt_events) / 1000 / timed
    peak, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    owners: list[dict[str, Any]] = []
    if snapshot:  # one more step, recorded (after the timed ones, so the timing carries no recording cost)
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        step()
        torch.cuda.synchronize()
        owners = peak_owners(torch.cuda.memory._snapshot())
        torch.cuda.memory._record_memory_history(enabled=None)
    return peak, reserved, seconds, opt_seconds, owners


def peak_tflops_for(device_name: str, override: float | None, memory_gib: float = 0.0) -> float:
    """The dense bf16 peak of the GPU the driver names, from the catalog; ``override`` wins."""
    if override is not None:
        return override
    from trainplan.catalog import get_catalog
    from trainplan.measure.probe import canonical_gpu_id

    acc = get_catalog().accelerators.get(canonical_gpu_id(device_name, memory_gib))
    if acc is None or not acc.peak_bf16_tflops:
        raise SystemExit(f"no catalog row for GPU {device_name!r}; give --peak-tflops")
    return float(acc.peak_bf16_tflops)


# --------------------------------------------------------------------------- report


def _fmt_pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.1%}"


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    mem = [abs(r.peak_error) for r in rows if r.peak_error is not None]
    res = [abs(r.reserved_error) for r in rows if r.reserved_error is not None]
    tim = [abs(r.time_error) for r in rows if r.time_error is not None and not r.calibration]
    return {
        "measured": len(mem),
        "oom": sum(r.status == "oom" for r in rows),
        "errors": sum(r.status == "error" for r in rows),
        "skipped": sum(r.status == "skipped" for r in rows),
        "peak_error_median": statistics.median(mem) if mem else None,
        "peak_error_worst": max(mem) if mem else None,
        "peak_within_10pct": sum(e <= 0.10 for e in mem),
        "reserved_error_median": statistics.median(res) if res else None,
        "reserved_within_10pct": sum(e <= 0.10 for e in res),
        "time_error_median": statistics.median(tim) if tim else None,
        "time_error_worst": max(tim) if tim else None,
        "time_within_15pct": sum(e <= 0.15 for e in tim),
        **_analytic_summary(rows),
    }


def _analytic_summary(rows: Sequence[Row]) -> dict[str, Any]:
    """The analytic estimate's errors: nothing here was calibrated on this run, so every row is out of sample."""
    out: dict[str, Any] = {}
    for key in ("allocated", "reserved", "time"):
        errs = [abs(e) for r in rows if (e := getattr(r, f"analytic_{key}_error")) is not None]
        out[f"analytic_{key}_error_median"] = statistics.median(errs) if errs else None
        out[f"analytic_{key}_error_worst"] = max(errs) if errs else None
        out[f"analytic_{key}_within_10pct"] = sum(e <= 0.10 for e in errs)
    return out


def print_analytic_table(rows: Sequence[Row]) -> None:
    gib = 2**30

    def g(x: int | None) -> str:
        return "" if x is None else f"{x / gib:.2f}"

    def ms(x: float | None) -> str:
        return "" if x is None else f"{x * 1e3:.0f}"

    print(f"{'configuration':52s} {'alloc':>7s} {'meas':>7s} {'err':>7s} {'resv':>7s} {'meas':>7s} {'err':>7s} "
          f"{'ms':>7s} {'meas':>7s} {'err':>7s}")  # fmt: skip
    for r in rows:
        if r.analytic_allocated_bytes is None:
            continue
        print(
            f"{r.config:52s} {g(r.analytic_allocated_bytes):>7s} {g(r.measured_peak_bytes):>7s} "
            f"{_fmt_pct(r.analytic_allocated_error):>7s} {g(r.analytic_reserved_bytes):>7s} "
            f"{g(r.measured_reserved_bytes):>7s} {_fmt_pct(r.analytic_reserved_error):>7s} "
            f"{ms(r.analytic_step_seconds):>7s} {ms(r.measured_step_seconds):>7s} {_fmt_pct(r.analytic_time_error):>7s}"
        )


def print_table(rows: Sequence[Row]) -> None:
    gib = 2**30
    print(
        f"{'configuration':44s} {'pred GiB':>9s} {'meas GiB':>9s} {'err':>7s} {'res pred':>9s} {'res meas':>9s} {'err':>7s} {'phase':>9s} "
        f"{'pred ms':>8s} {'meas ms':>8s} {'err':>7s}  status"
    )
    for r in rows:
        meas = "" if r.measured_peak_bytes is None else f"{r.measured_peak_bytes / gib:.2f}"
        rmeas = "" if r.measured_reserved_bytes is None else f"{r.measured_reserved_bytes / gib:.2f}"
        pms = "" if r.predicted_step_seconds is None else f"{r.predicted_step_seconds * 1e3:.0f}"
        mms = "" if r.measured_step_seconds is None else f"{r.measured_step_seconds * 1e3:.0f}"
        print(
            f"{r.config:44s} {r.predicted_peak_bytes / gib:9.2f} {meas:>9s} {_fmt_pct(r.peak_error):>7s} "
            f"{r.predicted_reserved_bytes / gib:9.2f} {rmeas:>9s} {_fmt_pct(r.reserved_error):>7s} "
            f"{r.predicted_peak_phase:>9s} {pms:>8s} {mms:>8s} {_fmt_pct(r.time_error):>7s}  "
            f"{r.status}{' (calibration)' if r.calibration else ''}{' ' + r.note if r.note else ''}"
        )


# --------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_validate.json", help="JSON file for the table")
    parser.add_argument("--dry-run", action="store_true", help="trace on CPU only, print predictions, no CUDA")
    parser.add_argument("--limit", type=int, default=None, help="only the first N configurations")
    parser.add_argument("--only", default=None, help="only configurations whose name contains this text")
    parser.add_argument(
        "--peak-tflops", type=float, default=None, help="dense bf16 peak of the GPU (default: the catalog's row for the driver's name)"
    )
    parser.add_argument("--calibrate", type=int, default=2, help="configurations that calibrate the efficiency")
    parser.add_argument(
        "--workers", type=int, default=None, help="processes for tracing (default: one per CPU, at most 8; 1 = in this process)"
    )
    parser.add_argument(
        "--time-budget-s", type=float, default=420.0, help="start no new GPU run after this many seconds"
    )
    parser.add_argument("--grid", choices=("main", "heldout", "all"), default="main",
                        help="GRID (in-sample), HELDOUT_GRID (held out) or both")  # fmt: skip
    parser.add_argument("--traces", default=None,
                        help="reuse the traced predictions of an earlier run's JSON (a --dry-run elsewhere) by name")
    parser.add_argument("--snapshot", action="append", default=[],
                        help="record one more step of configurations whose name contains this text and report who "
                             "holds the allocated peak (repeatable)")  # fmt: skip
    args = parser.parse_args(argv)

    started = time.perf_counter()
    grid = {"main": GRID, "heldout": HELDOUT_GRID, "all": GRID + HELDOUT_GRID}[args.grid]
    configs = [c for c in grid if args.only is None or args.only in c.name]
    if args.limit is not None:
        configs = configs[: args.limit]
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device; use --dry-run", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else min(8, os.cpu_count() or 1)

    if args.traces:
        try:
            earlier = {r["config"]: r for r in json.loads(Path(args.traces).read_text())["rows"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: --traces: {args.traces} is not a gpu_validate JSON report ({type(exc).__name__}: {exc})",
                  file=sys.stderr)  # fmt: skip
            return 2
        traced = [_from_earlier(earlier.get(c.name)) for c in configs]
    else:
        traced = trace_all(configs, workers)
    rows: list[Row] = []
    for cfg, t in zip(configs, traced, strict=True):
        row = Row(cfg.name)
        try:
            a = analytic_config(cfg)
            row.analytic_allocated_bytes, row.analytic_reserved_bytes = int(a["allocated"]), int(a["reserved"])
            row.analytic_step_seconds = float(a["step_s"])
            row.analytic_optimizer_seconds, row.analytic_compute_seconds = a["optimizer_s"], a["compute_s"]
        except Exception as exc:  # noqa: BLE001 - recorded per configuration
            row.note = f"analytic: {type(exc).__name__}: {exc}".splitlines()[0]
        if isinstance(t, str):
            if row.analytic_allocated_bytes is None:
                row.status, row.note = "error", f"trace failed: {t}; {row.note}"
            else:
                row.status, row.note = "traced", f"no trace ({t})"
        else:
            row.status = "traced"
            row.predicted_peak_bytes, row.predicted_peak_phase = int(t["peak"]), str(t["phase"])
            row.predicted_reserved_bytes = int(t["reserved"])
            row.flops_per_step, row.trace_seconds, row.breakdown = (
                float(t["flops"]),
                float(t["seconds"]),
                t["breakdown"],
            )
        rows.append(row)
    print(f"traced {len(configs)} configurations in {time.perf_counter() - started:.1f} s")

    device_name = "cpu (dry run)"
    peak_flops = peak_tflops_for("NVIDIA H100 80GB HBM3", args.peak_tflops, 80.0) * 1e12  # the dry run's reference
    efficiency: float | None = None
    if not args.dry_run:
        device_name = torch.cuda.get_device_name()
        memory_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
        peak_flops = peak_tflops_for(device_name, args.peak_tflops, memory_gib) * 1e12
        achieved: list[float] = []
        for cfg, row in zip(configs, rows, strict=True):
            if row.status != "traced":
                continue
            if time.perf_counter() - started > args.time_budget_s:
                row.status, row.note = "skipped", "time budget spent"
                continue
            failure = ""
            try:
                wants = any(text in cfg.name for text in args.snapshot)
                peak, reserved, seconds, opt_seconds, owners = measure_on_gpu(cfg, snapshot=wants)
                row.measured_optimizer_seconds, row.peak_owners = opt_seconds, owners
            except torch.cuda.OutOfMemoryError:
                failure = "oom"
            except Exception as exc:  # noqa: BLE001 - recorded per configuration
                failure, row.note = "error", f"{type(exc).__name__}: {exc}".splitlines()[0]
            gc.collect()  # free what the run held (a failed run's traceback is gone by now)
            torch.cuda.empty_cache()
            if failure:
                row.status = failure
                continue
            row.status = "ok"
            row.measured_peak_bytes, row.measured_step_seconds = peak, seconds
            row.measured_reserved_bytes = reserved
            if row.analytic_allocated_bytes is not None and row.analytic_reserved_bytes is not None:
                row.analytic_allocated_error = row.analytic_allocated_bytes / peak - 1
                row.analytic_reserved_error = row.analytic_reserved_bytes / reserved - 1
            if row.analytic_step_seconds is not None:
                row.analytic_time_error = row.analytic_step_seconds / seconds - 1
            if not row.flops_per_step:  # no trace: the analytic columns only
                print(f"  {row.config}: analytic peak {_fmt_pct(row.analytic_allocated_error)}", flush=True)
                continue
            row.peak_error = (row.predicted_peak_bytes - peak) / peak
            row.reserved_error = (row.predicted_reserved_bytes - reserved) / reserved
            if len(achieved) < args.calibrate:
                achieved.append(row.flops_per_step / seconds / peak_flops)
                row.calibration = True
                efficiency = statistics.mean(achieved)
            if efficiency is not None:
                row.predicted_step_seconds = row.flops_per_step / (peak_flops * efficiency)
                row.time_error = (row.predicted_step_seconds - seconds) / seconds
            print(f"  {row.config}: peak {_fmt_pct(row.peak_error)}, time {_fmt_pct(row.time_error)}", flush=True)
        # calibration rows measured before the efficiency was final: recompute their prediction
        if efficiency is not None:
            for row in rows:
                if row.measured_step_seconds is not None and row.flops_per_step:
                    row.predicted_step_seconds = row.flops_per_step / (peak_flops * efficiency)
                    row.time_error = (
                        row.predicted_step_seconds - row.measured_step_seconds
                    ) / row.measured_step_seconds

    print()
    print(
        f"device: {device_name}; peak {peak_flops / 1e12:.0f} TFLOP/s; "
        f"efficiency {efficiency if efficiency is None else round(efficiency, 3)}"
    )
    print_table(rows)
    print()
    print("the planner's analytic estimate (catalog H200, single GPU, default efficiencies; GiB, ms):")
    print_analytic_table(rows)
    for r in rows:
        if r.peak_owners:
            print(f"\nwho holds the allocated peak of {r.config} (blocks allocated during the recorded step):")
            for o in r.peak_owners[:15] + r.peak_owners[-1:]:
                print(f"  {o['bytes'] / 2**30:8.3f} GiB  {o['blocks']:6d}  {o['owner']}")
    opt_rows = [r for r in rows if r.measured_optimizer_seconds and r.analytic_optimizer_seconds]
    if opt_rows:
        print("\noptimizer step alone (ms): configuration, analytic, measured")
        for r in opt_rows:
            print(f"  {r.config:52s} {r.analytic_optimizer_seconds * 1e3:8.1f} {r.measured_optimizer_seconds * 1e3:8.1f}")
    summary = summarize(rows)
    print()
    print("summary:", json.dumps(summary))
    print(f"total {time.perf_counter() - started:.1f} s")
    report = {
        "device": device_name,
        "torch": torch.__version__,
        "peak_tflops": peak_flops / 1e12,
        "efficiency": efficiency,
        "dry_run": args.dry_run,
        "rows": [asdict(r) for r in rows],
        "summary": summary,
    }
    Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
