"""`trainplan run` of an `optimizer: muon` job: torch.optim.Muon on the hidden matrices beside AdamW, single or DDP on
CPU over gloo, step for step alike, resumed from its checkpoint after a killed worker; sharded strategies refused."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

MUON_JOB = {
    "name": "tiny-muon", "kind": "transformer",
    "model": {"arch": "decoder", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128, "vocab": 256,
              "position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "max_seq_len": 64, "name": "tiny"},
    "method": "full", "seq_len": 32, "micro_batch": 2, "global_batch": 4, "precision": "fp32", "optimizer": "muon",
    "learning_rate": 0.003, "steps": 6, "data": "synthetic",
}  # fmt: skip


@pytest.mark.slow
def test_muon_trains_single_and_ddp_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One process and DDP on 2 both learn; the two DDP ranks end with the same weights (each steps every whole
    matrix on the all-reduced gradients); the run is not AdamW's; a worker killed at step 4 resumes from the step-4
    checkpoint (Muon's momentum and AdamW's moments in one state dict) and ends where the uninterrupted run ended."""
    from conftest import rank_records, run, step_losses, write_job

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    job = write_job(tmp_path / "job.yaml", MUON_JOB, data=str(corpus))
    one = run(job, tmp_path / "one", devices=1, strategy="single")
    ddp = run(job, tmp_path / "ddp", devices=2, strategy="ddp")
    assert ddp.status == one.status == "completed", (ddp.message, one.message)
    losses = step_losses(tmp_path / "ddp")
    # below uniform over 256 byte values (ln 256 ≈ 5.55): both learn the text
    assert len(losses) == 6 and losses[-1] < 5.2 and step_losses(tmp_path / "one")[-1] < 5.2
    ends = rank_records(tmp_path / "ddp", "end")
    assert len(ends) == 2 and len({r["params_sha256"] for r in ends}) == 1
    adamw = run(write_job(tmp_path / "adamw.yaml", MUON_JOB, data=str(corpus), optimizer="adamw"), tmp_path / "adamw", devices=1,
                strategy="single")  # fmt: skip
    muon_one = step_losses(tmp_path / "one")
    assert adamw.status == "completed" and step_losses(tmp_path / "adamw")[0] == pytest.approx(muon_one[0])
    assert step_losses(tmp_path / "adamw")[1:] != pytest.approx(muon_one[1:], rel=1e-4)
    monkeypatch.setenv("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "4")
    monkeypatch.setenv("TRAINPLAN_FAULT_RANK", "1")
    killed = run(job, tmp_path / "killed", devices=2, strategy="ddp", checkpoint_every=2)
    assert killed.status == "completed" and killed.restarts == 1
    assert step_losses(tmp_path / "killed")[-1] == pytest.approx(losses[-1], rel=1e-6)


@pytest.mark.parametrize("strategy", ["fsdp", "zero2"])
def test_muon_under_a_sharding_strategy_is_refused(tmp_path: Path, strategy: str) -> None:
    from conftest import refused

    err = refused(tmp_path, MUON_JOB, strategy=strategy, devices=2)
    assert err.field == "--strategy" and "muon runs single or ddp" in str(err)
