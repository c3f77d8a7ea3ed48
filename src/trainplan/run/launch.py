"""Launch = render + submit.

:func:`render` turns a resolved :class:`~trainplan.run.config.RunConfig` into a
:class:`LaunchSpec` — the argument list, the environment and the files to
write — without starting anything, so every backend's command can be checked
in tests.  :func:`submit` writes the files and runs the command as a child
process (an argument list, never a shell string), forwarding SIGTERM/SIGINT to
it so the workers can checkpoint.

One process (``single``, tabular jobs) runs ``python -m trainplan.run.worker``
(or the user's script) directly.  Everything else — DDP, FSDP, DeepSpeed,
even on one device — runs under ``torchrun`` (``python -m
torch.distributed.run``), which sets RANK/WORLD_SIZE/LOCAL_RANK, restarts the
worker group after a failure (``--max-restarts``) and gives workers
``--shutdown-timeout`` seconds to checkpoint after SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainplan.estimate.memory import (
    DEEPSPEED_ALLGATHER_BUCKET_ELEMS,
    DEEPSPEED_MAX_LIVE_PARAMS,
    DEEPSPEED_PREFETCH_BUCKET_ELEMS,
    DEEPSPEED_REDUCE_BUCKET_ELEMS,
)
from trainplan.files import write_text_atomic
from trainplan.measure.probe import Accelerator
from trainplan.run.config import CONFIG_ENV, RunConfig
from trainplan.run.rundir import RunPaths
from trainplan.spec import JobKind, Precision
from trainplan.strategies import Strategy

#: Seconds torchrun waits for workers to checkpoint after SIGTERM before it kills them.
SHUTDOWN_GRACE_S = 120
#: The module the built-in workloads run as (``python -m``), launched here or handed to a :class:`WarmWorker`.
WORKER_MODULE = "trainplan.run.worker"
#: Elastic restarts of the worker group after a worker dies (torchrun ``--max-restarts``).
DEFAULT_MAX_RESTARTS = 2


@dataclass(frozen=True)
class LaunchSpec:
    """A rendered launch: run ``argv`` with ``env`` added, after writing ``files``."""

    argv: list[str]
    env: dict[str, str]
    files: dict[Path, str] = field(default_factory=dict)
    cwd: Path | None = None

    def describe(self) -> str:
        """The command as one line, for logs (quoted for reading, never executed)."""
        import shlex

        return shlex.join(self.argv)


def deepspeed_config(
    strategy: Strategy,
    *,
    micro_batch: int,
    grad_accum: int,
    world_size: int,
    precision: Precision | str,
    accelerator: Accelerator | str,
) -> dict[str, Any]:
    """The DeepSpeed JSON for a ZeRO strategy.

    The job's own torch optimizer is used, also with offload
    (``zero_force_ds_cpu_optimizer: false``): DeepSpeed's CPU Adam would be
    compiled with ninja on first use (about a minute).
    """
    precision, accelerator = Precision(precision), Accelerator(accelerator)
    zero: dict[str, Any] = {"stage": int(strategy.zero_stage)}
    # The bucket sizes the memory estimate assumes (estimate/memory.py), not DeepSpeed's defaults.
    zero["reduce_bucket_size"] = DEEPSPEED_REDUCE_BUCKET_ELEMS
    if strategy.zero_stage >= 3:
        zero["stage3_prefetch_bucket_size"] = DEEPSPEED_PREFETCH_BUCKET_ELEMS
        zero["stage3_max_live_parameters"] = DEEPSPEED_MAX_LIVE_PARAMS
    else:
        zero["allgather_bucket_size"] = DEEPSPEED_ALLGATHER_BUCKET_ELEMS
    pin = accelerator is Accelerator.CUDA
    if strategy.offloads_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": pin}
    if strategy.offloads_parameters:
        zero["offload_param"] = {"device": "cpu", "pin_memory": pin}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * world_size,
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if precision in (Precision.BF16, Precision.BF16_PURE):
        cfg["bf16"] = {"enabled": True}
    elif precision is Precision.FP16:
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    return cfg


def _python() -> str:
    return sys.executable or "python3"


def torchrun_args(
    *,
    nproc_per_node: int,
    max_restarts: int,
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int = 29500,
    rdzv_id: str = "trainplan",
    python: str | None = None,
) -> list[str]:
    """``python -m torch.distributed.run`` and its options, single- or multi-node.

    Several nodes meet at ``master_addr:master_port`` through the c10d rendezvous;
    ``python`` is the interpreter on the nodes (default: this one).
    """
    args = [python or _python(), "-m", "torch.distributed.run"]
    if nnodes == 1 and master_addr is None:
        args += ["--standalone", "--nnodes=1"]
    else:
        if master_addr is None:
            raise ValueError("multi-node torchrun needs master_addr (the rendezvous host)")
        args += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={master_addr}:{master_port}",
            f"--rdzv-id={rdzv_id}",
        ]
    args += [
        f"--nproc-per-node={nproc_per_node}",
        f"--max-restarts={max_restarts}",
        f"--shutdown-timeout={SHUTDOWN_GRACE_S}",
    ]
    return args


def uses_torchrun(config: RunConfig) -> bool:
    """Whether the run needs the distributed launcher (anything but one plain process)."""
    return config.world_size > 1 or config.strategy is not Strategy.SINGLE


def render(
    config: RunConfig,
    *,
    script: Path | None = None,
    script_args: tuple[str, ...] = (),
    max_restarts: int = DEFAULT_MAX_RESTARTS,
) -> LaunchSpec:
    """The command, environment and files that run ``config`` on this machine."""
    paths = RunPaths(Path(config.out_dir))
    target = [str(script), *script_args] if script is not None else ["-m", WORKER_MODULE, str(paths.run_config)]
    if uses_torchrun(config):
        argv = torchrun_args(nproc_per_node=config.world_size, max_restarts=max_restarts)
        argv += target if script is not None else ["--module", WORKER_MODULE, str(paths.run_config)]
    else:
        argv = [_python(), *target]
    env = {
        CONFIG_ENV: str(paths.run_config),
        "TRAINPLAN_RUN_DIR": str(paths.root),
        "PYTHONUNBUFFERED": "1",
    }
    threads = config.threads_per_fit if config.kind is JobKind.TABULAR else config.threads_per_process
    env["OMP_NUM_THREADS"] = str(threads)  # torchrun would otherwise force 1 per process
    files = {paths.run_config: config.dumps()}
    if config.deepspeed is not None:
        import json

        files[paths.ds_config] = json.dumps(config.deepspeed, indent=2, sort_keys=True) + "\n"
        env["TRAINPLAN_DS_CONFIG"] = str(paths.ds_config)
    return LaunchSpec(argv=argv, env=env, files=files, cwd=Path.cwd())


def _term_with_parent() -> None:
    """In the launched child, before exec: ask Linux to send it SIGTERM when this launcher dies, even by SIGKILL
    (prctl(2) PR_SET_PDEATHSIG), so torchrun and the workers checkpoint and stop instead of living on as orphans
    beside a later --resume."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)


