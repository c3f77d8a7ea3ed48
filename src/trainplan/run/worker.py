"""The process ``trainplan run`` launches for built-in workloads.

``python -m trainplan.run.worker [RUN_JSON]`` (the path defaults to
``$TRAINPLAN_RUN_CONFIG``) trains the job in ``run.json``: neural jobs through
:mod:`trainplan.run.runtime` — the same code path a user's script takes through
:mod:`trainplan.runtime` — and tabular jobs with
:func:`~trainplan.run.workloads.tabular.fit_folds`.  Rank 0 writes
``result.json`` (a :class:`~trainplan.run.results.WorkerResult`); the exit code
is 0 for a completed or preempted run.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from trainplan.run.config import RunConfig
from trainplan.run.results import GIB, RunStatus, WorkerResult, WorkloadFacts
from trainplan.spec import JobKind, Precision
from trainplan.strategies import Strategy


def allow_tf32_matmul(job: Any) -> bool:
    """``knobs.tf32_matmul``: fp32 matmuls on TF32 tensor cores, as the estimate then prices them (PyTorch's
    ``torch.backends.cuda.matmul.allow_tf32``, off by default; cuDNN convolutions use TF32 already).  Returns
    whether it was switched on."""
    knobs = getattr(job, "knobs", None)
    if knobs is None or not knobs.tf32_matmul:
        return False
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    return True


def run_neural(config: RunConfig, job: Any) -> dict[str, Any] | None:
    """Train a transformer or torch job under the configured strategy; rank 0 returns the result."""
    import torch

    from trainplan.run import runtime
    from trainplan.run.workloads.common import optimizer_factory, parameter_count, to_device

    ctx = runtime.init(config)
    allow_tf32_matmul(job)
    if job.kind is JobKind.TRANSFORMER:
        from trainplan.run.workloads.transformer import transformer_workload

        wl = transformer_workload(job, world_size=ctx.data_world, micro_batch=config.micro_batch, config=config)
    else:
        from trainplan.run.workloads.torchjob import torch_workload

        wl = torch_workload(job, world_size=ctx.world_size, micro_batch=config.micro_batch, grad_accum=config.grad_accum)
    params = parameter_count(wl.model)
    trainable = parameter_count(wl.model, trainable=True)
    model, _ = ctx.wrap(wl.model, optimizer_factory(job.optimizer, job.learning_rate, model=wl.model), materialize=wl.materialize)
    if wl.load_note is not None:
        ctx.log_event("load", how=wl.load_note)
    start = ctx.resume()
    tokens = config.global_batch * wl.tokens_per_sample if wl.tokens_per_sample else None
    status = RunStatus.COMPLETED
    for step in range(start, config.total_steps):
        if ctx.pipelined:  # the schedule runs the step's micro-batches itself; stages hand activations on
            rows = torch.cat([wl.batch(step, micro, ctx.data_rank)["input_ids"] for micro in range(ctx.grad_accum)])
            mean_loss = ctx.pipeline_step(rows)
        else:
            loss_sum = 0.0
            for micro in range(ctx.grad_accum):
                inputs = to_device(wl.batch(step, micro, ctx.data_rank), ctx.device)
                with ctx.autocast():
                    loss = wl.loss(model, inputs)
                ctx.backward(loss)
                ctx.step()
                loss_sum = loss_sum + loss.detach().float()
            mean_loss = float(loss_sum) / ctx.grad_accum
        if ctx.end_of_step(step + 1, loss=mean_loss, tokens=tokens, samples=config.global_batch):
            status = RunStatus.PREEMPTED
            break
        if wl.evaluate is not None and wl.eval_every and (step + 1) % wl.eval_every == 0 and step + 1 < config.total_steps:
            ctx.log_event("eval", step=step + 1, eval_loss=wl.evaluate(model, ctx))
    if status is RunStatus.COMPLETED and wl.evaluate is not None:
        ctx.log_event("eval", step=config.total_steps, eval_loss=wl.evaluate(model, ctx))
    if status is RunStatus.COMPLETED and wl.save_final is not None:
        state = ctx.full_model_state()  # collective
        if state is not None:
            wl.save_final(state)
    workload = WorkloadFacts(
        params=params,
        trainable_params=trainable,
        samples_per_step=config.global_batch,
        tokens_per_step=tokens,
        flops_per_token=wl.flops_per_token,
    )
    return ctx.finish(status=status, workload=workload, save_model=wl.save_final is None)


def run_tabular(config: RunConfig, job: Any) -> WorkerResult:
    """Train a tabular job (its folds in parallel threads) and write ``result.json``."""
    from dataclasses import replace

    from trainplan.files import write_json_atomic
    from trainplan.measure.memory import PeakMemory
    from trainplan.measure.probe import Accelerator
    from trainplan.run.metrics import MetricsWriter
    from trainplan.run.rundir import RunPaths
    from trainplan.run.workloads.tabular import fit_folds

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    paths = RunPaths(config.out_dir)
    peak = PeakMemory("cpu")
    peak.reset()
    metrics = MetricsWriter(paths.metrics)
    metrics.event("start", parallel_fits=config.parallel_fits, threads_per_fit=config.threads_per_fit)
    try:
        result = fit_folds(
            job,
            out_dir=paths.root,
            parallel_fits=config.parallel_fits,
            threads_per_fit=config.threads_per_fit,
            write_metrics=metrics.write,
            stop=stop,
        )
        if result.status is RunStatus.PREEMPTED:
            metrics.event("preempted", step=result.steps)
    finally:
        metrics.close()
    result = replace(
        result,
        measured=replace(result.measured, peak_gib=peak.peak_bytes() / GIB),
        world_size=1,
        strategy=Strategy.SINGLE,
        device=Accelerator.CPU,
        precision=Precision.FP32,
        restarts=0,
        peak_method=peak.method,
    )
    write_json_atomic(paths.result, result.to_dict())
    return result


def warm_start() -> list[str] | None:
    """``--warm`` (:class:`trainplan.run.launch.WarmWorker`): import what a fine-tune needs, then wait for the launch
    on stdin — one JSON line of arguments, environment, working directory and log.  None when stdin closes first."""
    import json

    import transformers.modeling_utils  # noqa: F401 - torch and the model classes' base: most of the start-up

    from trainplan.run import runtime  # noqa: F401
    from trainplan.run.workloads import transformer  # noqa: F401

    line = sys.stdin.readline()
    if not line.strip():
        return None
    order = json.loads(line)
    os.environ.update(order["env"])
    os.chdir(order["cwd"])
    fd = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)  # from here on, what a worker started by render() writes goes to the run's log
    os.dup2(fd, 2)
    os.close(fd)
    return list(order["args"])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--warm"]:
        warm = warm_start()
        if warm is None:
            return 0
        args = warm
    args = [a for a in args if not a.startswith("--local_rank")]  # the deepspeed launcher adds it
    config = RunConfig.read(args[0]) if args else RunConfig.from_env()
    if config is None:
        print("usage: python -m trainplan.run.worker RUN_JSON (or set TRAINPLAN_RUN_CONFIG)", file=sys.stderr)
        return 2
    job = config.load_job()
    if job.kind is JobKind.TABULAR:
        from trainplan.errors import TrainplanError
        from trainplan.run.api import check_library_release

        try:  # on the node: a launch pins the job's named library release there; another one is refused
            check_library_release(job)
        except TrainplanError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        run_tabular(config, job)
    else:
        run_neural(config, job)
    return 0


if __name__ == "__main__":
    code = main()
    # Everything is written, closed and flushed; skip the interpreter's teardown of
    # torch / DeepSpeed, which takes 1–2 s per process and does no useful work here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
