"""`trainplan run` trains eager PyTorch: a job that names another stack or knobs the worker does not apply is
predicted as it trains, and the run says what was set aside (never a prediction for software that did not run)."""

from __future__ import annotations

import pytest
from conftest import run, write_job

from trainplan.run.workloads.checks import as_trained
from trainplan.spec import Stack, parse_job

LLAMA = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn_hidden": 64, "vocab": 256}
JOB = {"kind": "transformer", "name": "lm", "model": LLAMA, "seq_len": 16, "micro_batch": 2, "steps": 3}


def test_a_plain_job_trains_as_planned() -> None:
    job = parse_job(JOB)
    assert as_trained(job) == (job, None)
    tf32 = parse_job({**JOB, "knobs": {"tf32_matmul": True}})  # honoured by the worker: nothing to say
    assert as_trained(tf32) == (tf32, None)
    # the share of the layers checkpointed: the workload wraps that share (run/workloads/transformer.py finish_model)
    share = parse_job({**JOB, "model": {**LLAMA, "layers": 4}, "activation_checkpointing": "full",
                       "knobs": {"checkpoint_fraction": 0.5}})  # fmt: skip
    assert as_trained(share) == (share, None)


def test_another_stack_is_predicted_as_plain_with_what_differs_named() -> None:
    job = parse_job({**JOB, "stack": "torchtune", "knobs": {"compile": True, "tf32_matmul": True}})
    trained, note = as_trained(job)
    assert trained.stack is Stack.PLAIN
    assert trained.knobs.compile is None and trained.knobs.tf32_matmul is True  # tf32 is applied by the worker
    assert "not stack torchtune" in note
    assert "loss chunked → full" in note and "compile true → false" in note and "fused_optimizer true → false" in note
    assert "tf32" not in note
    assert job.stack is Stack.TORCHTUNE  # the user's job is not changed


def test_knobs_alone_are_named() -> None:
    job = parse_job({**JOB, "knobs": {"fused_kernels": "liger", "activation_offloading": True}})
    trained, note = as_trained(job)
    assert note.startswith("trainplan run trains eager PyTorch (stack plain), not the job's knobs")
    assert "fused_kernels liger → none" in note and "activation_offloading true → false" in note
    assert "loss fused-linear → full" in note  # Liger's loss, which plain PyTorch does not have


def test_every_knob_the_estimate_reads_is_named_when_set_aside() -> None:
    """The knobs compared are the estimate's own list (estimate/stack.KNOB_NAMES), not a copy: FP8 all-gather and the
    compiled loss, which the worker does not apply, are named too."""
    job = parse_job({**JOB, "precision": "fp8", "knobs": {"fp8_all_gather": True, "compile": True, "compile_loss": True}})
    _, note = as_trained(job)
    assert "fp8_all_gather true → false" in note and "compile_loss true → false" in note


def test_megatrons_recompute_modules_are_named_as_set_aside() -> None:
    job = parse_job({**JOB, "activation_checkpointing": "selective", "knobs": {"recompute_modules": ["core_attn", "mlp"]}})
    trained, note = as_trained(job)
    assert "recompute_modules [core_attn, mlp] → [core_attn]" in note
    assert "selective_recompute attention-core → matmul-outputs" in note  # trainplan run's own policy
    assert trained.knobs.recompute_modules is None


def test_qlora_fp32_params_of_the_stack_is_kept() -> None:
    job = parse_job({**JOB, "stack": "hf-trainer", "method": "qlora", "model": "llama-2-7b"})
    trained, note = as_trained(job)
    assert trained.knobs.qlora_fp32_params is True  # the QLoRA workload casts as PEFT does (run/workloads/transformer.py)
    assert "qlora_fp32_params" not in note
    assert "fused_optimizer true → false" in note


def test_tabular_and_keras_jobs_have_no_stack_to_set_aside() -> None:
    job = parse_job({"kind": "tabular", "library": "xgboost", "rows": 1000, "features": 10})
    assert as_trained(job) == (job, None)


@pytest.mark.slow
def test_a_run_of_an_hf_trainer_job_says_so_and_is_compared_with_the_plain_prediction(tmp_path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 100)
    job = write_job(tmp_path / "job.yaml", JOB, data=str(corpus), stack="hf-trainer", knobs={"loss": "chunked"})
    summary = run(job, tmp_path / "run")
    assert summary.status == "completed", summary.message
    [note] = [n for n in summary.notes if n.startswith("trainplan run trains eager PyTorch")]
    assert "not stack hf-trainer" in note and "loss chunked → full" in note
    plain = run(write_job(tmp_path / "plain.yaml", JOB, data=str(corpus)), tmp_path / "plain")
    assert summary.predicted["peak_gib"] == pytest.approx(plain.predicted["peak_gib"])
    assert not any(n.startswith("trainplan run trains eager PyTorch") for n in plain.notes)
    assert "stack: hf-trainer" in (tmp_path / "run" / "job.yaml").read_text()  # the user's job, as written
