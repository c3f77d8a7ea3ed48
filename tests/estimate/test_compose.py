"""One composer for both estimators: the analytic and the traced profile go through the same rules.

The first four tests pin bugs of the time when each path built its own estimate
(issue 7): each failed before the composer existed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainplan.catalog import find_accelerator, get_catalog, resolve_model
from trainplan.estimate.compose import compose
from trainplan.estimate.hardware import hardware_for_cpus, hardware_for_gpu, hardware_for_instance
from trainplan.estimate.memory import GIB
from trainplan.estimate.profile import ProfileSource
from trainplan.estimate.result import RejectKind
from trainplan.estimate.transformer import estimate_transformer, transformer_profile
from trainplan.spec import Optimizer, parse_job
from trainplan.strategies import Strategy

MLP = """
from torch import nn

def mlp(width=256, depth=3):
    layers = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 8))
"""

TINY_LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 512, "max_seq_len": 128}


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "tp_compose_models.py").write_text(MLP)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _torch_job(**extra):
    return parse_job({"kind": "torch", "model": "tp_compose_models:mlp", "inputs": [{"shape": [64]}],
                      "micro_batch": 16, "steps": 10, **extra})  # fmt: skip


def test_adafactor_state_is_counted_on_the_traced_path(models: Path) -> None:
    """Adafactor keeps a factored second moment (rows + columns per matrix); the traced estimate used to report 0 bytes."""
    pytest.importorskip("torch")
    from trainplan.estimate.torchjob import estimate_traced, trace_torch_job

    job = _torch_job(optimizer="adafactor", precision="fp32")
    traced = trace_torch_job(job)
    cat = get_catalog()
    e = estimate_traced(job, traced, hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1), Strategy.SINGLE, cat)
    # rows + columns of each 256×256 / 64×256 / 256×8 matrix and the full vectors of the biases, fp32
    shapes = [(256, 64), (256, 256), (256, 256), (8, 256)]
    factored = sum(r + c for r, c in shapes) + sum(r for r, _ in shapes)
    assert e.memory.optimizer > 0
    assert e.memory.optimizer == pytest.approx(4 * factored, rel=0.25)
    assert e.memory.optimizer < 0.2 * 4 * traced.trainable_params  # far below AdamW's 2 states per parameter


def test_traced_offload_counts_host_ram_like_the_analytic_path() -> None:
    """Offload needs host RAM per node: the states on the host plus each rank's process (assumptions.yaml)."""
    pytest.importorskip("transformers")
    from trainplan.estimate.torchjob import estimate_traced, trace_transformer_job

    job = parse_job({"kind": "transformer", "model": TINY_LLAMA, "seq_len": 64, "micro_batch": 2, "steps": 5})
    cat = get_catalog()
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=2)
    analytic = estimate_transformer(job, hw, Strategy.ZERO2_OFFLOAD, cat)
    traced = estimate_traced(job, trace_transformer_job(job), hw, Strategy.ZERO2_OFFLOAD, cat)
    process = cat.assumption("host_process_gib") * GIB * 2
    assert analytic.memory.host > process
    assert traced.memory.host == pytest.approx(analytic.memory.host, rel=0.01)


def test_traced_offload_is_rejected_when_host_ram_is_short(models: Path) -> None:
    pytest.importorskip("torch")
    from trainplan.estimate.torchjob import trace_torch_job

    job = _torch_job()
    cat = get_catalog()
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1)
    tiny_host = type(hw)(**{**hw.__dict__, "ram_gib_per_node": 0.1})
    e = compose(job, trace_torch_job(job), tiny_host, Strategy.ZERO2_OFFLOAD, cat)
    assert not e.fits and e.rejection.kind is RejectKind.HOST_MEMORY
    assert e.rejection.needed > e.rejection.available and "host RAM" in e.reason


