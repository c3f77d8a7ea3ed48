"""Ray: a Ray Train driver for the plan, run on a local Ray instance or sent with ``ray job submit``.

Neural jobs: a ``TorchTrainer`` whose ``ScalingConfig`` has the plan's processes
(one worker per GPU, ``use_gpu`` on GPU plans); Ray creates the process group
and each worker runs trainplan's worker (or your script) on ``run.json``.
Tabular jobs: ``XGBoostTrainer`` / ``LightGBMTrainer``; Ray connects the
workers' libraries (XGBoost's collective, LightGBM's network), each worker trains
on its share of the rows and they grow one model together.

Locally (no ``--address``) the driver starts Ray with the CPUs the workers
need and stops it at the end; with ``--address`` the command is ``ray job submit
--address ADDR --working-dir OUT -- python ray_driver.py`` (the driver finds
``run.json`` beside itself; the run directory must be storage the cluster sees).
"""

from __future__ import annotations

from trainplan.measure.probe import Accelerator
from trainplan.run.targets.base import Command, LaunchPlan, Rendered, unsupported
from trainplan.run.targets.common import RUN_JSON, base_files, cluster_release_notes, python, worker_env
from trainplan.run.targets.tabular import header, library_params
from trainplan.spec import TabularLibrary

DRIVER = "ray_driver.py"

_BODY = '''
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import ray
import ray.train

HERE = Path(__file__).resolve().parent
RUN_JSON = str(HERE / "run.json")


def _worker_env():
    ctx = ray.train.get_context()
    os.environ.update(ENV)
    os.environ[CONFIG_ENV] = RUN_JSON
    return ctx


def neural_loop(cfg=None):
    """One Ray Train worker: trainplan's worker (or the user's script) inside Ray's process group."""
    ctx = _worker_env()
    local = ctx.get_local_rank()
    if USE_GPU:
        import torch

        local = local if torch.cuda.device_count() > local else 0  # Ray may show each worker only its GPU
    os.environ.update(RANK=str(ctx.get_world_rank()), WORLD_SIZE=str(ctx.get_world_size()), LOCAL_RANK=str(local))
    if SCRIPT:
        import runpy

        sys.argv = [SCRIPT, *SCRIPT_ARGS]
        runpy.run_path(SCRIPT, run_name="__main__")
        return
    from trainplan.run.worker import main

    code = main([RUN_JSON])
    if code:
        raise RuntimeError(f"trainplan worker exited with {code}")


def _record(rank, world, rows, model_bytes, loss, seconds):
    out = Path(RUN_DIR) / "ray"
    out.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "world_size": world, "rows": rows, "pid": os.getpid(), "loss": loss,
              "train_s": seconds, "model_sha256": hashlib.sha256(model_bytes).hexdigest()}
    (out / f"rank{rank}.json").write_text(json.dumps(record))


def tabular_loop(cfg=None):
    """One Ray Train worker: this worker's share of the rows; the library's collective joins the workers."""
    ctx = _worker_env()
    from trainplan.run.config import RunConfig
    from trainplan.run.workloads.tabular import load_table

    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    X, y = load_table(RunConfig.read(RUN_JSON).load_job())
    X, y = X[rank::world], y[rank::world]
    start = time.perf_counter()
    if LIBRARY == "xgboost":
        import xgboost

        history = {}
        data = xgboost.DMatrix(X, label=y)
        booster = xgboost.train(PARAMS, data, num_boost_round=ROUNDS, evals=[(data, "train")],
                                evals_result=history, verbose_eval=False)
        metric = next(iter(history["train"].values()))
        model, loss = bytes(booster.save_raw("ubj")), float(metric[-1])
        if rank == 0:
            (Path(RUN_DIR) / "models").mkdir(parents=True, exist_ok=True)
            booster.save_model(str(Path(RUN_DIR) / "models" / "ray.ubj"))
    else:
        import lightgbm
        from ray.train.lightgbm import get_network_params

        params = {**PARAMS, **get_network_params(), "tree_learner": "data_parallel"}
        booster = lightgbm.train(params, lightgbm.Dataset(X, label=y), num_boost_round=ROUNDS)
        text = booster.model_to_string()
        model, loss = text.encode(), None
        if rank == 0:
            (Path(RUN_DIR) / "models").mkdir(parents=True, exist_ok=True)
            booster.save_model(str(Path(RUN_DIR) / "models" / "ray.txt"))
    _record(rank, world, len(y), model, loss, time.perf_counter() - start)


def main():
    local = "RAY_ADDRESS" not in os.environ
    if local:
        env_vars = {k: v for k, v in os.environ.items() if k in ("PYTHONPATH", "TORCH_EXTENSIONS_DIR", "TRAINPLAN_HOME")}
        ray.init(num_cpus=NUM_WORKERS * CPUS_PER_WORKER, include_dashboard=False,
                 runtime_env={"env_vars": env_vars} if env_vars else None)
    else:
        ray.init()
    resources = {"CPU": CPUS_PER_WORKER, **({"GPU": 1} if USE_GPU else {})}
    scaling = ray.train.ScalingConfig(num_workers=NUM_WORKERS, use_gpu=USE_GPU, resources_per_worker=resources)
    storage = {"storage_path": str(HERE / "ray_results")} if local else {}
    run_config = ray.train.RunConfig(name=NAME, **storage)
    if LIBRARY is None:
        from ray.train.torch import TorchTrainer

        trainer = TorchTrainer(neural_loop, scaling_config=scaling, run_config=run_config)
    elif LIBRARY == "xgboost":
        from ray.train.xgboost import XGBoostTrainer

        trainer = XGBoostTrainer(tabular_loop, scaling_config=scaling, run_config=run_config)
    else:
        from ray.train.lightgbm import LightGBMTrainer

        trainer = LightGBMTrainer(tabular_loop, scaling_config=scaling, run_config=run_config)
    started = time.perf_counter()
    try:
        trainer.fit()
    finally:
        if local:
            ray.shutdown()
    print(json.dumps({"status": "completed", "workers": NUM_WORKERS, "wall_s": round(time.perf_counter() - started, 2)}))


if __name__ == "__main__":
    main()
'''


