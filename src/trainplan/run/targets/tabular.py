"""Library parameters of a tabular job for the distributed engines (Ray, Dask), from the job file."""

from __future__ import annotations

from typing import Any

from trainplan.spec import TabularJob, TabularLibrary


def xgboost_params(job: TabularJob, threads: int) -> dict[str, Any]:
    """``xgboost.train`` parameters: histogram trees, the job's depth, rate, bins and objective."""
    objective = {"regression": "reg:squarederror", "binary": "binary:logistic", "multiclass": "multi:softprob"}[job.objective]
    params: dict[str, Any] = {
        "tree_method": "hist",
        "max_depth": job.max_depth or 6,
        "eta": job.learning_rate,
        "max_bin": job.max_bins,
        "objective": objective,
        "nthread": threads,
        "seed": job.seed,
    }
    if job.num_leaves:
        params["max_leaves"] = job.num_leaves
    if job.objective == "multiclass":
        params["num_class"] = job.classes
    return params


def lightgbm_params(job: TabularJob, threads: int) -> dict[str, Any]:
    """LightGBM parameters (``lightgbm.train`` names; the Dask estimators take the same keywords)."""
    params: dict[str, Any] = {
        "objective": {"regression": "regression", "binary": "binary", "multiclass": "multiclass"}[job.objective],
        "learning_rate": job.learning_rate,
        "num_leaves": job.num_leaves or 31,
        "max_depth": job.max_depth or -1,
        "max_bin": job.max_bins,
        "num_threads": threads,
        "seed": job.seed,
        "verbosity": -1,
    }
    if job.objective == "multiclass":
        params["num_class"] = job.classes
    return params


def library_params(job: TabularJob, threads: int) -> dict[str, Any]:
    """The job's parameters for its library (empty for scikit-learn, whose model trainplan builds itself)."""
    if job.library is TabularLibrary.XGBOOST:
        return xgboost_params(job, threads)
    if job.library is TabularLibrary.LIGHTGBM:
        return lightgbm_params(job, threads)
    return {}


def header(**constants: Any) -> str:
    """Module constants for a generated driver, one ``NAME = repr(value)`` line each."""
    return "".join(f"{name} = {value!r}\n" for name, value in constants.items())
