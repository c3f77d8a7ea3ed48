"""Dask: tabular jobs on a Dask cluster — a local one the driver starts, or a scheduler at ``--address``.

XGBoost trains with ``xgboost.dask`` (one model over the workers' partitions),
LightGBM with its Dask estimators (``DaskLGBMClassifier`` / ``Regressor``),
scikit-learn with joblib's ``dask`` backend (the cross-validation folds, and a
random forest's trees, run as Dask tasks).  Neural jobs are not Dask's: use
torchrun, DeepSpeed, Ray, SLURM or SkyPilot.
"""

from __future__ import annotations

from trainplan.errors import SpecError
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import RUN_JSON, base_files, cluster_release_notes, python
from trainplan.run.targets.tabular import header, library_params
from trainplan.spec import TabularLibrary

DRIVER = "dask_driver.py"
RESULT = "dask_result.json"

_BODY = '''
import hashlib
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _arrays(X, y, parts):
    import dask.array as da
    import numpy as np

    rows = max(1, math.ceil(X.shape[0] / parts))
    # a sparse table (SciPy CSR: density < 1, an SVMlight file) stays sparse in each chunk; both libraries take it
    dense = isinstance(X, np.ndarray)
    dX = da.from_array(X, chunks=(rows, X.shape[1]), asarray=dense)
    return dX, da.from_array(y, chunks=(rows,))


def train(client, job, X, y, workers):
    """Train on the cluster; returns (model bytes, training loss or CV score, what was done)."""
    out = Path(RUN_DIR) / "models"
    out.mkdir(parents=True, exist_ok=True)
    if LIBRARY == "xgboost":
        import xgboost as xgb
        import xgboost.dask  # noqa: F401  (xgboost.dask must be imported explicitly)

        dX, dy = _arrays(X, y, workers)
        dtrain = xgb.dask.DaskDMatrix(client, dX, dy)
        result = xgb.dask.train(client, PARAMS, dtrain, num_boost_round=ROUNDS, evals=[(dtrain, "train")])
        booster = result["booster"]
        booster.save_model(str(out / "dask.ubj"))
        metric = next(iter(result["history"]["train"].items()))
        return bytes(booster.save_raw("ubj")), {"train_" + metric[0]: float(metric[1][-1]), "rounds": booster.num_boosted_rounds()}
    if LIBRARY == "lightgbm":
        import lightgbm as lgb

        dX, dy = _arrays(X, y, workers)
        cls = lgb.DaskLGBMRegressor if job.objective == "regression" else lgb.DaskLGBMClassifier
        params = {k: v for k, v in PARAMS.items() if k not in ("objective", "num_class")}
        model = cls(client=client, n_estimators=ROUNDS, **params).fit(dX, dy).to_local()
        model.booster_.save_model(str(out / "dask.txt"))
        return model.booster_.model_to_string().encode(), {"rounds": model.booster_.current_iteration()}
    import joblib
    from sklearn.model_selection import cross_val_score
    from trainplan.run.workloads.tabular import _sklearn_model

    model = _sklearn_model(job, job.classes if job.objective != "regression" else None, THREADS)
    with joblib.parallel_backend("dask"):
        scores = cross_val_score(model, X, y, cv=max(2, job.cv_folds), n_jobs=-1)
    return json.dumps([float(s) for s in scores]).encode(), {"cv_scores": [float(s) for s in scores]}


def main(address=None):
    from dask.distributed import Client, LocalCluster

    from trainplan.run.config import RunConfig
    from trainplan.run.workloads.tabular import load_table

    cluster = None
    if address:
        client = Client(address, timeout="20s")
    elif GPUS:
        from dask_cuda import LocalCUDACluster  # one worker per GPU (pip install dask-cuda)

        cluster = LocalCUDACluster(n_workers=WORKERS, threads_per_worker=THREADS, dashboard_address=None)
        client = Client(cluster)
    else:
        cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=THREADS, processes=True, dashboard_address=None)
        client = Client(cluster)
    try:
        job = RunConfig.read(HERE / "run.json").load_job()
        X, y = load_table(job)
        workers = len(client.scheduler_info()["workers"])
        start = time.perf_counter()
        model, facts = train(client, job, X, y, workers)
        record = {"status": "completed", "library": LIBRARY, "workers": workers, "rows": len(y),
                  "train_s": round(time.perf_counter() - start, 3), "model_sha256": hashlib.sha256(model).hexdigest(), **facts}
        (Path(RUN_DIR) / RESULT).write_text(json.dumps(record, indent=2) + "\\n")
        print(json.dumps(record))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
'''


def check(plan: LaunchPlan) -> None:
    if not plan.is_tabular:
        raise unsupported(
            plan, f"Dask runs tabular jobs (XGBoost, LightGBM, scikit-learn); a {plan.job.kind.value} job runs with --to torchrun, deepspeed, ray, slurm or skypilot"
        )
    if plan.job.library is TabularLibrary.CATBOOST:
        raise unsupported(plan, "CatBoost has no Dask estimator; it trains on one machine: --to local, slurm or skypilot")


def render(plan: LaunchPlan) -> Rendered:
    check(plan)
    p = plan.placement
    gpus = p.gpu is not None and plan.job.library is TabularLibrary.XGBOOST  # XGBoost on the option's GPUs
    if p.nodes > 1:  # one model over several machines (the plan's dask-cpu option): a worker on each, all its cores
        if not plan.options.address:
            raise SpecError(f"the option trains one model over {p.nodes} machines: give the scheduler of a Dask cluster "
                            f"with a worker on each (--address tcp://HOST:8786)", field="--address")  # fmt: skip
        workers, threads = plan.options.workers or p.nodes, p.cpus_per_node
    else:
        workers = plan.options.workers or p.world_size
        threads = max(1, p.cpus_per_node // workers)
    params = library_params(plan.job, threads)
    if gpus:
        params = {**params, "device": "cuda"}  # XGBoost >= 2.0: hist on the worker's GPU
    constants = header(
        LIBRARY=plan.job.library.value.split("-")[0] if plan.job.library.value.startswith("sklearn") else plan.job.library.value,
        PARAMS=params,
        GPUS=gpus,
        ROUNDS=plan.job.trees,
        WORKERS=workers,
        THREADS=threads,
        RUN_DIR=plan.config.out_dir,
        RESULT=RESULT,
    )
    source = f'"""Dask driver rendered by trainplan launch --to dask: {plan.name}, {plan.job.library.value}."""\n' + constants + _BODY
    files = base_files(plan)
    files[DRIVER] = source
    address = plan.options.address
    argv = (python(plan), str(plan.path(DRIVER)), *([address] if address else []))
    kind = f"a LocalCUDACluster of {workers} GPU workers" if gpus else f"a LocalCluster of {workers} workers"
    where = f"this machine, as a client of the scheduler at {address}" if address else f"this machine ({kind})"
    notes: tuple[str, ...] = (("the GPU workers need dask-cuda beside xgboost (pip install dask-cuda) on the machine or cluster",)
                              if gpus else ())  # fmt: skip
    if p.nodes > 1:
        notes += (f"the plan's {p.nodes} machines each run one Dask worker with {threads} threads "
                  f"(dask worker {address} --nworkers 1 --nthreads {threads}); the driver loads the whole table on "
                  "this machine and scatters it to them, so it needs the RAM of the data once",)  # fmt: skip
    return Rendered(plan.target, files, (Command(argv=argv, where=where, cwd=plan.out),), notes + cluster_release_notes(plan))
