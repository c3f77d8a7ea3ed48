"""The longest sequence that fits one GPU at micro-batch 1: trainplan against published context-length tables.

    python benchmarks/validate_context.py

Reads tests/data/published_context.yaml (Unsloth's tables: Llama 3.1 8B / 70B and 3.3 70B, 4-bit QLoRA rank 32 on
all linear layers, batch 1, on 8–80 GB of GPU memory; the "Hugging Face + FA2" column and Unsloth's own), builds
each run as a job (flash attention, HF gradient checkpointing, 8-bit AdamW — the assumptions the data file states)
on a GPU with the row's memory, and asks the planner for the longest sequence that fits
(``trainplan estimate --max-micro-batch``: the bisection of planner/fit.py over re-composed estimates).
Prints predicted vs published tokens, the signed error, and whether published out-of-memory rows are called
"nothing fits".
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from trainplan.catalog import get_catalog
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.planner.core import job_profile
from trainplan.planner.fit import max_micro_batch
from trainplan.spec import parse_job
from trainplan.strategies import Strategy

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_context.yaml"
BASE = "A100-80GB"  # compute peaks do not enter the memory verdict; only the memory is the row's


def job_of(rec: dict) -> object:
    return parse_job({
        "kind": "transformer", "name": rec["id"], "model": rec["model"], "method": "qlora",
        "lora": {"rank": 32, "targets": ["all-linear"]}, "seq_len": 1024, "micro_batch": 1, "precision": "bf16",
        "optimizer": "adam8bit", "activation_checkpointing": "full", "flash_attention": True, "steps": 1,
        "stack": rec["stack"], "knobs": rec.get("knobs", {}),
    })  # fmt: skip


def longest(rec: dict, cat) -> int:  # noqa: ANN001
    """The planner's longest sequence at micro-batch 1 on one GPU with the row's memory (0: nothing fits)."""
    job = job_of(rec)
    acc = replace(cat.accelerators[BASE], memory_gib=float(rec["gpu_memory_gib"]))
    hw = hardware_for_gpu(acc, cat, gpus=1)
    fit = max_micro_batch(job, job_profile(job, cat), hw, Strategy.SINGLE, cat)
    return int(fit.longest_seq_len or 0)


def main() -> None:
    cat = get_catalog()
    rows = yaml.safe_load(DATA.read_text())
    groups: dict[str, list[float]] = {}
    oom_right = oom_total = 0
    print(f"{'record':40} {'GiB':>4} {'published':>10} {'trainplan':>10} {'err':>8}")
    for rec in rows:
        pred = longest(rec, cat)
        meas = rec["measured_longest_tokens"]
        group = "unsloth" if rec.get("knobs") else "hf+fa2"
        if meas is None:
            oom_total += 1
            oom_right += pred == 0
            print(f"{rec['id']:40} {rec['gpu_memory_gib']:>4} {'OOM':>10} {pred:>10} {'ok' if pred == 0 else 'MISS':>8}")
            continue
        err = (pred - meas) / meas
        groups.setdefault(group, []).append(err)
        print(f"{rec['id']:40} {rec['gpu_memory_gib']:>4} {meas:>10,} {pred:>10,} {err:>+8.1%}")
    print()
    for group, errs in groups.items():
        abs_errs = [abs(e) for e in errs]
        print(f"{group}: median |error| {statistics.median(abs_errs):.1%}, median signed {statistics.median(errs):+.1%}, "
              f"within 15%: {sum(a <= 0.15 for a in abs_errs)}/{len(errs)}, worst {max(abs_errs):.1%}")  # fmt: skip
    print(f"published out-of-memory rows called 'nothing fits': {oom_right}/{oom_total}")


if __name__ == "__main__":
    main()