class WarmWorker:
    """A worker interpreter started early, importing torch and transformers while this process still prepares
    the run (a pretrained job's tokenization imports them here too: about 2 s of start-up each).

    ``python -m trainplan.run.worker --warm`` imports, then waits for one JSON line on its stdin — the run's
    arguments, environment, working directory and log — and runs as the worker :func:`render` names; a closed
    stdin makes it exit.  Only a one-process launch (``single``: no torchrun) is handed to it; anything else,
    or a warm worker that died, falls back to a fresh process.  It is started like any worker: its own session,
    SIGTERM when this launcher dies (PR_SET_PDEATHSIG)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is not None:
            return
        self.proc = subprocess.Popen(
            [_python(), "-m", WORKER_MODULE, "--warm"],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_term_with_parent if sys.platform.startswith("linux") else None,
        )

    def take(self, spec: LaunchSpec, log_path: Path) -> subprocess.Popen[bytes] | None:
        """Hand ``spec`` to the warm worker; None (and the warm worker gone) when it cannot run it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        one_process = spec.argv[:3] == [_python(), "-m", WORKER_MODULE] and len(spec.argv) == 4
        if one_process and proc.poll() is None and proc.stdin is not None:
            order = {"args": spec.argv[3:], "env": spec.env, "cwd": str(spec.cwd or Path.cwd()), "log": str(log_path)}
            try:
                proc.stdin.write((json.dumps(order) + "\n").encode())
                proc.stdin.close()
                return proc
            except (BrokenPipeError, OSError):
                pass
        _close(proc)
        return None

    def discard(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            _close(proc)


def _close(proc: subprocess.Popen[bytes]) -> None:
    """Stop a warm worker that will not be used: a closed stdin ends it; one that does not end is killed."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        with_group(proc.pid, signal.SIGKILL)
        proc.wait()


def submit(
    spec: LaunchSpec,
    *,
    log_path: Path,
    poll: Callable[[], None] | None = None,
    poll_interval_s: float = 0.25,
    warm: WarmWorker | None = None,
) -> int:
    """Write ``spec.files``, run ``spec.argv``, wait; returns the exit code.

    Output goes to ``log_path``.  SIGTERM or SIGINT to this process is passed
    on to the child as SIGTERM (the workers checkpoint and stop); a second
    SIGINT kills the child's process group.  ``poll`` is called every
    ``poll_interval_s`` while waiting (progress display).  ``warm``: a worker started early
    (:class:`WarmWorker`) runs the command when it is one plain worker process.
    """
    for path, content in spec.files.items():
        write_text_atomic(Path(path), content)
    env = {**os.environ, **spec.env}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"$ {spec.describe()}\n".encode())
        log.flush()
        proc = warm.take(spec, log_path) if warm is not None else None
        if proc is None:
            proc = subprocess.Popen(
                spec.argv,
                env=env,
                cwd=spec.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us, not the workers; we forward it as SIGTERM
                preexec_fn=_term_with_parent if sys.platform.startswith("linux") else None,
            )
        interrupts = 0

        def forward(signum: int, frame: Any) -> None:
            nonlocal interrupts
            interrupts += signum == signal.SIGINT
            if interrupts >= 2:
                with_group(proc.pid, signal.SIGKILL)
            elif proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

        # SIGHUP (the terminal closed) stops the run like SIGTERM: the workers checkpoint first
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        in_main = _in_main_thread()
        if in_main:
            for s in previous:
                signal.signal(s, forward)
        try:
            if poll is None:
                proc.wait()  # blocks in waitpid: no wake-ups taking CPU from the workers; signals still arrive
            while proc.poll() is None:
                poll()  # type: ignore[misc]
                time.sleep(poll_interval_s)
            if poll is not None:
                poll()
        finally:
            if in_main:
                for s, handler in previous.items():
                    signal.signal(s, handler)
            if proc.poll() is None:  # an exception while waiting: do not leave workers behind
                with_group(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode


def with_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid`` (ignoring one that is gone)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
