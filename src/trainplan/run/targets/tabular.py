"""Library parameters of a tabular job for the distributed engines (Ray, Dask): the ones `trainplan run` uses."""

from __future__ import annotations

from typing import Any

from trainplan.run.workloads.tabular import lightgbm_params, xgboost_params
from trainplan.spec import TabularJob, TabularLibrary


def library_params(job: TabularJob, threads: int) -> dict[str, Any]:
    """The job's parameters for its library (empty for scikit-learn, whose model trainplan builds itself)."""
    classes = None if job.objective == "regression" else job.classes
    if job.library is TabularLibrary.XGBOOST:
        return xgboost_params(job, classes, threads)
    if job.library is TabularLibrary.LIGHTGBM:
        return lightgbm_params(job, classes, threads)
    return {}


def header(**constants: Any) -> str:
    """Module constants for a generated driver, one ``NAME = repr(value)`` line each."""
    return "".join(f"{name} = {value!r}\n" for name, value in constants.items())
