"""Built-in workload for ``kind: keras``: the user's Keras 3 model under ``tf.distribute``.

``python -m trainplan.run.workloads.keras RUN_JSON`` trains the job in
``run.json``.  The plan's strategy maps to ``tf.distribute``
(:func:`tf_distribute_strategy`): ``single`` is one replica (the default
strategy); ``ddp`` is MirroredStrategy over one machine's GPUs,
MultiWorkerMirroredStrategy over processes or machines (what ``trainplan run``
uses on CPU: one worker process per device, ``TF_CONFIG`` naming them on
localhost), and TPUStrategy on a TPU VM.  With more than one process, the
launcher (this module without ``TF_CONFIG``) starts the workers, each with its
``TF_CONFIG``, forwards SIGTERM to them and waits.

Each worker feeds its own slice of the global batch (synthetic inputs shaped by
``inputs``, seeded by (seed, step, micro-step, rank): a resumed run replays the
same data), steps with ``model.train_on_batch`` (gradient accumulation through
the optimizer's ``gradient_accumulation_steps``), and checkpoints with
``tf.train.CheckpointManager`` — the chief into ``DIR/checkpoints``, the
others into a scratch directory, as MultiWorkerMirroredStrategy requires —
every ``--checkpoint-every`` steps or minutes, and on SIGTERM.  Rank 0 writes
``result.json``; every rank writes its final weights' digest (and, for models
under 10 M parameters, the weights) so that replicas can be compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainplan.errors import SpecError
from trainplan.measure.probe import Accelerator
from trainplan.run.config import CONFIG_ENV, RunConfig
from trainplan.run.launch import LaunchSpec
from trainplan.run.rundir import RunPaths
from trainplan.strategies import Strategy

RANK_ENV = "TRAINPLAN_KERAS_RANK"
#: Set to ``TPUStrategy`` by a rendered TPU VM launch (run/tpu.py ``tpu_launch("tf", ...)``): the worker then trains
#: under ``tf.distribute.TPUStrategy`` on this host's chips instead of starting CPU workers.
STRATEGY_ENV = "TRAINPLAN_TF_STRATEGY"
SAVE_WEIGHTS_MAX_PARAMS = 10_000_000


def tf_distribute_strategy(strategy: Strategy, *, processes: int, nodes: int = 1, accelerator: str = "cpu") -> str:
    """The ``tf.distribute`` strategy a plan's strategy runs as (Keras has no ZeRO/FSDP engine)."""
    if strategy is Strategy.SINGLE:
        if processes > 1:
            raise SpecError("single runs one replica; use ddp for several", field="--strategy")
        return "TPUStrategy" if accelerator == "tpu" else "OneDeviceStrategy"
    if strategy is not Strategy.DDP:
        raise SpecError(f"Keras jobs run single or ddp (tf.distribute data parallel), not {strategy.value}", field="--strategy")
    if accelerator == "tpu":
        return "TPUStrategy"
    if nodes > 1 or (processes > 1 and accelerator == "cpu"):
        return "MultiWorkerMirroredStrategy"
    return "MirroredStrategy"


