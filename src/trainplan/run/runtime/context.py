"""The :class:`Context` a training process holds, and :func:`init`, which makes it.

The context is a facade over the parts in this package: where the process
sits (:mod:`.process`), how the model is wrapped (:mod:`.wrapping`), the step
(:mod:`.stepping`), checkpoints (:mod:`.state`) and the clocks, metric lines
and result (:mod:`.telemetry`).  It holds the run's mutable state; the parts
are functions and small objects that can be tested one by one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainplan.files import write_json_atomic
from trainplan.measure.memory import PeakMemory
from trainplan.measure.probe import Accelerator
from trainplan.run.checkpoint import CheckpointRef, CheckpointStore, manifest_ref, rng_state, save_tensor_file
from trainplan.run.config import RunConfig
from trainplan.run.metrics import MetricsWriter, truncate_after
from trainplan.run.results import RunStatus, WorkloadFacts
from trainplan.run.rundir import RunPaths
from trainplan.run.runtime import process, state
from trainplan.run.runtime.stepping import Stepper, autocast
from trainplan.run.runtime.telemetry import (
    CheckpointSchedule,
    FaultInjection,
    RunClock,
    measure_result,
    step_record,
)
from trainplan.run.runtime.wrapping import Materialize, OptimizerArg, Placement, Wrapped, wrap
from trainplan.spec import Precision
from trainplan.strategies import Strategy


class Context:
    """One process's view of a run.  Create it with :func:`init`.

    ``strategy`` and ``precision`` are :class:`~trainplan.strategies.Strategy`
    and :class:`~trainplan.spec.Precision` (string enums: ``ctx.strategy == "ddp"``
    holds; use ``.value`` to print them).
    """

    def __init__(
        self,
        config: RunConfig | None,
        *,
        proc: process.ProcessInfo | None = None,
        fault: FaultInjection | None = None,
    ) -> None:
        self.config = config
        proc = proc if proc is not None else process.ProcessInfo.from_env()
        self._proc = proc
        self._fault = fault if fault is not None else FaultInjection.from_env()
        self.rank = proc.rank
        self.world_size = proc.world_size
        self.local_rank = proc.local_rank
        self.restart_count = proc.restart_count
        if config is not None:
            self.strategy = config.strategy
        else:
            self.strategy = Strategy.DDP if self.world_size > 1 else Strategy.SINGLE
        self.device = process.choose_device(config.accelerator if config else None, self.local_rank)
        self.grad_accum = config.grad_accum if config else 1
        # tensor parallel: the tp ranks of a data-parallel group see the same batches (ranks ordered dp-major, tp inner)
        self.tp = config.tp if config else 1
        self.pp = config.pp if config else 1
        self.data_rank = self.rank // self.tp
        self.data_world = max(1, self.world_size // self.tp)
        if self.pp > 1:  # pipeline: ranks ordered (pp, dp); a stage's dp ranks read different data, its stages the same
            self.data_world = self.world_size // self.pp
            self.data_rank = self.rank % self.data_world
        self.global_batch = config.global_batch if config else None
        self.total_steps = config.total_steps if config else None
        self.precision = config.precision if config else Precision.FP32
        self.paths = RunPaths(Path(config.out_dir)) if config else None
        self.model: Any = None
        self.optimizer: Any = None
        self._wrapped: Wrapped | None = None
        self._stepper: Stepper | None = None
        self._stop = threading.Event()
        self._peak = PeakMemory(self.device)
        self._metrics: MetricsWriter | None = None
        self._store: CheckpointStore | None = None
        self._clock = RunClock()
        self._schedule = CheckpointSchedule(
            config.checkpoint_every if config else None, config.checkpoint_minutes if config else None
        )

    # ------------------------------------------------------------------ facts
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return process.is_distributed()

    @property
    def stop_requested(self) -> bool:
        """This process got SIGTERM (local; :meth:`end_of_step` agrees across ranks)."""
        return self._stop.is_set()

    def barrier(self) -> None:
        process.barrier(self.device)

    # ------------------------------------------------------------------ set-up
    def _start(self) -> None:
        if self.config is not None and self.device.type == "cpu":
            torch.set_num_threads(max(1, self.config.threads_per_process))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        process.init_process_group(self._proc, self.device, self.strategy)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self._stop.set())
        if self.paths is not None:
            self._record_rank("start")
            if self.is_main:
                self._metrics = MetricsWriter(self.paths.metrics)
            keep = self.config.keep_checkpoints if self.config else 2
            self._store = CheckpointStore(self.paths.checkpoints, rank=self.rank, barrier=self.barrier, keep=keep)
        self._peak.reset()

    def _record_rank(self, stage: str, **extra: Any) -> None:
        assert self.paths is not None
        record = {
            "rank": self.rank,
            "local_rank": self.local_rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "restart_count": self.restart_count,
            "device": str(self.device),
            "strategy": self.strategy.value,
            **extra,
        }
        write_json_atomic(self.paths.ranks / f"rank{self.rank}.{stage}.json", record)

    # ------------------------------------------------------------------ wrapping
    def wrap(
        self, model: torch.nn.Module, optimizer: OptimizerArg, *, materialize: Materialize | None = None
    ) -> tuple[Any, Any]:
        """Apply the strategy to ``model`` and ``optimizer``.

        ``optimizer`` is an optimizer over ``model``'s parameters, or a callable
        that makes one from an iterable of parameters.  Sharding strategies
        replace the parameters; the optimizer is then rebuilt with the same
        hyper-parameters and groups over the new ones.  Under FSDP a model whose
        parameters are on the meta device is sharded first and then given its
        storage by ``materialize(model, device)`` (each rank fills its shards).
        """
        wrapped = wrap(model, optimizer, self._placement(), materialize=materialize)
        self._wrapped = wrapped
        self._stepper = Stepper(wrapped, self.grad_accum)
        self.model, self.optimizer = wrapped.model, wrapped.optimizer
        return wrapped.model, wrapped.optimizer

    def _placement(self) -> Placement:
        return Placement(
            strategy=self.strategy,
            device=self.device,
            precision=self.precision,
            world_size=self.world_size,
            deepspeed_config=self.config.deepspeed if self.config else None,
            tp=self.tp,
            sequence_parallel=bool(self.config and self.config.sequence_parallel),
            ep=self.config.ep if self.config else 1,
            pp=self.pp,
            vpp=self.config.vpp if self.config else 1,
            microbatches=self.grad_accum,
        )

    def _need_wrapped(self) -> Wrapped:
        if self._wrapped is None:
            raise RuntimeError("call ctx.wrap(model, optimizer) first")
        return self._wrapped

    # ------------------------------------------------------------------ the step
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Mixed-precision autocast where the plan asks for it (torch engines on CUDA)."""
        return autocast(self._placement())

    @property
    def pipelined(self) -> bool:
        """Whether this run is pipeline parallel (the step is :meth:`pipeline_step`, not backward / step)."""
        return self._need_wrapped().pipeline is not None

    def pipeline_step(self, rows: torch.Tensor) -> float:
        """Collective: one optimizer step of a pipeline-parallel run over ``rows`` (this data rank's micro-batches of
        the step, stacked: the schedule cuts them into ``grad_accum`` micro-batches); returns the step's mean loss."""
        wrapped = self._need_wrapped()
        assert wrapped.pipeline is not None
        loss = wrapped.pipeline.step(rows.to(self.device))
        wrapped.optimizer.step()
        wrapped.optimizer.zero_grad(set_to_none=True)
        return float(loss)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (scaled for gradient accumulation)."""
        self._need_wrapped()
        assert self._stepper is not None
        self._stepper.backward(loss)

    def step(self) -> bool:
        """End of a micro-batch; steps the optimizer at the accumulation boundary.

        Returns whether the optimizer stepped.
        """
        self._need_wrapped()
        assert self._stepper is not None
        return self._stepper.step()

    # ------------------------------------------------------------------ metrics, checkpoints
    def end_of_step(
        self,
        step: int,
        *,
        loss: float | None = None,
        tokens: float | None = None,
        samples: float | None = None,
    ) -> bool:
        """Collective: log step ``step`` (1-based count of optimizer steps done).

        ``tokens`` / ``samples`` are what the whole step processed over all
        ranks.  Writes a checkpoint when one is due and returns True when the
        run must stop (SIGTERM on any rank; the checkpoint is then written).
        """
        now = time.perf_counter()
        step_time = self._clock.step_time(step, now)
        by_time = self._schedule.due_by_time() and self.is_main  # rank 0's clock decides for all
        flags = [loss if loss is not None else 0.0, float(self._stop.is_set()), float(by_time)]
        if self.distributed:
            t = torch.tensor(flags, dtype=torch.float64, device=process.collective_device(self.device))
            torch.distributed.all_reduce(t)
            flags = t.tolist()
            if loss is not None:
                loss = flags[0] / self.world_size
        stop = flags[1] > 0
        due = stop or flags[2] > 0 or self._schedule.due_by_step(step)
        if self._metrics is not None:
            self._metrics.write(
                step_record(
                    step,
                    step_time_s=step_time,
                    elapsed_s=self._clock.elapsed(now),
                    total_steps=self.total_steps,
                    loss=loss,
                    tokens=tokens,
                    samples=samples,
                    warmup=self._clock.first_in_segment,
                )
            )
        self._clock.first_in_segment = False
        if due and self._store is not None and step != self._schedule.last_step:
            self.save_checkpoint(step)
        if stop and self._metrics is not None:
            self._metrics.event("preempted", step=step)
        self._fault.strike(step, rank=self.rank, restart_count=self.restart_count)
        self._clock.mark(step)  # checkpoint time is not step time
        return stop

    def log_event(self, name: str, **fields: Any) -> None:
        """Append an event line (``{"event": name, ...}``) to ``metrics.jsonl`` (rank 0; no-op elsewhere)."""
        if self._metrics is not None:
            self._metrics.event(name, **fields)

    def _peak_so_far(self) -> int:
        return max(self._clock.peak_before, self._peak.peak_bytes())

    def save_checkpoint(self, step: int) -> Path:
        """Collective: write checkpoint ``step`` (model, optimizer, RNG, clocks)."""
        if self._store is None:
            raise RuntimeError("checkpoints need a run directory (launch with trainplan run)")

        def trainer() -> state.TrainerState:
            return state.TrainerState(
                step=step,
                rng=rng_state(),
                train_s=self._clock.elapsed(),
                peak_bytes=self._peak_so_far(),
                world_size=self.world_size,
                strategy=self.strategy,
            )

        ref = state.save(self._store, self._need_wrapped(), step, trainer, rank=self.rank, is_main=self.is_main)
        self._schedule.written(step)
        if self._metrics is not None:
            self._metrics.event("checkpoint", step=step, dir=ref.path.name)
        return ref.path

    def _agreed_checkpoint(self) -> CheckpointRef | None:
        """Collective: the newest checkpoint rank 0 verified against its manifest (newer damaged ones skipped and
        reported: a metrics event and a line in the log)."""
        assert self._store is not None
        name: str | None = None
        if self.is_main:
            ref, skipped = self._store.newest_good()
            name = ref.path.name if ref is not None else None
            for why in skipped:
                print(f"trainplan: skipped checkpoint {why}", file=sys.stderr, flush=True)
                if self._metrics is not None:
                    self._metrics.event("checkpoint_skipped", why=why)
        if self.distributed:
            box = [name]
            torch.distributed.broadcast_object_list(box, src=0, device=process.collective_device(self.device))
            name = box[0]
        return manifest_ref(self._store.root / name) if name is not None else None

    def resume(self) -> int:
        """Collective: load the last checkpoint if there is one; returns its step (else 0).

        Restores the model, the optimizer, this rank's RNG state and the
        run's clocks, and drops metric lines past the checkpoint.
        """
        if self._store is None:
            return 0
        ref = self._agreed_checkpoint()
        if ref is None:
            if self._metrics is not None:
                self._metrics.event("start", world_size=self.world_size, strategy=self.strategy.value)
            self._clock.new_segment()
            return 0
        if ref.world_size != self.world_size or ref.strategy != self.strategy:
            raise RuntimeError(
                f"checkpoint {ref.path} was written by {ref.world_size} processes with {ref.strategy}; "
                f"this run has {self.world_size} with {self.strategy.value}"
            )
        trainer = state.restore(ref, self._need_wrapped(), rank=self.rank)
        self._schedule.last_step = ref.step
        if self.is_main and self.paths is not None:
            truncate_after(self.paths.metrics, ref.step)
            if self._metrics is not None:
                self._metrics.close()
            self._metrics = MetricsWriter(self.paths.metrics)
            self._metrics.event("resume", step=ref.step, restart_count=self.restart_count)
        self.barrier()
        self._clock.new_segment(step=ref.step, train_s_before=trainer.train_s, peak_before=trainer.peak_bytes)
        return ref.step

    # ------------------------------------------------------------------ the end
    def param_fingerprint(self) -> str:
        """Collective: SHA-256 of every parameter, gathered in full, in name order."""
        return state.param_fingerprint(self._need_wrapped())

    def full_model_state(self) -> dict[str, torch.Tensor] | None:
        """Collective: the full model state dict on rank 0 (None on other ranks)."""
        return state.full_model_state(self._need_wrapped(), is_main=self.is_main)

    def describe_wrapping(self) -> dict[str, Any]:
        """What :meth:`wrap` really built (recorded per rank, checked by the tests)."""
        return self._need_wrapped().describe()

    def peak_bytes(self) -> int:
        """Collective: the largest peak of any rank, over every segment of the run."""
        mine = self._peak_so_far()
        if self.distributed:
            t = torch.tensor([mine], dtype=torch.int64, device=process.collective_device(self.device))
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            return int(t.item())
        return mine

    def finish(
        self,
        *,
        status: RunStatus | str = RunStatus.COMPLETED,
        workload: Mapping[str, Any] | WorkloadFacts | None = None,
        save_model: bool = True,
    ) -> dict[str, Any] | None:
        """Collective: record the measurement and shut the process group down.

        Rank 0 writes ``result.json`` (and ``model.pt`` when the run completed)
        and returns the result as that JSON object; other ranks return None.
        ``workload`` is what the run trained (``samples_per_step``,
        ``tokens_per_step`` … see :class:`~trainplan.run.results.WorkloadFacts`).
        """
        status = RunStatus(status)
        facts = workload if isinstance(workload, WorkloadFacts) else WorkloadFacts.from_dict(workload)
        result: dict[str, Any] | None = None
        if self._wrapped is not None:
            fingerprint = self.param_fingerprint()
            peak = self.peak_bytes()
            if self.paths is not None:
                self._record_rank("end", params_sha256=fingerprint, status=status.value, **self.describe_wrapping())
                model_state = self.full_model_state() if save_model and status is RunStatus.COMPLETED else None
                if self.is_main:
                    if model_state is not None:
                        save_tensor_file(model_state, self.paths.model)
                    result = self._write_result(status, peak, facts)
        elif self.paths is not None and self.is_main:
            result = self._write_result(status, self._peak.peak_bytes(), facts)
        if self._metrics is not None:
            self._metrics.close()
        if self.distributed:
            self.barrier()  # a barrier before destroy avoids gloo's abort at exit
            torch.distributed.destroy_process_group()
        return result

    def _write_result(self, status: RunStatus, peak: int, workload: WorkloadFacts) -> dict[str, Any]:
        assert self.paths is not None
        measured = measure_result(
            status=status,
            metrics_path=self.paths.metrics,
            peak_bytes=peak,
            workload=workload,
            train_s_now=self._clock.elapsed(),
            world_size=self.world_size,
            strategy=self.strategy,
            device=Accelerator(self.device.type),
            precision=self.precision,
            restarts=self.restart_count,
            peak_method=self._peak.method,
        )
        data = measured.to_dict()
        write_json_atomic(self.paths.result, data)
        return data


def init(config: RunConfig | None = None) -> Context:
    """Start this process's part of the run.

    Reads the run configuration from ``$TRAINPLAN_RUN_CONFIG`` (set by
    ``trainplan run``) unless ``config`` is given.  Run bare, without either,
    it is a single process on the best local device, without metrics or
    checkpoints.  Initialises ``torch.distributed`` (gloo on CPU, NCCL on
    CUDA) when the run has several processes or uses DeepSpeed, sets the CPU
    thread count, installs a SIGTERM handler and starts the peak-memory meter.
    The launcher's environment (rank, world size, restart count, the
    fault-injection test aid) is read here, once.
    """
    ctx = Context(config if config is not None else RunConfig.from_env())
    ctx._start()
    return ctx
