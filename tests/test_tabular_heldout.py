"""The frozen tabular held-out set (issue 20): committed before any prediction of it, never used to choose a change;
`python benchmarks/validate_tabular.py` prints it apart. These tests keep it what was frozen and check that every row
is a job trainplan can read, from documents the in-sample tabular records do not cite."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent / "data"
HELDOUT = DATA / "published_tabular_heldout.yaml"
SHA256 = "81c918471f05b1ae0c9826786ddbcc579b85f5147c28b560939103895176e389"  # as committed, before any prediction
IN_SAMPLE = ("published_tabular.yaml", "published_tabular_gpu2024.yaml", "published_tabular_scaling.yaml",
             "published_tabular_scaling_c5.yaml")
sys.path.insert(0, str(DATA.parents[1] / "benchmarks"))


def test_the_set_is_the_frozen_one() -> None:
    assert hashlib.sha256(HELDOUT.read_bytes()).hexdigest() == SHA256


def test_every_row_is_sourced_timed_and_a_job_trainplan_reads() -> None:
    from validate_tabular import hardware_of, job_of

    from trainplan.catalog import get_catalog

    rows = yaml.safe_load(HELDOUT.read_text())
    cat = get_catalog()
    assert len({r["id"] for r in rows}) == len(rows) == 17
    for rec in rows:
        assert rec["source"] and rec["notes"] and rec["measured"]["train_s"] > 0, rec["id"]
        job, hw = job_of(rec), hardware_of(rec, cat)
        assert job.rows == rec["rows"] and job.trees == rec["trees"], rec["id"]
        if rec["hardware"]["kind"] == "gpu":
            assert hw.accelerator.id == rec["hardware"]["accelerator"] and hw.layout.world_size == rec["hardware"]["gpus"]
        else:  # physical cores: a row stating logical CPUs only runs on half as many (the header's rule 1)
            assert rec["hardware"]["threads"] <= rec["hardware"]["threads_as_collected"], rec["id"]


def test_its_documents_and_ids_are_new() -> None:
    rows = yaml.safe_load(HELDOUT.read_text())
    in_sample = "".join((DATA / name).read_text() for name in IN_SAMPLE)
    for document in ("ccao-data/report-model-benchmark", "pgagarinov/gbm-bench"):
        assert any(document in str(r["source"]) for r in rows) and document not in in_sample
    assert not any(r["id"] in in_sample for r in rows)
