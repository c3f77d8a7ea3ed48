"""Korthikanti et al. 2022's eight Selene runs (tests/data/published_korthikanti.yaml) are stated and called fits.

Their step times are compared in benchmarks/validate_korthikanti.py (a benchmark, not a test); here: every record
describes a layout trainplan accepts for its model, and every published run — trained on 80 GB A100s — is called a fit,
and sequence parallel + selective recomputation is predicted faster than full recomputation on the same layout, as
measured."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "validate_korthikanti.py"


def _estimates() -> dict[str, tuple[float, bool, float]]:
    spec = importlib.util.spec_from_file_location("validate_korthikanti", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.estimates()


def test_every_published_layout_is_stated_and_fits() -> None:
    est = _estimates()
    assert len(est) == 8
    for rid, (_, fits, _) in est.items():
        assert fits, rid
    for model in ("22b", "175b", "530b", "1t"):
        full, selective = est[f"korthikanti-{model}-full"], est[f"korthikanti-{model}-sp-selective"]
        assert selective[0] < full[0] and selective[2] < full[2]  # faster, as measured


def test_each_layout_divides_its_gpus_and_layers() -> None:
    import yaml

    for rec in yaml.safe_load(BENCH.parents[1].joinpath("tests/data/published_korthikanti.yaml").read_text()):
        gpus = rec["hardware"]["gpus_per_node"] * rec["hardware"]["nodes"]
        p = rec["parallel"]
        assert gpus == p["tp"] * p["pp"], rec["id"]  # data parallel 1 in every run of the table
        assert rec["model"]["layers"] % (p["pp"] * p["vpp"]) == 0, rec["id"]
