"""Helpers shared by the CLI commands: the built-in job, JSON output."""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

from trainplan.spec import Job, load_job

REFERENCE_JOB = "llama7b-sft.yaml"


def example_path(name: str) -> Path:
    """Path of a job file shipped with trainplan (``trainplan/examples``)."""
    return Path(str(resources.files("trainplan.examples").joinpath(name)))


def read_job(path: Path | None) -> Job:
    """The job at ``path``, or the built-in reference job (LLaMA-7B full fine-tune); its clouds and owned machines
    checked against the catalog (built-in and the user's)."""
    from trainplan.catalog import get_catalog
    from trainplan.planner.core import check_clouds, check_owned

    job = load_job(path if path is not None else example_path(REFERENCE_JOB))
    check_clouds(job, get_catalog())
    check_owned(job, get_catalog())
    return job


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dump_json(obj: Any) -> str:
    """JSON with non-finite numbers as null (valid JSON for every consumer)."""
    return json.dumps(_finite(obj), indent=2)


def grid_regions(values: list[str], catalog: Any) -> dict[str, str]:
    """``--region CLOUD:REGION`` options → {cloud: region} (an unknown region is one clear error)."""
    from trainplan.errors import SpecError
    from trainplan.estimate.energy import parse_region

    out: dict[str, str] = {}
    for v in values:
        cloud, region = parse_region(v, catalog)
        if cloud in out and out[cloud] != region:
            raise SpecError(f"two regions for {cloud}: {out[cloud]} and {region}", field="--region")
        out[cloud] = region
    return out
