"""`trainplan run` with ``method: qlora``: a pretrained checkpoint's linear weights in 4-bit NF4 (bitsandbytes,
which runs on the CPU since 0.48), LoRA adapters trained on top, under single and DDP (issue 17).

The checkpoint is the one tests/run/test_finetune.py trains offline; each run starts two real worker
processes over gloo.  The reference for every loss is transformers loading the same checkpoint with its own
``BitsAndBytesConfig``, written out here rather than taken from trainplan.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from conftest import FAULT_VARS, load_state, refused, run, write_job
from test_finetune import ckpt, data, job, loss_of, metric_lines  # noqa: F401 - module fixtures reused
from trainplan.errors import SpecError
from trainplan.run.workloads import textdata

pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

QLORA = {"method": "qlora", "lora": {"rank": 4, "targets": ["all-linear"]}}


def quantized(ckpt: Path) -> torch.nn.Module:
    """The checkpoint as QLoRA holds it: NF4 with double quantization, fp32 compute (the CPU runs fp32).

    In train mode: bitsandbytes runs a bf16 CPU inference kernel in eval mode (and repacks the weight for it),
    which the run turns off so that training and its eval loss use one kernel; this Llama has no dropout."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                           bnb_4bit_compute_dtype=torch.float32)
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, quantization_config=q,
                                                device_map={"": "cpu"}).train()


def first_batch_loss(model: torch.nn.Module, out: Path, *, world: int, micro_batch: int) -> float:
    train, _ = textdata.read_cache(out)
    config = json.loads((out / "run.json").read_text())
    sampler = textdata.RowSampler(train, seed=config["job"]["seed"], world_size=world, micro_batch=micro_batch,
                                  grad_accum=config["grad_accum"])
    with torch.no_grad():
        return sum(float(model(**sampler.batch(0, 0, rank)).loss) for rank in range(world)) / world


@pytest.mark.slow
def test_qlora_trains_adapters_on_the_4bit_checkpoint_and_resumes_exactly(tmp_path, ckpt, data, monkeypatch) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    spec = job(ckpt, data["chat"], **QLORA)
    out = tmp_path / "whole"
    whole = run(write_job(tmp_path / "a.yaml", spec), out, strategy="ddp", devices=2, checkpoint_every=4)
    assert whole.status == "completed", whole.message
    lines = metric_lines(out)
    assert "4-bit NF4" in next(r["how"] for r in lines if r.get("event") == "load")

    # 1. the first step's loss is the 4-bit base's on the same rows — not the full-precision base's
    base_q = quantized(ckpt)
    base_fp = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    expected = first_batch_loss(base_q, out, world=2, micro_batch=4)
    first = next(r for r in lines if "event" not in r)["loss"]
    assert first == pytest.approx(expected, rel=1e-4)
    assert abs(first - first_batch_loss(base_fp, out, world=2, micro_batch=4)) > 1e-3  # quantization moved it

    # 2. the result is a peft adapter that loads onto the quantized checkpoint and has learned the data
    final = out / "final"
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    tuned = PeftModel.from_pretrained(quantized(ckpt), final).train()
    train, evaluation = textdata.read_cache(out)
    assert loss_of(tuned, train) < loss_of(base_q, train) - 0.5
    evals = [r for r in lines if r.get("event") == "eval"]
    assert evals[-1]["eval_loss"] == pytest.approx(loss_of(tuned, evaluation), rel=0.02)

    # 3. counted as the model counts itself (a packed 4-bit weight holds two values per byte)
    result = json.loads((out / "result.json").read_text())["workload"]
    assert result["params"] == base_fp.num_parameters() + result["trainable_params"]
    assert result["trainable_params"] == sum(p.numel() for n, p in tuned.named_parameters() if ".lora_" in n)

    # 4. a checkpoint holds the trained tensors only; the 4-bit base is loaded from the checkpoint again
    saved = load_state(next((out / "checkpoints").glob("step_*")) / "model.pt")
    assert saved and all(".lora_" in k for k in saved)

    # 5. killed at step 4 on rank 1, restarted: the same adapter and final loss as the run never stopped
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "4")
    monkeypatch.setenv("TRAINPLAN_FAULT_RANK", "1")
    killed = run(write_job(tmp_path / "b.yaml", spec), tmp_path / "killed", strategy="ddp", devices=2,
                 checkpoint_every=2)
    for var in FAULT_VARS:
        monkeypatch.delenv(var)
    assert killed.status == "completed" and killed.restarts == 1, killed.message
    assert killed.measured["final_loss"] == pytest.approx(whole.measured["final_loss"], abs=1e-6)
    from safetensors.torch import load_file

    a = load_file(final / "adapter_model.safetensors")
    b = load_file(tmp_path / "killed" / "final" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-6, rtol=1e-5)