def check(plan: LaunchPlan) -> None:
    if plan.is_tabular and plan.job.library is TabularLibrary.CATBOOST:
        raise unsupported(plan, "Ray Train has no CatBoost trainer; CatBoost trains on one machine: --to local, slurm or skypilot")
    if plan.is_tabular and plan.job.library not in (TabularLibrary.XGBOOST, TabularLibrary.LIGHTGBM):
        raise unsupported(
            plan, f"Ray Train has XGBoost and LightGBM trainers; {plan.job.library.value} runs with --to dask (joblib's dask backend)"
        )
    if plan.options.address is not None and not plan.options.address.strip():
        raise unsupported(plan, "--address is empty")


def render(plan: LaunchPlan) -> Rendered:
    check(plan)
    p = plan.placement
    config_path = str(plan.path(RUN_JSON))
    env = worker_env(plan, config_path)
    if plan.is_tabular:
        workers = plan.options.workers or p.world_size
        cpus = max(1, p.cpus_per_node // workers) if workers <= p.cpus_per_node else 1
        env["OMP_NUM_THREADS"] = str(cpus)
        library = plan.job.library.value
        params = library_params(plan.job, cpus)
    else:
        workers, cpus, library, params = p.world_size, max(1, plan.config.threads_per_process), None, {}
    script = plan.options.script
    constants = header(
        NAME=f"trainplan-{plan.name}",
        NUM_WORKERS=workers,
        CPUS_PER_WORKER=cpus,
        USE_GPU=p.device is Accelerator.CUDA and not plan.is_tabular,
        LIBRARY=library,
        PARAMS=params,
        ROUNDS=getattr(plan.job, "trees", 0),
        RUN_DIR=plan.config.out_dir,
        ENV={k: v for k, v in env.items() if k != "TRAINPLAN_RUN_CONFIG"},
        CONFIG_ENV="TRAINPLAN_RUN_CONFIG",
        SCRIPT=str(script) if script else None,
        SCRIPT_ARGS=list(plan.options.script_args),
    )
    what = f"{library} on {workers} workers" if library else f"TorchTrainer, {workers} workers, {plan.strategy.value}"
    source = f'"""Ray Train driver rendered by trainplan launch --to ray: {plan.name}, {what}."""\n' + constants + _BODY
    files = base_files(plan)
    files[DRIVER] = source
    address = plan.options.address
    if address:
        argv = ("ray", "job", "submit", "--address", address, "--working-dir", str(plan.out), "--", "python", DRIVER)
        where = f"this machine, submitting to the Ray cluster at {address}"
    else:
        argv = (python(plan), str(plan.path(DRIVER)))
        where = "this machine (a local Ray instance)"
    return Rendered(plan.target, files, (Command(argv=argv, where=where, cwd=plan.out),), cluster_release_notes(plan))