def free_ports(n: int) -> list[int]:
    """``n`` free TCP ports on localhost (bound and released; the workers bind them next)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def tf_config(rank: int, ports: list[int], host: str = "localhost") -> str:
    """``TF_CONFIG`` of worker ``rank`` in a cluster of workers at ``host:ports`` (rank 0 is the chief)."""
    return json.dumps({"cluster": {"worker": [f"{host}:{p}" for p in ports]}, "task": {"type": "worker", "index": rank}})


def render_keras(config: RunConfig) -> LaunchSpec:
    """The command, environment and files of a Keras run on this machine (the launcher starts the workers)."""
    tf_distribute_strategy(config.strategy, processes=config.world_size, accelerator=config.accelerator.value)
    paths = RunPaths(Path(config.out_dir))
    env = {
        CONFIG_ENV: str(paths.run_config),
        "TRAINPLAN_RUN_DIR": str(paths.root),
        "PYTHONUNBUFFERED": "1",
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMP_NUM_THREADS": str(config.threads_per_process),
        # TensorFlow's BFC allocator on the CPU keeps allocation statistics: the measured peak is
        # tf.config.experimental.get_memory_info("CPU:0")["peak"] over the steady-state steps.
        "TF_CPU_ALLOCATOR_USE_BFC": "true",
    }
    if config.accelerator is Accelerator.CPU:
        env["CUDA_VISIBLE_DEVICES"] = ""
    argv = [sys.executable or "python3", "-m", "trainplan.run.workloads.keras", str(paths.run_config)]
    return LaunchSpec(argv=argv, env=env, files={paths.run_config: config.dumps()}, cwd=Path.cwd())


def check_keras_job(job: Any) -> Any:
    """Reject what cannot run before anything is launched: TensorFlow missing, a factory that does not import."""
    import importlib.util

    if importlib.util.find_spec("tensorflow") is None or importlib.util.find_spec("keras") is None:
        raise SpecError("kind: keras needs TensorFlow and Keras 3: pip install 'trainplan[tensorflow]'", field="kind")
    module = job.model.partition(":")[0]
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:  # found without importing it (that would import TensorFlow here); the workers import it
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise SpecError(f"cannot import module {module!r}", field="model")
    if job.data not in (None, "synthetic"):
        raise SpecError(f"for keras jobs, data is 'synthetic' (got {job.data!r})", field="data")
    return job


# --------------------------------------------------------------------------- launcher


def launch_workers(config: RunConfig, run_json: str) -> int:
    """Start ``world_size`` workers with their TF_CONFIG on localhost; forward SIGTERM; the worst exit code."""
    ports = free_ports(config.world_size)
    procs = []
    for rank in range(config.world_size):
        env = {**os.environ, "TF_CONFIG": tf_config(rank, ports), RANK_ENV: str(rank)}
        procs.append(subprocess.Popen([sys.executable, "-m", "trainplan.run.workloads.keras", run_json], env=env))

    def forward(signum: int, frame: Any) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [p.wait() for p in procs]
    return max(codes, key=abs)


# --------------------------------------------------------------------------- worker


def _seed(*key: int) -> int:
    return int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") & ((1 << 63) - 1)


def on_tpu_vm() -> bool:
    """Whether the launch asked for TPUStrategy (the rendered TPU VM task sets ``TRAINPLAN_TF_STRATEGY``)."""
    return os.environ.get(STRATEGY_ENV) == "TPUStrategy"


def make_strategy(tf: Any, config: RunConfig) -> Any:
    """The ``tf.distribute`` strategy of this worker: TPUStrategy over this TPU VM's chips (``TPUClusterResolver(
    tpu="local")``, then ``experimental_connect_to_cluster`` and ``initialize_tpu_system``, as TensorFlow's "Use TPUs"
    guide does on a TPU VM), MultiWorkerMirroredStrategy across CPU worker processes, else the default strategy."""
    if on_tpu_vm():
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if config.world_size > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.get_strategy()


def replica_shards(tf: Any, strategy: Any, v: Any) -> Any:
    """``v`` (rows = replicas × n) as a distributed value: replica r gets rows [r·n, (r+1)·n)."""
    replicas = strategy.num_replicas_in_sync
    if v.shape[0] % replicas:
        raise ValueError(f"{v.shape[0]} rows do not split over {replicas} replicas")
    rows = v.shape[0] // replicas

    def part(ctx: Any) -> Any:
        r = ctx.replica_id_in_sync_group
        return tf.constant(v[r * rows:(r + 1) * rows])

    return strategy.experimental_distribute_values_from_function(part)


def replicated_step(tf: Any, strategy: Any, model: Any, loss_name: str, *, split: bool = False) -> Any:
    """One synchronous data-parallel step under ``strategy``: each replica's mean loss over its own batch, scaled
    by 1/replicas, so that the optimizer's cross-replica gradient sum is the global mean (TensorFlow's "Custom
    training loop with Keras and MultiWorkerMirroredStrategy" tutorial).

    ``split``: the batch given is this process's share for all of its replicas (TPUStrategy: one process drives
    every chip of the host); replica r trains on rows [r·n/R, (r+1)·n/R), handed out with
    ``strategy.experimental_distribute_values_from_function``.  Without it each process's batch goes to its one
    replica (MultiWorkerMirroredStrategy, one worker per device)."""
    import keras

    from trainplan.estimate.keras import keras_loss

    loss_fn = keras.losses.get(keras_loss(loss_name))
    replicas = strategy.num_replicas_in_sync

    def one(x: Any, y: Any) -> Any:
        with tf.GradientTape() as tape:
            per_sample = loss_fn(y, model(x, training=True))
            loss = tf.reduce_mean(tf.cast(per_sample, tf.float32))
            scaled = loss / replicas
        grads = tape.gradient(scaled, model.trainable_variables)
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(x: Any, y: Any) -> Any:
        return strategy.reduce("MEAN", strategy.run(one, args=(x, y)), axis=None)

    def shard(v: Any) -> Any:
        return replica_shards(tf, strategy, v)

    def run(x: Any, y: Any) -> Any:
        if split:
            xs = [shard(v) for v in x] if isinstance(x, list) else shard(x)
            return step(xs, shard(y)).numpy()
        xs = [tf.constant(v) for v in x] if isinstance(x, list) else tf.constant(x)
        return step(xs, tf.constant(y)).numpy()

    return run


def _reset_tf_peak(tf: Any) -> bool:
    """Reset TensorFlow's CPU allocator peak; False when the allocator keeps no statistics (not BFC)."""
    try:
        tf.config.experimental.reset_memory_stats("CPU:0")
        tf.config.experimental.get_memory_info("CPU:0")
        return True
    except (ValueError, RuntimeError):
        return False


