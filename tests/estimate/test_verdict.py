"""Numbers a user can trust: allocated vs reserved vs context, a stated margin with a measured band,
and the largest micro-batch that fits."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.cli.main import main
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.memory import GIB
from trainplan.estimate.published import memory_errors
from trainplan.estimate.result import RejectKind, Rejection
from trainplan.estimate.transformer import estimate_transformer, transformer_profile
from trainplan.planner.core import Objective, rank
from trainplan.planner.fit import _fits, max_micro_batch
from trainplan.spec import parse_job
from trainplan.strategies import Strategy

RECORDS = Path(__file__).resolve().parents[1] / "data" / "published_llm.yaml"
FIRST_LOOKS = RECORDS.with_name("first_looks.json")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import first_looks  # noqa: E402
LLAMA7B = {"kind": "transformer", "model": "llama-2-7b", "seq_len": 2048, "micro_batch": 1, "steps": 10}


def test_the_analytic_band_is_the_out_of_sample_error_on_published_records() -> None:
    """The band is not invented: it is the 80th / 20th percentile of measured / predicted − 1 of the analytic peak
    over every frozen set's first look (each set predicted by the code of the commit that froze it;
    benchmarks/first_looks.py records them in tests/data/first_looks.json)."""
    looks = json.loads(FIRST_LOOKS.read_text())
    sets = sorted(p.name for p in RECORDS.parent.glob("published_heldout*.yaml"))
    assert sorted(s["set"] for s in looks) == sets  # every frozen set has its first look recorded, a new one too
    for s in looks:  # of the frozen records themselves, not of a later edit
        assert s["sha256"] == hashlib.sha256((RECORDS.parent / s["set"]).read_bytes()).hexdigest(), s["set"]
    errors = first_looks.signed_errors(looks)
    assert len(errors) >= 100
    above = [-e / (1 + e) for e in errors]  # measured / predicted − 1
    cat = get_catalog()
    assert cat.assumption("memory_error_band_analytic") == pytest.approx(first_looks.percentile(above, 80), abs=0.005)
    assert cat.assumption("memory_error_band_analytic_below") == pytest.approx(-first_looks.percentile(above, 20), abs=0.005)
    # the percentile is numpy's linear one, between the order statistics around it
    ranked, k = sorted(above), int(0.8 * (len(above) - 1))
    assert ranked[k] <= first_looks.percentile(above, 80) <= ranked[k + 1]
    # wider than the in-sample median: the records that shaped the formulas understate the error
    in_sample = memory_errors(yaml.safe_load(RECORDS.read_text()) + yaml.safe_load(RECORDS.with_name("published_stacks.yaml").read_text()))
    assert in_sample.median < cat.assumption("memory_error_band_analytic")


def test_leave_one_set_out_judges_each_set_by_the_others_band() -> None:
    """benchmarks/first_looks.py's check of the band out of sample, on looks whose answer is known: each set is
    covered by the percentiles of the other sets alone."""
    def look(name: str, ratios: list[float]) -> dict:  # measured / predicted for each record
        return {"set": name, "records": [{"predicted_peak_gib": 10.0, "measured_peak_gib": 10.0 * r} for r in ratios]}

    wide = [1.0 + i / 100 for i in range(-40, 41)]  # runs from 40% under to 40% over their estimates
    looks = [look("a", wide), look("b", wide), look("c", [1.5, 1.0])]
    rows = {name: rest for name, *rest in first_looks.leave_one_set_out(looks)}
    n, hi, lo, up, both = rows["c"]  # judged by a and b: their 80th / 20th percentiles are +24% / -24%
    assert (n, up, both) == (2, 1, 1) and hi == pytest.approx(0.24) and lo == pytest.approx(-0.24)
    n, hi, lo, up, both = rows["a"]  # judged by b and c
    assert n == 81 and hi == pytest.approx(first_looks.percentile([r - 1 for r in wide] + [0.5, 0.0], 80))
    assert up == sum(r - 1 <= hi + 1e-12 for r in wide)


@pytest.mark.skipif(subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=RECORDS.parent,
                                   capture_output=True, text=True).stdout.strip() != "false",
                    reason="needs the repository's git history")  # fmt: skip
def test_a_recorded_first_look_is_what_the_freezing_commit_predicts() -> None:
    """benchmarks/first_looks.py really runs the old code: the third set (2 peaks) reproduces its recorded look."""
    recorded = {s["set"]: s for s in json.loads(FIRST_LOOKS.read_text())}
    look = first_looks.first_look(RECORDS.with_name("published_heldout3.yaml"))
    assert look["commit"] == recorded["published_heldout3.yaml"]["commit"]
    assert look["records"] == recorded["published_heldout3.yaml"]["records"]
    assert first_looks.signed_errors([look])  # it modelled some of them


def test_allocated_reserved_and_context_add_up_to_the_peak() -> None:
    cat = get_catalog()
    job = parse_job(LLAMA7B)
    e = estimate_transformer(job, hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=4), Strategy.ZERO2, cat)
    m = e.memory
    assert 0 < m.allocated < m.reserved_expandable <= m.reserved < m.peak
    assert m.peak == pytest.approx(m.reserved + m.context)
    assert m.context == pytest.approx((cat.assumption("cuda_context_gib") + cat.assumption("nccl_buffers_gib")) * GIB)
    assert m.reserved - m.allocated == pytest.approx(cat.assumption("allocator_fragmentation") * m.allocated)
    d = e.to_dict()["memory"]
    assert d["allocated_gib"] < d["reserved_gib"] < d["peak_gib"]


def test_the_margin_is_stated_and_borderline_means_within_the_band() -> None:
    cat = get_catalog()
    job = parse_job(LLAMA7B)
    e = estimate_transformer(job, hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=4), Strategy.ZERO2, cat)
    spare = 80 - e.memory.peak / GIB
    assert e.fits and not e.borderline
    assert e.memory_verdict() == f"fits, {spare:.1f} GiB ({spare / 80:.0%}) to spare"
    # borderline exactly when the capacity lies within the band above the estimate
    reach = 80 * GIB / e.memory.peak - 1  # how far above its estimate the run would have to peak to run out
    wide = replace(e, memory_band=reach + 0.01, memory_band_below=reach + 0.01)
    assert wide.borderline and wide.memory_verdict().startswith("borderline:") and f"±{reach + 0.01:.0%}" in wide.memory_verdict()
    assert not replace(e, memory_band=reach - 0.01).borderline
    lopsided = replace(e, memory_band=reach + 0.01, memory_band_below=0.25)
    assert f"−25% … +{reach + 0.01:.0%} of the estimate" in lopsided.memory_verdict()
    assert lopsided.to_dict()["memory_verdict"]["band_below"] == 0.25
    short = estimate_transformer(job, hardware_for_gpu(find_accelerator("A100-40GB"), cat, gpus=1), Strategy.SINGLE, cat)
    assert not short.fits and short.memory_verdict().startswith("does not fit, short by")
    # a short option is borderline when the band below the estimate reaches the capacity
    under = 1 - 40 * GIB / short.memory.peak  # how far under its estimate the run would have to peak to fit
    assert replace(short, memory_band_below=under + 0.01).borderline
    assert not replace(short, memory_band_below=under - 0.01).borderline
    assert e.to_dict()["memory_verdict"]["band"] == cat.assumption("memory_error_band_analytic")


def test_a_memory_margin_is_not_read_as_the_verdict_of_an_option_rejected_for_another_reason() -> None:
    cat = get_catalog()
    e = estimate_transformer(parse_job(LLAMA7B), hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=4),
                             Strategy.ZERO2, cat)
    over_budget = replace(e, rejection=Rejection(RejectKind.BUDGET, "costs $900, over the $500 budget", 900, 500, "USD"))
    text = over_budget.memory_verdict()
    assert text.startswith("memory fits,") and "rejected for another reason (budget)" in text
    assert not text.startswith("fits")
    too_big = estimate_transformer(parse_job(LLAMA7B), hardware_for_gpu(find_accelerator("A100-40GB"), cat, gpus=1),
                                   Strategy.SINGLE, cat)
    assert too_big.rejection.kind is RejectKind.DEVICE_MEMORY and too_big.memory_verdict().startswith("does not fit")


def test_a_borderline_best_option_is_said_so() -> None:
    cat = get_catalog()
    job = parse_job(LLAMA7B)
    hw = hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=4)
    safe = estimate_transformer(job, hw, Strategy.ZERO3, cat)
    tight = replace(estimate_transformer(job, hw, Strategy.ZERO2, cat), memory_band=1.0, cost_usd=safe.cost_usd / 2)
    plan = rank([safe, tight], job, Objective.COST)
    assert plan.options[0] is tight and plan.warnings
    assert "borderline" in plan.warnings[0] and "#2" in plan.warnings[0]
    assert not rank([safe], job, Objective.COST).warnings


@pytest.mark.parametrize(("gpu", "gpus", "strategy"), [("A100-80GB", 4, Strategy.ZERO2), ("H100-80GB", 8, Strategy.FSDP),
                                                        ("RTX4090", 1, Strategy.ZERO3_OFFLOAD)])  # fmt: skip
def test_the_largest_micro_batch_fits_and_the_next_does_not(gpu: str, gpus: int, strategy: Strategy) -> None:
    cat = get_catalog()
    job = parse_job({**LLAMA7B, "global_batch": 64})
    hw = hardware_for_gpu(find_accelerator(gpu), cat, gpus=gpus)
    prof = transformer_profile(job, cat)
    fit = max_micro_batch(job, prof, hw, strategy, cat)
    per_rank = 64 // gpus
    if fit.micro_batch:
        assert _fits(job, prof, hw, strategy, cat, micro_batch=fit.micro_batch)
        bigger = [d for d in range(fit.micro_batch + 1, per_rank + 1) if per_rank % d == 0]
        assert not any(_fits(job, prof, hw, strategy, cat, micro_batch=d) for d in bigger)
        assert fit.micro_batch * fit.grad_accumulation * gpus == 64
    if fit.longest_seq_len:
        assert _fits(job, prof, hw, strategy, cat, micro_batch=1, seq_len=fit.longest_seq_len)
        assert not _fits(job, prof, hw, strategy, cat, micro_batch=1, seq_len=fit.longest_seq_len + 1)
    # a zero answer is a claim too: nothing smaller fits (the RTX 4090 case: LLaMA-7B's states do not fit at all)
    if not fit.micro_batch:
        assert not _fits(job, prof, hw, strategy, cat, micro_batch=1)
    if not fit.longest_seq_len:
        assert not _fits(job, prof, hw, strategy, cat, micro_batch=1, seq_len=1)


def test_profiles_shared_across_options_give_the_same_answers() -> None:
    cat = get_catalog()
    job = parse_job({**LLAMA7B, "global_batch": 64})
    prof = transformer_profile(job, cat)
    memo: dict = {}
    for gpu, gpus, strategy in [("A100-80GB", 4, Strategy.ZERO2), ("H100-80GB", 8, Strategy.FSDP), ("A100-40GB", 8, Strategy.ZERO3)]:
        hw = hardware_for_gpu(find_accelerator(gpu), cat, gpus=gpus)
        assert max_micro_batch(job, prof, hw, strategy, cat, profiles=memo) == max_micro_batch(job, prof, hw, strategy, cat)
    assert memo and all(key[0] >= 1 for key in memo)


def test_when_nothing_fits_the_answer_says_why() -> None:
    cat = get_catalog()
    job = parse_job({**LLAMA7B, "model": "llama-2-70b"})
    hw = hardware_for_gpu(find_accelerator("A100-40GB"), cat, gpus=1)
    fit = max_micro_batch(job, transformer_profile(job, cat), hw, Strategy.SINGLE, cat)
    assert fit.micro_batch == 0 and fit.text.startswith("even micro-batch 1 does not fit (needs")


def test_without_a_global_batch_any_micro_batch_is_tried() -> None:
    cat = get_catalog()
    job = parse_job({**LLAMA7B, "model": "gpt2", "seq_len": 1024})
    fit = max_micro_batch(job, transformer_profile(job, cat), hardware_for_gpu(find_accelerator("A100-80GB"), cat, gpus=1),
                          Strategy.SINGLE, cat)  # fmt: skip
    assert fit.micro_batch > 8 and fit.grad_accumulation == 1 and fit.global_batch == fit.micro_batch


def test_cli_max_micro_batch(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path))
    assert main(["estimate", "--gpu", "A100-80GB", "--gpus", "4", "--strategy", "zero2", "--max-micro-batch", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["micro_batch_fit"]
    assert fit["max_micro_batch"] >= 1 and fit["grad_accumulation"] >= 1
    tab = tmp_path / "xgb.yaml"
    tab.write_text("kind: tabular\nlibrary: xgboost\nrows: 1000\nfeatures: 10\n")
    assert main(["estimate", str(tab), "--cpus", "8", "--max-micro-batch"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--max-micro-batch" in err and "Traceback" not in err
