"""Published tensor / pipeline / context parallel runs against trainplan's model-parallel estimates.

    python benchmarks/validate_parallel.py

Reads the runs of tests/data/published_llm.yaml whose layouts tests/data/published_parallel.yaml states, estimates
each with its published layout (``estimate … --tp --pp --cp --sp --strategy``) and prints predicted vs measured:
MFU where the source states MFU, achieved TFLOP/s per GPU where it states that (Narayanan et al. count the
recomputation, so trainplan's executed FLOPs are compared), step time where it states one.  Memory per rank is
printed, and whether trainplan calls the published layout a fit.  Runs whose hardware has no catalog row
(torchtitan's 500 W H100-96GB) are listed as skipped.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from trainplan.catalog import get_catalog
from trainplan.errors import TrainplanError
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.published import _model
from trainplan.estimate.transformer import estimate_transformer
from trainplan.spec import parse_job
from trainplan.strategies import Layout, Strategy

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def main() -> None:
    cat = get_catalog()
    records = {r["id"]: r for r in yaml.safe_load((DATA / "published_llm.yaml").read_text())}
    layouts = yaml.safe_load((DATA / "published_parallel.yaml").read_text())
    errors: list[float] = []
    print(f"{'record':36} {'layout':26} {'metric':10} {'pred':>8} {'meas':>8} {'err':>7}  fits  peak GiB")
    for lay in layouts:
        rec = records[lay["id"]]
        hw_rec = rec["hardware"]
        acc = cat.accelerators.get(hw_rec["accelerator"])
        if acc is None:
            print(f"{rec['id']:36} skipped: no catalog row for {hw_rec['accelerator']}")
            continue
        job = parse_job({
            "kind": "transformer", "name": rec["id"], "model": _model(rec["model"]), "method": "full",
            "seq_len": rec["seq_len"], "micro_batch": rec.get("micro_batch") or 1, "global_batch": rec["global_batch"],
            "precision": rec.get("precision", "bf16"), "optimizer": "adamw", "steps": 1,
            "activation_checkpointing": lay.get("activation_checkpointing", rec.get("activation_checkpointing") or "none"),
            "knobs": lay.get("knobs", {}),  # what the source states of the pipeline split
        })  # fmt: skip
        p = lay["parallel"]
        hw = hardware_for_gpu(acc, cat, gpus=hw_rec["gpus_per_node"], nodes=hw_rec["nodes"])
        layout = Layout(hw_rec["gpus_per_node"], hw_rec["nodes"], tp=p.get("tp", 1), pp=p.get("pp", 1),
                        vpp=p.get("vpp", 1), cp=p.get("cp", 1), sequence_parallel=bool(p.get("sp", False)))
        try:
            e = estimate_transformer(job, replace(hw, layout=layout), Strategy(lay["sharding"]), cat)
        except TrainplanError as exc:
            print(f"{rec['id']:36} refused: {exc}")
            continue
        m = rec["measured"]
        if "mfu" in m and "achieved_tflops_per_gpu" in m and rec["id"].startswith("llama3"):
            metric, pred, meas = "MFU", e.mfu or 0.0, m["mfu"]
        elif "step_time_s" in m:
            metric, pred, meas = "step s", e.step_time_s, m["step_time_s"]
        else:
            metric, pred, meas = "TFLOP/s", (e.flops_per_step or 0.0) / e.step_time_s / 1e12, m["achieved_tflops_per_gpu"]
        err = pred / meas - 1
        errors.append(abs(err))
        print(f"{rec['id']:36} {layout.describe():26} {metric:10} {pred:8.3g} {meas:8.3g} {err:+7.1%}  {'yes' if e.fits else 'no ':4}  "
              f"{e.memory.peak / 2**30:6.1f}" + ("" if e.fits else f"  ({e.reason[:70]})"))
    if errors:
        print(f"\nmedian |error| {statistics.median(errors):.1%} over {len(errors)} runs; worst {max(errors):.1%}")


if __name__ == "__main__":
    main()