def train(config: RunConfig, rank: int) -> int:
    """One worker: build the model under the strategy, train, checkpoint, measure; rank 0 writes result.json."""
    import numpy as np
    import tensorflow as tf

    from trainplan.estimate.keras import build_model, synthetic_batch
    from trainplan.files import write_json_atomic
    from trainplan.measure.memory import PeakMemory, current_rss_bytes
    from trainplan.run.metrics import MetricsWriter
    from trainplan.run.results import RunStatus, WorkloadFacts
    from trainplan.run.runtime.telemetry import measure_result, step_record

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.update(now=True))
    job = config.load_job()
    paths = RunPaths(Path(config.out_dir))
    tf.config.threading.set_intra_op_parallelism_threads(config.threads_per_process)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, min(2, config.threads_per_process)))
    tpu = on_tpu_vm()
    multi = config.world_size > 1 or tpu
    strategy = make_strategy(tf, config)
    # TPUStrategy: this one process feeds all of the host's replicas (micro_batch rows each)
    host_batch = config.micro_batch * (strategy.num_replicas_in_sync if tpu else 1)
    baseline = current_rss_bytes()
    peak = PeakMemory("cpu")
    with strategy.scope():
        model = build_model(job, jit_compile=not multi, grad_accum=config.grad_accum)
    x0, _ = synthetic_batch(job, 1, job.seed)
    y0 = model(x0, training=False)
    out_shape = tuple(int(d) for d in (y0[0] if isinstance(y0, (list, tuple)) else y0).shape)
    step_fn = model.train_on_batch if not multi else replicated_step(tf, strategy, model, job.loss, split=tpu)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, step=step_var)
    ckpt_dir = paths.root / "checkpoints" if rank == 0 else paths.root / "scratch" / f"worker{rank}"
    manager = tf.train.CheckpointManager(ckpt, str(ckpt_dir / "keras"), max_to_keep=config.keep_checkpoints)
    if manager.latest_checkpoint:
        ckpt.restore(manager.latest_checkpoint)
    start = int(step_var.numpy())
    metrics = MetricsWriter(paths.metrics) if rank == 0 else None
    if metrics:
        metrics.event("start", strategy=tf_distribute_strategy(config.strategy, processes=config.world_size,
                                                               accelerator="tpu" if tpu else "cpu"),
                      resumed_from=start or None, processes=config.world_size)  # fmt: skip
    status = RunStatus.COMPLETED
    elapsed0 = 0.0
    began = time.perf_counter()
    last_ckpt = time.monotonic()
    loss = None
    compiled_rss, tf_stats = baseline, False
    for step in range(start, config.total_steps):
        t0 = time.perf_counter()
        for micro in range(config.grad_accum):
            x, y = synthetic_batch(job, host_batch, _seed(job.seed, step, micro, rank), out_shape)
            loss = step_fn(x, y)
        dt = time.perf_counter() - t0
        if step == start:
            # the first step compiles and builds the optimizer's slots: measure the steady state from here
            peak.reset()
            compiled_rss = current_rss_bytes()
            tf_stats = _reset_tf_peak(tf)
        step_var.assign(step + 1)
        if metrics:
            metrics.write(step_record(step + 1, step_time_s=dt, elapsed_s=elapsed0 + time.perf_counter() - began,
                                      total_steps=config.total_steps, loss=float(np.asarray(loss).mean()), tokens=None,
                                      samples=config.global_batch, warmup=step == start))  # fmt: skip
        due = (config.checkpoint_every and (step + 1) % config.checkpoint_every == 0) or (
            config.checkpoint_minutes and time.monotonic() - last_ckpt >= config.checkpoint_minutes * 60)
        if due or stop["now"] or step + 1 == config.total_steps:
            manager.save(checkpoint_number=step + 1)  # every worker saves (MultiWorkerMirroredStrategy's rule)
            last_ckpt = time.monotonic()
        if stop["now"]:
            status = RunStatus.PREEMPTED
            if metrics:
                metrics.event("preempted", step=step + 1)
            break
    steady_peak = peak.peak_bytes() + max(0, compiled_rss - baseline) if config.total_steps > start else 0
    method = "peak RSS growth over the model's build, steady-state steps (VmHWM)"
    if config.total_steps > start and tf_stats:
        steady_peak = int(tf.config.experimental.get_memory_info("CPU:0")["peak"])
        method = "tf.config.experimental.get_memory_info('CPU:0') peak, steady-state steps (BFC allocator)"
    weights = [np.asarray(w) for w in model.weights]
    digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
    n_params = int(sum(w.size for w in weights))
    (paths.root / f"keras_rank{rank}.json").write_text(json.dumps({"rank": rank, "weights_sha256": digest, "params": n_params}))
    if n_params <= SAVE_WEIGHTS_MAX_PARAMS:
        np.savez(paths.root / f"keras_weights_rank{rank}.npz", *weights)
    if rank == 0:
        assert metrics is not None
        metrics.close()
        trainable = int(sum(int(np.prod(v.shape)) for v in model.trainable_weights))
        result = measure_result(
            status=status, metrics_path=paths.metrics, peak_bytes=steady_peak,
            workload=WorkloadFacts(params=int(model.count_params()), trainable_params=trainable,
                                   samples_per_step=config.global_batch),
            train_s_now=time.perf_counter() - began, world_size=config.world_size, strategy=config.strategy,
            device=Accelerator.CPU, precision=config.precision, restarts=0,
            peak_method=method,
        )  # fmt: skip
        write_json_atomic(paths.result, result.to_dict())
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    config = RunConfig.read(args[0]) if args else RunConfig.from_env()
    if config is None:
        print("usage: python -m trainplan.run.workloads.keras RUN_JSON", file=sys.stderr)
        return 2
    run_json = args[0] if args else os.environ[CONFIG_ENV]
    if config.world_size > 1 and "TF_CONFIG" not in os.environ and not on_tpu_vm():
        return launch_workers(config, run_json)
    return train(config, int(os.environ.get(RANK_ENV, "0")))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