# --------------------------------------------------------------------------- refused in one line, nothing touched


@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3"])
def test_qlora_under_a_sharding_strategy_is_refused(tmp_path, ckpt, data, strategy) -> None:
    err = refused(tmp_path, job(ckpt, data["chat"], **QLORA), strategy=strategy, devices=2)
    assert err.field == "--strategy" and "single or ddp" in str(err)


def test_qlora_without_a_checkpoint_or_without_bitsandbytes_is_refused(tmp_path, ckpt, data, monkeypatch) -> None:
    err = refused(tmp_path, {"kind": "transformer", "model": "gpt2", "steps": 2, "seq_len": 32, "micro_batch": 2, **QLORA})
    assert err.field == "method" and "checkpoint" in str(err)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    err = refused(tmp_path, job(ckpt, data["chat"], **QLORA))
    assert err.field == "method" and "trainplan[qlora]" in str(err)


def test_a_4bit_weight_counts_its_values_not_its_bytes(ckpt) -> None:
    from trainplan.run.workloads.common import parameter_count
    from transformers import AutoModelForCausalLM

    packed = quantized(ckpt)
    assert sum(p.numel() for p in packed.parameters()) < packed.num_parameters()  # the packed storage is smaller
    assert parameter_count(packed) == AutoModelForCausalLM.from_pretrained(ckpt).num_parameters()


def test_a_rendered_qlora_launch_installs_bitsandbytes_and_refuses_sharding(tmp_path, ckpt, data) -> None:
    from launch_support import render_to
    from trainplan.run.targets.wheel import installed_wheel

    spec = write_job(tmp_path / "q.yaml", job(ckpt, data["chat"], **QLORA))
    plan, rendered = render_to(spec, "slurm", tmp_path / "slurm", gpu="A100-80GB", gpus=2, strategy="ddp",
                               options={"partition": "gpu"})
    wheel, _ = installed_wheel()
    assert any(f"{wheel}[torch,qlora]'" in note for note in rendered.notes)
    with pytest.raises(SpecError) as err:
        render_to(spec, "slurm", tmp_path / "fsdp", gpu="A100-80GB", gpus=2, strategy="fsdp", options={"partition": "gpu"})
    assert err.value.field == "--strategy"


def test_qlora_fp32_params_casts_what_peft_casts_and_leaves_the_4bit_weights(ckpt) -> None:
    """knobs.qlora_fp32_params (hf-trainer, accelerate, deepspeed stacks): the run casts the unquantised 16-bit
    parameters to fp32 as PEFT's prepare_model_for_kbit_training does, as the estimate counts them."""
    from trainplan.run.workloads.pretrained import cast_unquantized_to_fp32, load_full

    model = load_full(ckpt, torch.bfloat16, quantize_on=torch.device("cpu"))
    packed = {n: p.data.clone() for n, p in model.named_parameters() if p.dtype == torch.uint8}
    assert packed and any(p.dtype == torch.bfloat16 for p in model.parameters())
    cast = cast_unquantized_to_fp32(model)
    assert cast == sum(1 for n, p in model.named_parameters() if n not in packed)
    for name, param in model.named_parameters():
        if name in packed:
            assert param.dtype == torch.uint8 and torch.equal(param.data, packed[name])
        else:
            assert param.dtype == torch.float32, name
