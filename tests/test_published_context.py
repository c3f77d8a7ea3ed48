"""The published longest-sequence measurements (issue 18 item 6): frozen, usable, and the costly verdict right.

tests/data/published_context.yaml was committed before trainplan estimated any of its rows; its first look is in
docs/benchmarks.md ("Longest sequence that fits"). Its SHA-256 is pinned so that a row dropped or "corrected"
after the look fails CI. ``benchmarks/validate_context.py`` prints the figures.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import yaml

from trainplan.catalog import get_catalog

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "published_context.yaml"
FROZEN_SHA256 = "223a2525716ca0837cd13694f24ccbd90ad061b7af2460c8cef8bc4e0f40dfb8"


def _validator():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("validate_context", ROOT / "benchmarks" / "validate_context.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_file_is_the_frozen_one() -> None:
    assert hashlib.sha256(DATA.read_bytes()).hexdigest() == FROZEN_SHA256


def test_every_row_is_a_job_and_published_out_of_memory_rows_fit_nothing() -> None:
    """A run the source saw run out of memory even at its shortest must not be given a sequence length that fits."""
    validator = _validator()
    rows = yaml.safe_load(DATA.read_text())
    cat = get_catalog()
    assert len({r["id"] for r in rows}) == len(rows) >= 20
    for rec in rows:
        assert rec["model"] in cat.models and validator.job_of(rec) is not None, rec["id"]
    oom = [r for r in rows if r["measured_longest_tokens"] is None]
    assert len(oom) >= 4
    assert all(validator.longest(r, cat) == 0 for r in oom)
    # and a row that ran is given some length (the search is not stuck at zero)
    ran = next(r for r in rows if r["measured_longest_tokens"] and not r.get("knobs"))
    assert validator.longest(ran, cat) > 0
