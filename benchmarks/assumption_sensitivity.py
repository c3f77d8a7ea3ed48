"""How much two judgement constants move the estimator against the published records (issue 21).

`comm_overlap` (the share of gradient / parameter communication hidden behind compute) and `mfu_hidden_half`
(the width at which a traced model's default efficiency is half its asymptote) have no published figure behind
their values (catalog/data/assumptions.yaml says so). This prints the throughput error on
tests/data/published_llm.yaml (median |err|, median signed, share within 25 %) for a range of each, the shipped
value marked — the sensitivity a reader needs to weigh them.

    python benchmarks/assumption_sensitivity.py
"""

from __future__ import annotations

import statistics
from pathlib import Path

import yaml

from trainplan.catalog import get_catalog
from trainplan.estimate.published import compare

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_llm.yaml"
VALUES = {"comm_overlap": (0.5, 0.7, 0.8, 0.9, 1.0), "mfu_hidden_half": (64, 128, 256, 512, 1024)}


def errors(records: list[dict]) -> list[float]:
    return [c.throughput_error for c in (compare(r) for r in records) if c is not None and c.throughput_error is not None]


def main() -> None:
    records = yaml.safe_load(DATA.read_text())
    catalog = get_catalog()
    print(f"{'assumption':18} {'value':>7} {'n':>4} {'median |err|':>13} {'median err':>11} {'within 25%':>11}")
    for key, values in VALUES.items():
        shipped = catalog.assumptions[key]["value"]
        for v in values:
            catalog.assumptions[key]["value"] = v
            try:
                errs = errors(records)
            finally:
                catalog.assumptions[key]["value"] = shipped
            mark = "  (shipped)" if v == shipped else ""
            print(f"{key:18} {v:>7} {len(errs):4d} {statistics.median(abs(e) for e in errs):13.1%} "
                  f"{statistics.median(errs):+11.1%} {sum(abs(e) <= 0.25 for e in errs) / len(errs):11.0%}{mark}")


if __name__ == "__main__":
    main()