@pytest.mark.parametrize(
    "arch",
    [
        # a GPT-2-style model trained past its preset's position table, and a Llama-style model with biases
        {"layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 300, "position": "learned",
         "norm": "layernorm", "mlp": "gelu", "bias": True, "tied_embeddings": True, "max_seq_len": 32},
        {**TINY_LLAMA, "bias": True, "kv_heads": 2},
    ],
)  # fmt: skip
def test_trace_builds_the_model_that_run_trains(arch: dict) -> None:
    """--trace and `trainplan run` build one model: same config, same parameter count, and the formulas agree."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from trainplan.estimate import architecture as arch_mod
    from trainplan.estimate.torchjob import hf_config_for, trace_transformer_job
    from trainplan.run.workloads.transformer import hf_config as run_config

    job = parse_job({"kind": "transformer", "model": arch, "seq_len": 64, "micro_batch": 1, "steps": 1})
    a = resolve_model(job.model)
    traced_cfg = hf_config_for(a, job.seq_len)
    run_cfg = run_config(a, job.seq_len).to_dict()
    assert {k: run_cfg[k] for k in traced_cfg if k in run_cfg} == {k: v for k, v in traced_cfg.items() if k in run_cfg}
    built = sum(p.numel() for p in AutoModelForCausalLM.from_config(run_config(a, job.seq_len)).parameters())
    assert trace_transformer_job(job).params.total == built
    assert arch_mod.param_counts(a, job.seq_len).total == built


def test_both_paths_share_one_set_of_compatibility_rules(models: Path) -> None:
    """8-bit Adam needs CUDA: a TPU option is rejected for a traced torch job as for a transformer."""
    pytest.importorskip("torch")
    from trainplan.estimate.torchjob import trace_torch_job

    cat = get_catalog()
    tpu = next(a for a in cat.accelerators.values() if a.kind == "tpu" and a.peak_tflops("bf16"))
    hw = hardware_for_gpu(tpu, cat, gpus=4)
    job = _torch_job(optimizer="adam8bit", global_batch=64)
    traced = compose(job, trace_torch_job(job), hw, Strategy.FSDP, cat)
    tjob = parse_job({"kind": "transformer", "model": TINY_LLAMA, "seq_len": 64, "micro_batch": 2, "steps": 5,
                      "optimizer": "adam8bit"})  # fmt: skip
    analytic = estimate_transformer(tjob, hw, Strategy.FSDP, cat)
    assert traced.rejection.kind is analytic.rejection.kind is RejectKind.PLATFORM
    assert traced.reason == analytic.reason


def test_typed_rejections_carry_their_numbers() -> None:
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10})
    e = estimate_transformer(job, hardware_for_gpu(find_accelerator("A100-40GB"), cat, gpus=1), Strategy.SINGLE, cat)
    r = e.rejection
    assert r.kind is RejectKind.DEVICE_MEMORY and r.unit == "bytes"
    assert r.needed == pytest.approx(e.memory.peak) and r.available == pytest.approx(40 * GIB)
    assert r.ratio > 1 and e.to_dict()["rejection"]["kind"] == "device-memory"
    cpu = estimate_transformer(job, hardware_for_cpus(16, cat), Strategy.SINGLE, cat)
    assert cpu.rejection.kind is RejectKind.HOST_MEMORY  # CPUs are a device; 7B of AdamW states are not in 32 GiB
    assert cpu.rejection.needed > cpu.rejection.available


def test_the_profile_is_hardware_free_and_the_composer_applies_the_strategy() -> None:
    """One profile, many options: sharding changes per-device states, never the profile."""
    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10})
    profile = transformer_profile(job, cat)
    assert profile.source is ProfileSource.ANALYTIC and profile.params.trainable == profile.params.total
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=4)
    z1, z2, z3 = (compose(job, profile, hw, s, cat) for s in (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3))
    n = profile.params.total
    # DeepSpeed mixed precision: 2 + 2 + 12 bytes/param; stage 1 shards the 12, stage 2 also the 2 of grads, stage 3 all
    assert z1.memory.optimizer == pytest.approx(12 * n / 4, rel=1e-6)
    assert z3.memory.weights == pytest.approx(2 * n / 4, rel=1e-6)
    assert z1.memory.weights == z2.memory.weights > z3.memory.weights
    assert z1.flops_per_step == z2.flops_per_step == z3.flops_per_step
    assert estimate_transformer(job, hw, Strategy.ZERO2, cat) == z2


def test_the_plan_carries_fit_hints_without_the_cli() -> None:
    from trainplan import plan_job

    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10})
    from trainplan.planner.core import HINTED_REJECTIONS

    plan = plan_job(job)
    nearest = plan.rejected[:HINTED_REJECTIONS]  # the rejections tables and reports show get hints
    memory = [e for e in nearest if e.rejection.kind is RejectKind.DEVICE_MEMORY]
    assert memory and all(e.hint for e in memory)
    assert not any(e.hint for e in plan.rejected[HINTED_REJECTIONS:])
    others = [e for e in nearest if e.rejection.kind is not RejectKind.DEVICE_MEMORY]
    assert others and not any(e.hint for e in others)
    assert not any(e.hint for e in plan_job(job, hints=False).rejected)


def test_adafactor_analytic_and_traced_agree_on_a_transformer() -> None:
    """Both paths count Adafactor's factored state for the same model within a few percent.

    Wide enough that the trace's rounding of each small state tensor to the CUDA allocator's
    512 bytes (and the per-parameter step scalars) stays a few percent of the state.
    """
    pytest.importorskip("transformers")
    from trainplan.estimate.torchjob import trace_transformer_job

    wide = {**TINY_LLAMA, "hidden": 2048, "heads": 16, "ffn_hidden": 4096, "vocab": 4096}
    job = parse_job({"kind": "transformer", "model": wide, "seq_len": 64, "micro_batch": 2, "steps": 5,
                     "optimizer": Optimizer.ADAFACTOR.value, "precision": "fp32"})  # fmt: skip
    cat = get_catalog()
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1)
    a = compose(job, transformer_profile(job, cat), hw, Strategy.SINGLE, cat)
    t = compose(job, trace_transformer_job(job), hw, Strategy.SINGLE, cat)
    assert t.memory.optimizer == pytest.approx(a.memory.optimizer, rel=0.1)


def test_the_lora_remedy_of_an_mla_model_targets_its_own_linear_layers() -> None:
    """A dense MLA model's attention has no q_proj / v_proj (MiniCPM3: q_a_proj, kv_b_proj …): the hint's LoRA variant
    uses all-linear instead of ending the command with an error about a LoRA the user never asked for. DeepSeek-V3, a
    mixture of experts, gets no LoRA remedy: all-linear would adapt every routed expert, which is not estimated."""
    from trainplan.planner.core import hint_remedies, job_profile

    cat = get_catalog()
    mla = {"q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}
    dense = parse_job({"kind": "transformer", "model": {"layers": 4, "hidden": 256, "heads": 8, "ffn_hidden": 512,
                       "vocab": 1000, "mla": mla}, "seq_len": 4096, "micro_batch": 1, "steps": 10, "precision": "bf16"})  # fmt: skip
    labels = [label for label, j, _ in hint_remedies(dense, cat, job_profile(dense, cat))]
    assert "method: lora, lora.targets: [all-linear]" in labels and "method: lora" not in labels
    moe = parse_job({"kind": "transformer", "model": "deepseek-v3", "seq_len": 4096, "micro_batch": 1, "steps": 10,
                     "precision": "bf16"})  # fmt: skip
    assert not any(label.startswith("method: lora") for label, _, _ in hint_remedies(moe, cat, job_profile(moe, cat)))
    llama = parse_job({"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10})
    assert "method: lora" in [label for label, _, _ in hint_remedies(llama, cat, job_profile(llama, cat))]


def test_step_memory_reads_the_accelerator_only_by_kind() -> None:
    """The step-memory memo is keyed by the accelerator's kind (GPU or TPU), not its model, so that one layout is
    composed once across the catalog's GPUs: the unmemoised composition must give the same breakdown on every GPU
    (and every TPU) for the same layout, strategy and micro-steps — whatever their capacity, peak or bandwidth."""
    from dataclasses import replace

    from trainplan.estimate.compose import _step_memory

    cat = get_catalog()
    job = parse_job({"kind": "transformer", "model": "llama-2-7b", "method": "full", "seq_len": 4096, "micro_batch": 1,
                     "global_batch": 64, "precision": "bf16", "activation_checkpointing": "full", "steps": 10})  # fmt: skip
    profile = transformer_profile(job, cat)
    by_kind: dict[str, dict[tuple[object, ...], object]] = {}
    seen: dict[str, set[str]] = {}
    for inst in cat.instances:
        acc = cat.accelerators.get(inst.accelerator or "")
        if acc is None:
            continue
        base = hardware_for_instance(inst, cat, nodes=2)
        layouts = [base.layout]
        if acc.kind == "gpu" and base.layout.gpus_per_node % 2 == 0:
            layouts.append(base.layout.split(tp=2, pp=2, sequence_parallel=True))
        for layout in layouts:
            hw = replace(base, layout=layout)
            for strategy in (Strategy.ZERO1, Strategy.FSDP, Strategy.ZERO3_OFFLOAD):
                if layout.model_parallel and strategy is Strategy.ZERO3_OFFLOAD:
                    continue
                mem = _step_memory(job, profile, hw, strategy, cat, micro_steps=2)
                first = by_kind.setdefault(acc.kind, {}).setdefault((layout, strategy), mem)
                assert mem == first, (inst.cloud, inst.name, layout, strategy)
        seen.setdefault(acc.kind, set()).add(acc.id)
    assert len(seen["gpu"]) >= 10 and len(seen["tpu"]) >= 2  # the comparison spans many models of each kind
