"""Inputs for the report and page tests: a job with a deadline and a budget, a finished run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import yaml

JOB = {
    "name": "report-llama",
    "kind": "transformer",
    "model": "llama-7b",
    "method": "full",
    "seq_len": 512,
    "micro_batch": 4,
    "global_batch": 128,
    "precision": "bf16",
    "tokens": 7.8e7,
    "constraints": {"deadline_hours": 1.0, "budget_usd": 30},
}


@pytest.fixture(autouse=True, scope="session")
def empty_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty TRAINPLAN_HOME for the session: no saved profile or calibration of the user's changes a plan."""
    with pytest.MonkeyPatch.context() as mp:
        home = tmp_path_factory.mktemp("trainplan-home")
        mp.setenv("TRAINPLAN_HOME", str(home))
        yield home


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(JOB, sort_keys=False))
    return p


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A finished `trainplan run` of a tiny torch job, as the run writes it (run.json, metrics.jsonl, summary.json)."""
    job = {"name": "tiny", "kind": "torch", "model": "torch.nn:Linear", "model_args": {"in_features": 8, "out_features": 4},
           "inputs": [{"shape": [8], "dtype": "float32"}], "loss": "cross_entropy", "micro_batch": 4, "precision": "fp32",
           "optimizer": "adamw", "steps": 20}  # fmt: skip
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"version": 1, "job": job, "strategy": "single", "world_size": 1}))
    lines = [{"event": "start", "strategy": "single", "world_size": 1}]
    for step in range(1, 21):
        lines.append({"step": step, "loss": 2.0 / step, "step_time_s": 0.01 + 0.001 * (step % 3), "samples_per_s": 400.0 + step,
                      "elapsed_s": 0.01 * step, "allocated_gib": 0.05 + 0.001 * step, **({"warmup": True} if step == 1 else {})})  # fmt: skip
    lines.append({"event": "checkpoint", "step": 20})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 21, "lo')  # a torn last line
    summary = {"status": "completed", "strategy": "single", "devices": 1, "hardware_id": "cpu:test:2",
               "measured": {"step_time_s": 0.011, "peak_gib": 0.08, "rows_per_s": 410.0, "train_s": 0.3, "final_loss": 0.1},
               "predicted": {"step_time_s": 0.009, "peak_gib": 0.07, "rows_per_s": 450.0, "train_s": 0.25, "final_loss": None},
               "error": {"step_time_s": 0.22, "peak_gib": 0.14, "rows_per_s": -0.09, "train_s": 0.2, "final_loss": None}}  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    return d
