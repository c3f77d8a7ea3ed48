"""`trainplan run --pp N [--vpp V]`: a Llama-family job trains pipeline parallel (torch.distributed.pipelining, 1F1B
or interleaved) with FSDP over each stage's ranks, on CPU over gloo, step for step like data parallel alone; a
worker killed mid-run resumes from the per-stage checkpoint; layouts it cannot run are one line each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch.distributed.pipelining")

LLAMA_JOB = {
    "name": "tiny-pp", "kind": "transformer",
    "model": {"arch": "decoder", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256,
              "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "max_seq_len": 64, "name": "tiny"},
    "method": "full", "seq_len": 32, "micro_batch": 2, "global_batch": 8, "precision": "fp32", "optimizer": "adamw",
    "steps": 6, "data": "synthetic",
}  # fmt: skip


@pytest.mark.slow
def test_pipeline_times_fsdp_trains_like_fsdp_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 processes, PP 2 × FSDP 2, against FSDP on 2: the stages of a data-parallel rank read that rank's batches,
    cut into the same micro-batches, so every step's loss and the saved model agree (fp32, reordered sums)."""
    from conftest import assert_same_training, run, step_losses, write_job

    job = write_job(tmp_path / "job.yaml", LLAMA_JOB)
    pp = run(job, tmp_path / "pp", devices=4, pp=2, checkpoint_every=2)
    dp = run(job, tmp_path / "dp", devices=2, strategy="fsdp")
    assert pp.status == dp.status == "completed" and pp.devices == 4 and pp.strategy == "fsdp"
    a = assert_same_training(tmp_path / "pp", tmp_path / "dp", steps=6)  # model.pt: every stage's part, whole names
    config = json.loads((tmp_path / "pp" / "run.json").read_text())
    assert config["pp"] == 2 and config["grad_accum"] == 2  # 8 rows = 2 data ranks × 2 micro-batches of 2
    step = sorted((tmp_path / "pp" / "checkpoints").glob("step_*"))[-1]
    assert {f.name for f in step.glob("model*.pt")} == {"model.pp0.pt", "model.pp1.pt"}
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "4")
    monkeypatch.setenv("TRAINPLAN_FAULT_RANK", "3")
    killed = run(job, tmp_path / "killed", devices=4, pp=2, checkpoint_every=2)
    assert killed.status == "completed" and killed.restarts == 1
    assert step_losses(tmp_path / "killed")[-1] == pytest.approx(a[-1], rel=1e-6)


@pytest.mark.slow
def test_interleaved_pipeline_trains_like_one_process(tmp_path: Path) -> None:
    """2 processes, 2 chunks each (interleaved 1F1B over 4 one-block chunks), against one process with the same
    4 accumulated micro-batches a step."""
    from conftest import assert_same_training, run, write_job

    job = write_job(tmp_path / "job.yaml", LLAMA_JOB)
    pp = run(job, tmp_path / "pp", devices=2, pp=2, vpp=2)
    one = run(job, tmp_path / "one", devices=1, strategy="single")
    assert pp.status == one.status == "completed"
    assert_same_training(tmp_path / "pp", tmp_path / "one", steps=6)


@pytest.mark.parametrize(
    ("flags", "field", "job"),
    [
        (["--devices", "4", "--pp", "3"], "--pp", {}),  # 3 does not divide 4 processes
        (["--devices", "2", "--pp", "2", "--strategy", "ddp"], "--strategy", {}),
        (["--devices", "4", "--pp", "4", "--vpp", "2"], "--pp", {}),  # 8 chunks, 4 layers
        (["--devices", "2", "--pp", "2", "--tp", "2"], "--pp", {}),
        (["--devices", "2", "--vpp", "2"], "--pp", {}),  # chunks a rank without stages
        (["--devices", "4", "--pp", "2"], "global_batch", {"global_batch": 4}),  # 1 micro-batch for 2 stages
        (["--devices", "2", "--pp", "2"], "--pp", {"model": {"arch": "decoder", "layers": 2, "hidden": 64, "heads": 4,
            "ffn_hidden": 256, "vocab": 256, "position": "learned", "norm": "layernorm", "mlp": "gelu", "bias": True,
            "max_seq_len": 64, "name": "g"}}),  # a GPT-2-style model: its blocks are not mapped
    ],
)  # fmt: skip
def test_run_refuses_a_pipeline_layout_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     flags: list[str], field: str, job: dict) -> None:  # fmt: skip
    from conftest import write_job

    from trainplan.cli.main import main

    path = write_job(tmp_path / "job.yaml", {**LLAMA_JOB, **job})
    code = main(["run", str(path), "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}:"), err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--tp", "--pp", "--ep"])
def test_a_split_run_of_a_pretrained_checkpoint_is_one_line(tmp_path: Path, flag: str) -> None:
    """Tensor, pipeline and expert parallel runs build the job's architecture from random weights: a checkpoint
    folder is refused naming the option (checked when the option is chosen and again by the worker's workload)."""
    from trainplan.errors import SpecError
    from trainplan.run.workloads.checks import check_random_init_split

    with pytest.raises(SpecError) as err:
        check_random_init_split(tmp_path, flag)
    assert err.value.field == flag and "pretrained checkpoint" in str(err.value) and "\n" not in str(err.value)
    check_random_init_split(tmp_path, None)  # data parallel: the checkpoint trains
    check_random_init_split(None, flag)  # random weights: the split runs
