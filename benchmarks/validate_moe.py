"""Published mixture-of-experts training runs against trainplan's expert-parallel estimates.

    python benchmarks/validate_moe.py

Reads tests/data/published_moe_layouts.yaml (the runs of published_moe.yaml that trainplan can state: their model
preset, hardware, layout and batch, each with its source), estimates each with its published layout (``estimate
--tp --pp --vpp --ep --sp --strategy``) and prints predicted vs measured tokens/s per GPU, or step time where the
source gives only that, with the peak memory per rank and whether trainplan calls the layout a fit.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import yaml

from trainplan.catalog import get_catalog
from trainplan.errors import TrainplanError
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.transformer import estimate_transformer
from trainplan.spec import parse_job
from trainplan.strategies import Layout, Strategy

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"


def compare(rec: dict, cat) -> tuple[str, float, float, object] | str:  # noqa: ANN001
    """(metric, predicted, measured, estimate) of one record, or why it could not be estimated."""
    hw_rec, p = rec["hardware"], rec["parallel"]
    job = parse_job({
        "kind": "transformer", "name": rec["id"], "model": rec["preset"], "method": "full", "seq_len": rec["seq_len"],
        "micro_batch": rec["micro_batch"], "global_batch": rec["global_batch"], "precision": rec.get("precision", "bf16"),
        "optimizer": "adamw", "steps": 1, "activation_checkpointing": rec["activation_checkpointing"],
        "flash_attention": rec.get("flash_attention", "auto"), "knobs": rec.get("knobs", {}),
    })  # fmt: skip
    acc = cat.accelerators[hw_rec["accelerator"]]
    hw = hardware_for_gpu(acc, cat, gpus=hw_rec["gpus_per_node"], nodes=hw_rec["nodes"])
    try:
        layout = Layout(hw_rec["gpus_per_node"], hw_rec["nodes"], tp=p.get("tp", 1), pp=p.get("pp", 1),
                        vpp=p.get("vpp", 1), cp=p.get("cp", 1), ep=p.get("ep", 1),
                        sequence_parallel=bool(p.get("sp", False)))  # fmt: skip
        e = estimate_transformer(job, replace(hw, layout=layout), Strategy(rec["sharding"]), cat)
    except (TrainplanError, ValueError) as exc:
        return f"refused: {exc}"
    m = rec["metric"]
    world = hw_rec["gpus_per_node"] * hw_rec["nodes"]
    if "tokens_per_s_per_gpu" in m:
        return "tok/s/GPU", e.throughput / world, float(m["tokens_per_s_per_gpu"]), e
    return "step s", e.step_time_s, float(m["step_time_s"]), e


def main() -> None:
    cat = get_catalog()
    errors: list[float] = []
    print(f"{'record':46} {'layout':24} {'metric':10} {'pred':>9} {'meas':>9} {'err':>7}  fits  peak GiB")
    for rec in yaml.safe_load((DATA / "published_moe_layouts.yaml").read_text()):
        out = compare(rec, cat)
        if isinstance(out, str):
            print(f"{rec['id']:46} {out}")
            continue
        metric, pred, meas, e = out
        # tokens/s: predicted/measured - 1; step time: the same sign convention as throughput (predicted faster > 0)
        err = pred / meas - 1 if metric != "step s" else meas / pred - 1
        errors.append(err)
        print(f"{rec['id']:46} {e.hardware.layout.describe():24} {metric:10} {pred:9.4g} {meas:9.4g} {err:+7.1%}  "
              f"{'yes' if e.fits else 'no ':4}  {e.memory.peak / 2**30:6.1f}" + ("" if e.fits else f"  ({e.reason[:60]})"))
    if errors:
        print(f"\nthroughput error (predicted faster > 0): median |error| {statistics.median(abs(x) for x in errors):.1%}, "
              f"median {statistics.median(errors):+.1%}, worst {max(errors, key=abs):+.1%} over {len(errors)} runs")


if __name__ == "__main__":
    main()
