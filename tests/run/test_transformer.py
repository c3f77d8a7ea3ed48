"""Transformer jobs: the causal LM built from the job's architecture, trained for real."""

from __future__ import annotations

import pytest
import torch
from conftest import load_state, rank_records, run, write_job

from trainplan.errors import SpecError
from trainplan.run.workloads.transformer import TokenSource, check_supported, flops_per_token, hf_config
from trainplan.spec import ModelArch, parse_job

LLAMA = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn_hidden": 64, "vocab": 256}
GPT2 = {**LLAMA, "kv_heads": None, "position": "learned", "norm": "layernorm", "mlp": "gelu", "tied_embeddings": True, "bias": True}
JOB = {"kind": "transformer", "name": "lm", "model": LLAMA, "seq_len": 16, "micro_batch": 2, "steps": 6, "learning_rate": 0.003}


def test_config_follows_the_architecture() -> None:
    llama = hf_config(ModelArch(**LLAMA), seq_len=64)
    assert (llama.model_type, llama.num_key_value_heads, llama.intermediate_size, llama.max_position_embeddings) == ("llama", 2, 64, 64)
    gpt2 = hf_config(ModelArch(**{k: v for k, v in GPT2.items() if v is not None}), seq_len=16)
    assert (gpt2.model_type, gpt2.n_inner, gpt2.n_positions) == ("gpt2", 64, 16)


def test_flops_per_token_is_6n_plus_attention() -> None:
    from transformers import AutoModelForCausalLM

    arch = ModelArch(**LLAMA)
    model = AutoModelForCausalLM.from_config(hf_config(arch, 16))
    n = sum(p.numel() for p in model.parameters()) - arch.vocab * arch.hidden  # untied: the input embedding does no matmul
    assert flops_per_token(model, arch, 16) == 6 * n + 12 * 2 * 4 * 8 * 16


def test_token_batches_are_a_function_of_their_key(tmp_path) -> None:
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(256)) * 4)
    src = TokenSource(str(text), vocab=100, seq_len=8, seed=1)
    a, b = src.batch(3, 5, 0, 1), src.batch(3, 5, 0, 1)
    assert torch.equal(a, b) and a.shape == (3, 8) and int(a.max()) < 100
    assert not torch.equal(a, src.batch(3, 6, 0, 1))
    with pytest.raises(SpecError, match="seq_len"):
        TokenSource(str(text), vocab=100, seq_len=5000, seed=1)


@pytest.mark.parametrize("changes,field", [({"position": "alibi"}, "model.position"), ({"arch": "encoder"}, "model.arch")])
def test_unbuildable_architectures_are_refused(changes, field) -> None:
    job = parse_job({**JOB, "model": {**LLAMA, **changes}})
    with pytest.raises(SpecError) as err:
        check_supported(job, job.model)
    assert err.value.field == field


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", ["full", "selective"])
def test_llama_on_a_text_file_with_fsdp_two_processes(tmp_path, checkpointing) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    job = write_job(tmp_path / "job.yaml", JOB, data=str(corpus), activation_checkpointing=checkpointing, steps=8)
    summary = run(job, tmp_path / "run", strategy="fsdp", devices=2)
    assert summary.status == "completed", summary.message
    ends = rank_records(tmp_path / "run", "end")
    assert len({r["pid"] for r in ends}) == 2 and len({r["params_sha256"] for r in ends}) == 1
    assert all(r["sharded_params"] for r in ends)
    m = summary.measured
    assert m["tokens_per_s"] == pytest.approx(2 * 2 * 16 / m["step_time_s"])  # global batch × seq_len per step
    assert m["final_loss"] < 5.2  # below uniform over 256 byte values (ln 256 ≈ 5.55): it learns the text
    assert "model.embed_tokens.weight" in load_state(tmp_path / "run" / "model.pt")


@pytest.mark.slow
def test_gpt2_style_lora_trains_only_adapters(tmp_path) -> None:
    job = write_job(tmp_path / "job.yaml", JOB, model=GPT2 | {"kv_heads": 4}, method="lora", lora={"rank": 4}, global_batch=4)
    summary = run(job, tmp_path / "run")
    assert summary.status == "completed", summary.message
    import json

    work = json.loads((tmp_path / "run" / "result.json").read_text())["workload"]
    assert 0 < work["trainable_params"] < work["params"] / 5
    assert work["samples_per_step"] == 4  # global_batch 4 = micro_batch 2 × 2 accumulation steps


def grads_and_flops(job_data: dict) -> tuple[dict[str, torch.Tensor], int]:
    """One forward and backward of the job's model as `trainplan run` builds it: the gradients and the FLOPs counted."""
    from torch.utils.flop_counter import FlopCounterMode

    from trainplan.run.workloads.transformer import build_model

    job = parse_job(job_data)
    model = build_model(job, job.model)
    model.train()
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=x, labels=x).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, counter.get_total_flops()


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_keeps_the_gradients_and_selective_saves_the_matmuls(mode: str) -> None:
    """`trainplan run` checkpoints as the trace of the same job does: the gradients equal the un-checkpointed
    model's, and selective checkpointing saves the matmul and attention outputs (PyTorch's selective activation
    checkpointing) — so it recomputes fewer FLOPs than full and more than none."""
    plain, plain_flops = grads_and_flops({**JOB, "activation_checkpointing": "none"})
    got, flops = grads_and_flops({**JOB, "activation_checkpointing": mode})
    assert got.keys() == plain.keys()
    for name, g in plain.items():
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-6)
    full_flops = grads_and_flops({**JOB, "activation_checkpointing": "full"})[1]
    if mode == "selective":
        assert plain_flops == flops < full_flops  # matmuls and attention saved: nothing expensive recomputed
    else:
        assert flops > plain_flops  # every layer's forward again


def test_checkpointing_a_share_of_the_layers_recomputes_only_those() -> None:
    """knobs.checkpoint_fraction 0.5 on 4 decoder layers: `trainplan run` wraps 2 of them (the 2nd and the 4th), the
    gradients equal the un-checkpointed model's, and the step recomputes half of what full checkpointing recomputes."""
    four = {**JOB, "model": {**LLAMA, "layers": 4}}
    plain, plain_flops = grads_and_flops({**four, "activation_checkpointing": "none"})
    half, half_flops = grads_and_flops({**four, "activation_checkpointing": "full", "knobs": {"checkpoint_fraction": 0.5}})
    full_flops = grads_and_flops({**four, "activation_checkpointing": "full"})[1]
    assert half.keys() == plain.keys()
    for name, g in plain.items():
        torch.testing.assert_close(half[name], g, rtol=1e-5, atol=1e-6)
    assert plain_flops < half_flops < full_flops
    assert half_flops - plain_flops == (full_flops - plain_flops) // 2


def test_a_share_that_checkpoints_no_layer_is_refused_before_the_run() -> None:
    """`trainplan run` refuses knobs.checkpoint_fraction 0.2 on 3 layers (⌊0.6⌋ = 0 wrapped) in one line instead of
    training with no checkpointing under activation_checkpointing: full."""
    job = parse_job({**JOB, "model": {**LLAMA, "layers": 3}, "activation_checkpointing": "full",
                     "knobs": {"checkpoint_fraction": 0.2}})  # fmt: skip
    with pytest.raises(SpecError, match="checkpoints none of them") as err:
        check_supported(job, job.model)
    assert err.value.field == "knobs.checkpoint_fraction"
