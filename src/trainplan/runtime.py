"""What a training script needs from ``trainplan run``: device, rank, wrapping.

A script launched with ``trainplan run --script train.py JOB.yaml`` (or run
bare with ``python train.py``) does::

    import trainplan.runtime

    ctx = trainplan.runtime.init()                 # device, rank, world size
    model = build_model()
    model, opt = ctx.wrap(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    start = ctx.resume()                           # 0, or the step of the last checkpoint
    for step in range(start, ctx.total_steps or 100):
        for micro in range(ctx.grad_accum):
            x, y = next_batch(step, micro, ctx.rank)
            with ctx.autocast():
                loss = loss_fn(model(x.to(ctx.device)), y.to(ctx.device))
            ctx.backward(loss)
            ctx.step()                             # steps the optimizer at the accumulation boundary
        if ctx.end_of_step(step + 1, loss=loss.item(), samples=ctx.global_batch):
            break                                  # SIGTERM: a checkpoint was written
    ctx.finish()

:meth:`Context.wrap` applies the plan's strategy — nothing (single),
``DistributedDataParallel``, FSDP2 ``fully_shard`` over a device mesh, or
``deepspeed.initialize`` with the generated ZeRO config — and returns a model
and an optimizer to use as usual, except that ``ctx.backward`` / ``ctx.step``
must be used (DeepSpeed's engine owns backward and step, and the context
handles gradient accumulation and gradient synchronisation).

:meth:`Context.end_of_step` is collective: every rank calls it after every
optimizer step.  It averages the loss over ranks, appends a metrics line,
writes checkpoints when due, and reports whether the run must stop because
the process got SIGTERM (then it has already written a checkpoint).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from trainplan.measure.memory import PeakMemory
from trainplan.run.checkpoint import (
    CheckpointStore,
    load_tensor_file,
    rng_state,
    save_tensor_file,
    set_rng_state,
)
from trainplan.run.config import RunConfig
from trainplan.run.files import write_json_atomic
from trainplan.run.metrics import MetricsWriter, read_metrics, step_figures, truncate_after
from trainplan.run.rundir import RunPaths

GIB = 1024**3

#: Test aid: a worker SIGKILLs itself at this step on its first attempt (see docs/run.md).
FAULT_STEP_ENV = "TRAINPLAN_FAULT_SIGKILL_AT_STEP"
FAULT_RANK_ENV = "TRAINPLAN_FAULT_RANK"

_TORCH_ENGINES = ("single", "ddp")
_FSDP = ("fsdp", "fsdp-grad-op")


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def _default_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


class Context:
    """One process's view of a run.  Create it with :func:`init`."""

    def __init__(self, config: RunConfig | None) -> None:
        self.config = config
        self.rank = _env_int("RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.restart_count = _env_int("TORCHELASTIC_RESTART_COUNT", 0)
        self.strategy = config.strategy if config else ("ddp" if self.world_size > 1 else "single")
        accel = config.accelerator if config else None
        if accel == "cuda":
            self.device = torch.device("cuda", self.local_rank)
        elif accel in ("cpu", "mps"):
            self.device = torch.device(accel)
        else:
            self.device = _default_device(self.local_rank)
        self.grad_accum = config.grad_accum if config else 1
        self.global_batch = config.global_batch if config else None
        self.total_steps = config.total_steps if config else None
        self.precision = config.precision if config else "fp32"
        self.paths = RunPaths(Path(config.out_dir)) if config else None
        self.model: Any = None
        self.optimizer: Any = None
        self._engine: Any = None  # DeepSpeed engine
        self._scaler: Any = None
        self._micro = 0
        self._stop = threading.Event()
        self._peak = PeakMemory(self.device)
        self._metrics: MetricsWriter | None = None
        self._store: CheckpointStore | None = None
        self._last_step = 0
        self._last_mark = time.perf_counter()
        self._segment_start = time.perf_counter()
        self._train_s_before = 0.0
        self._peak_before = 0
        self._last_ckpt_time = time.monotonic()
        self._last_ckpt_step = -1
        self._first_in_segment = True

    # ------------------------------------------------------------------ facts
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return torch.distributed.is_available() and torch.distributed.is_initialized()

    @property
    def stop_requested(self) -> bool:
        """This process got SIGTERM (local; :meth:`end_of_step` agrees across ranks)."""
        return self._stop.is_set()

    def barrier(self) -> None:
        if self.distributed:
            if self.device.type == "cuda":
                torch.distributed.barrier(device_ids=[self.device.index])
            else:
                torch.distributed.barrier()

    # ------------------------------------------------------------------ set-up
    def _start(self) -> None:
        if self.config is not None and self.device.type == "cpu":
            torch.set_num_threads(max(1, self.config.threads_per_process))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self._init_distributed()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda signum, frame: self._stop.set())
        if self.paths is not None:
            self._record_rank("start")
            if self.is_main:
                self._metrics = MetricsWriter(self.paths.metrics)
            keep = self.config.keep_checkpoints if self.config else 2
            self._store = CheckpointStore(self.paths.checkpoints, rank=self.rank, barrier=self.barrier, keep=keep)
        self._peak.reset()

    def _init_distributed(self) -> None:
        needs = self.world_size > 1 or self.strategy not in _TORCH_ENGINES
        if not needs or self.distributed:
            return
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend, **self._store_kwargs())
        if self.strategy not in _TORCH_ENGINES and self.strategy not in _FSDP:
            import deepspeed

            if self.device.type == "cpu":
                _skip_deepspeed_shm_op()
            deepspeed.init_distributed(dist_backend=backend)  # wraps the group made above

    def _store_kwargs(self) -> dict[str, Any]:
        """Rendezvous keys under a prefix per torchrun attempt.

        Under torchrun the workers share the agent's TCPStore, which outlives
        an elastic restart; without a per-attempt prefix a restarted rank can
        read the address its dead predecessor published and fail to connect
        (seen with gloo, torch 2.13).
        """
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            return {}
        from datetime import timedelta

        store = torch.distributed.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world_size=self.world_size,
            is_master=False,
            timeout=timedelta(minutes=10),
        )
        prefixed = torch.distributed.PrefixStore(f"trainplan/attempt_{self.restart_count}", store)
        return {"store": prefixed, "rank": self.rank, "world_size": self.world_size}

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
            "strategy": self.strategy,
            **extra,
        }
        write_json_atomic(self.paths.ranks / f"rank{self.rank}.{stage}.json", record)

    # ------------------------------------------------------------------ wrapping
    def wrap(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Callable[[Any], torch.optim.Optimizer],
    ) -> tuple[Any, Any]:
        """Apply the strategy to ``model`` and ``optimizer``.

        ``optimizer`` is an optimizer over ``model``'s parameters, or a callable
        that makes one from an iterable of parameters.  Sharding strategies
        replace the parameters; the optimizer is then rebuilt with the same
        hyper-parameters and groups over the new ones.
        """
        if self.strategy in _TORCH_ENGINES:
            model = model.to(self.device)
            if self.precision == "bf16-pure":
                model = model.to(torch.bfloat16)
            opt = optimizer(model.parameters()) if callable(optimizer) and not isinstance(
                optimizer, torch.optim.Optimizer
            ) else optimizer
            if self.strategy == "ddp":
                from torch.nn.parallel import DistributedDataParallel

                ids = [self.device.index] if self.device.type == "cuda" else None
                model = DistributedDataParallel(model, device_ids=ids)
            if self.precision == "fp16" and self.device.type == "cuda":
                self._scaler = torch.amp.GradScaler("cuda")
        elif self.strategy in _FSDP:
            model, opt = self._wrap_fsdp(model, optimizer)
        else:
            model, opt = self._wrap_deepspeed(model, optimizer)
        self.model, self.optimizer = model, opt
        self._set_grad_sync()
        return model, opt

    def _wrap_fsdp(self, model: torch.nn.Module, optimizer: Any) -> tuple[Any, Any]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        names = _param_names(model)
        model = model.to(self.device)
        if self.precision == "bf16-pure":
            model = model.to(torch.bfloat16)
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        reshard = self.strategy == "fsdp"  # fsdp-grad-op keeps parameters gathered (ZeRO-2-like)
        mp = MixedPrecisionPolicy()
        if self.device.type == "cuda" and self.precision in ("bf16", "fp16"):
            half = torch.bfloat16 if self.precision == "bf16" else torch.float16
            mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
        for block in _blocks(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        return model, _rebuild_optimizer(optimizer, names, model)

    def _wrap_deepspeed(self, model: torch.nn.Module, optimizer: Any) -> tuple[Any, Any]:
        import deepspeed

        if self.config is None or self.config.deepspeed is None:
            raise RuntimeError(f"strategy {self.strategy} needs a DeepSpeed config; launch with trainplan run")
        if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
            optimizer = optimizer(model.parameters())
        engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=dict(self.config.deepspeed))
        self._engine = engine
        return engine, opt

    def _set_grad_sync(self) -> None:
        """Synchronise gradients only on the last micro-batch of an accumulation window."""
        sync = (self._micro + 1) % self.grad_accum == 0
        if self.strategy == "ddp":
            self.model.require_backward_grad_sync = sync
        elif self.strategy in _FSDP:
            self.model.set_requires_gradient_sync(sync)

    # ------------------------------------------------------------------ the step
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Mixed-precision autocast where the plan asks for it (torch engines on CUDA)."""
        if self.strategy in _TORCH_ENGINES and self.device.type == "cuda" and self.precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            return torch.autocast("cuda", dtype=dtype)
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch's loss (scaled for gradient accumulation)."""
        if self._engine is not None:
            self._engine.backward(loss)  # DeepSpeed divides by its gradient_accumulation_steps
            return
        scaled = loss / self.grad_accum
        if self._scaler is not None:
            scaled = self._scaler.scale(scaled)
        scaled.backward()

    def step(self) -> bool:
        """End of a micro-batch; steps the optimizer at the accumulation boundary.

        Returns whether the optimizer stepped.
        """
        if self._engine is not None:
            boundary = self._engine.is_gradient_accumulation_boundary()
            self._engine.step()
            return bool(boundary)
        self._micro += 1
        stepped = self._micro % self.grad_accum == 0
        if stepped:
            if self._scaler is not None:
                self._scaler.step(self.optimizer)
                self._scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._micro = 0
        self._set_grad_sync()
        return stepped

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
        done = max(1, step - self._last_step)
        step_time = (now - self._last_mark) / done
        cfg = self.config
        due_by_time = bool(
            cfg is not None
            and cfg.checkpoint_minutes
            and time.monotonic() - self._last_ckpt_time >= cfg.checkpoint_minutes * 60
        )
        flags = [loss if loss is not None else 0.0, float(self._stop.is_set()), float(due_by_time and self.is_main)]
        if self.distributed:
            t = torch.tensor(flags, dtype=torch.float64, device=self._collective_device())
            torch.distributed.all_reduce(t)
            flags = t.tolist()
            if loss is not None:
                loss = flags[0] / self.world_size
        stop = flags[1] > 0
        due = stop or flags[2] > 0 or bool(cfg and cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
        if self._metrics is not None:
            record: dict[str, Any] = {
                "step": step,
                "step_time_s": step_time,
                "elapsed_s": self._train_s_before + (now - self._segment_start),
            }
            if self.total_steps:
                record["total_steps"] = self.total_steps
            if loss is not None:
                record["loss"] = loss
            if tokens is not None:
                record["tokens_per_s"] = tokens / step_time
            if samples is not None:
                record["samples_per_s"] = samples / step_time
            if self._first_in_segment:
                record["warmup"] = True
            self._metrics.write(record)
        self._first_in_segment = False
        if due and self._store is not None and step != self._last_ckpt_step:
            self.save_checkpoint(step)
        if stop and self._metrics is not None:
            self._metrics.event("preempted", step=step)
        self._inject_fault(step)
        self._last_step = step
        self._last_mark = time.perf_counter()  # checkpoint time is not step time
        return stop

    def _collective_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def _inject_fault(self, step: int) -> None:
        at = os.environ.get(FAULT_STEP_ENV)
        if at and int(at) == step and self.restart_count == 0 and self.rank == _env_int(FAULT_RANK_ENV, 0):
            os.kill(os.getpid(), signal.SIGKILL)

    def _trainer_state(self, step: int) -> dict[str, Any]:
        now = time.perf_counter()
        return {
            "step": step,
            "rng": rng_state(),
            "train_s": self._train_s_before + (now - self._segment_start),
            "peak_bytes": max(self._peak_before, self._peak.peak_bytes()),
            "world_size": self.world_size,
            "strategy": self.strategy,
        }

    def save_checkpoint(self, step: int) -> Path:
        """Collective: write checkpoint ``step`` (model, optimizer, RNG, clocks)."""
        if self._store is None:
            raise RuntimeError("checkpoints need a run directory (launch with trainplan run)")
        folder = self._store.begin(step)
        if self._engine is not None:
            self._engine.save_checkpoint(str(folder / "deepspeed"), tag="state", save_latest=False)
        else:
            model_sd, optim_sd = self._full_state_dicts()
            if self.is_main:
                save_tensor_file(model_sd, folder / "model.pt")
                save_tensor_file(optim_sd, folder / "optim.pt")
        save_tensor_file(self._trainer_state(step), folder / f"trainer_rank{self.rank}.pt")
        ref = self._store.commit(step, world_size=self.world_size, strategy=self.strategy)
        self._last_ckpt_step = step
        self._last_ckpt_time = time.monotonic()
        if self._metrics is not None:
            self._metrics.event("checkpoint", step=step, dir=ref.path.name)
        return ref.path

    def _full_state_dicts(self, *, optimizer: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Full (unsharded) model and optimizer state dicts on rank 0, on the CPU (torch engines)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        module = self._inner_module()
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd = get_model_state_dict(module, options=opts)
        optim_sd = get_optimizer_state_dict(module, self.optimizer, options=opts) if optimizer else None
        return model_sd, optim_sd

    def _inner_module(self) -> torch.nn.Module:
        if self._engine is not None:
            return self._engine.module
        if self.strategy == "ddp":
            return self.model.module
        return self.model

    def resume(self) -> int:
        """Collective: load the last checkpoint if there is one; returns its step (else 0).

        Restores the model, the optimizer, this rank's RNG state and the
        run's clocks, and drops metric lines past the checkpoint.
        """
        if self._store is None:
            return 0
        ref = self._store.latest()
        if ref is None:
            if self._metrics is not None:
                self._metrics.event("start", world_size=self.world_size, strategy=self.strategy)
            self._segment_start = self._last_mark = time.perf_counter()
            return 0
        if ref.world_size != self.world_size or ref.strategy != self.strategy:
            raise RuntimeError(
                f"checkpoint {ref.path} was written by {ref.world_size} processes with {ref.strategy}; "
                f"this run has {self.world_size} with {self.strategy}"
            )
        if self._engine is not None:
            path, _ = self._engine.load_checkpoint(str(ref.path / "deepspeed"), tag="state")
            if path is None:
                raise RuntimeError(f"DeepSpeed could not load {ref.path / 'deepspeed'}")
        else:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            module = self._inner_module()
            opts = StateDictOptions(full_state_dict=True)
            set_model_state_dict(module, load_tensor_file(ref.path / "model.pt"), options=opts)
            set_optimizer_state_dict(module, self.optimizer, load_tensor_file(ref.path / "optim.pt"), options=opts)
        trainer = load_tensor_file(ref.path / f"trainer_rank{self.rank}.pt")
        set_rng_state(trainer["rng"])
        self._train_s_before = float(trainer["train_s"])
        self._peak_before = int(trainer["peak_bytes"])
        self._last_step = self._last_ckpt_step = ref.step
        if self.is_main and self.paths is not None:
            truncate_after(self.paths.metrics, ref.step)
            if self._metrics is not None:
                self._metrics.close()
            self._metrics = MetricsWriter(self.paths.metrics)
            self._metrics.event("resume", step=ref.step, restart_count=self.restart_count)
        self.barrier()
        self._segment_start = self._last_mark = time.perf_counter()
        self._first_in_segment = True
        return ref.step

    # ------------------------------------------------------------------ the end
    def param_fingerprint(self) -> str:
        """Collective: SHA-256 of every parameter, gathered in full, in name order."""
        digest = hashlib.sha256()
        for name, tensor in self._full_parameters():
            digest.update(name.encode())
            digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def _full_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        module = self._inner_module()
        for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            if hasattr(p, "full_tensor"):  # FSDP2 DTensor
                yield name, p.full_tensor()
            elif hasattr(p, "ds_id"):  # DeepSpeed ZeRO-3 partitioned parameter
                import deepspeed

                with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
                    yield name, p.data.clone()
            else:
                yield name, p.data

    def full_model_state(self) -> dict[str, torch.Tensor] | None:
        """Collective: the full model state dict on rank 0 (None on other ranks)."""
        module = self._inner_module()
        if self._engine is not None and self.strategy.startswith("zero3"):
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                sd = {k: v.detach().to("cpu").clone() for k, v in module.state_dict().items()}
            return sd if self.is_main else None
        if self._engine is not None:
            return {k: v.detach().to("cpu") for k, v in module.state_dict().items()} if self.is_main else None
        model_sd = self._full_state_dicts(optimizer=False)[0] if self.strategy in _FSDP else module.state_dict()
        return {k: v.detach().to("cpu") for k, v in model_sd.items()} if self.is_main else None

    def describe_wrapping(self) -> dict[str, Any]:
        """What :meth:`wrap` really built (recorded per rank, checked by the tests)."""
        info: dict[str, Any] = {"wrapped_as": type(self.model).__name__}
        if self._engine is not None:
            info["zero_stage"] = int(self._engine.zero_optimization_stage())
            info["offload_optimizer"] = bool(self._engine.zero_cpu_offload())
            info["offload_param"] = self._engine.zero_offload_param() is not None
        else:
            first = next(self.model.parameters(), None)
            info["sharded_params"] = bool(first is not None and hasattr(first, "full_tensor"))
        return info

    def peak_bytes(self) -> int:
        """Collective: the largest peak of any rank, over every segment of the run."""
        mine = max(self._peak_before, self._peak.peak_bytes())
        if self.distributed:
            t = torch.tensor([mine], dtype=torch.int64, device=self._collective_device())
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            return int(t.item())
        return mine

    def finish(
        self,
        *,
        status: str = "completed",
        workload: dict[str, Any] | None = None,
        save_model: bool = True,
    ) -> dict[str, Any] | None:
        """Collective: record the measurement and shut the process group down.

        Rank 0 writes ``result.json`` (and ``model.pt`` when the run completed)
        and returns the result; other ranks return None.
        """
        result: dict[str, Any] | None = None
        if self.model is not None:
            fingerprint = self.param_fingerprint()
            peak = self.peak_bytes()
            if self.paths is not None:
                self._record_rank("end", params_sha256=fingerprint, status=status, **self.describe_wrapping())
                state = self.full_model_state() if save_model and status == "completed" else None
                if self.is_main:
                    if state is not None:
                        save_tensor_file(state, self.paths.model)
                    result = self._result(status, peak, workload or {})
                    write_json_atomic(self.paths.result, result)
        elif self.paths is not None and self.is_main:
            result = self._result(status, self._peak.peak_bytes(), workload or {})
            write_json_atomic(self.paths.result, result)
        if self._metrics is not None:
            self._metrics.close()
        if self.distributed:
            self.barrier()  # a barrier before destroy avoids gloo's abort at exit
            torch.distributed.destroy_process_group()
        return result

    def _result(self, status: str, peak: int, workload: dict[str, Any]) -> dict[str, Any]:
        assert self.paths is not None
        records = read_metrics(self.paths.metrics)
        figs = step_figures(records)
        last = [r for r in records if "event" not in r and "step" in r]
        train_s = last[-1]["elapsed_s"] if last else self._train_s_before + (time.perf_counter() - self._segment_start)
        measured: dict[str, Any] = {
            "step_time_s": figs.step_time_s,
            "peak_gib": peak / GIB,
            "train_s": train_s,
            "final_loss": figs.final_loss,
        }
        tokens, samples = workload.get("tokens_per_step"), workload.get("samples_per_step")
        if tokens and figs.step_time_s:
            measured["tokens_per_s"] = tokens / figs.step_time_s
        elif samples and figs.step_time_s:
            measured["rows_per_s"] = samples / figs.step_time_s
        return {
            "status": status,
            "steps": figs.steps,
            "world_size": self.world_size,
            "strategy": self.strategy,
            "device": self.device.type,
            "precision": self.precision,
            "restarts": self.restart_count,
            "peak_method": self._peak.method,
            "measured": measured,
            "workload": workload,
        }


def _skip_deepspeed_shm_op() -> None:
    """Keep DeepSpeed from compiling its shared-memory all-reduce kernel on a CPU.

    DeepSpeed builds ``deepspeed_shm_comm`` (ninja + g++, about a minute on
    two cores, cached in ``$TORCH_EXTENSIONS_DIR``) when it creates its comm
    backend, but only ``inference_all_reduce`` — DeepSpeed-Inference — uses
    it; training collectives go through ``torch.distributed`` (gloo).
    DeepSpeed keeps its op-compatibility table in a module-level dict that it
    reads before building (``deepspeed.ops.__compatible_ops__``, documented
    there as persistent); marking the op incompatible skips the build.  With
    another DeepSpeed layout this does nothing and DeepSpeed compiles as usual.
    """
    try:
        import deepspeed.ops

        table = deepspeed.ops.__compatible_ops__
        if isinstance(table, dict):
            table["deepspeed_shm_comm"] = False
    except (ImportError, AttributeError):
        pass


def _param_names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: the items of every ``ModuleList``, innermost first
    (``fully_shard`` goes bottom-up)."""
    blocks: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            blocks.extend(module)
    return blocks[::-1]


def _rebuild_optimizer(optimizer: Any, names: dict[int, str], model: torch.nn.Module) -> torch.optim.Optimizer:
    """An optimizer like ``optimizer`` (same class, groups, hyper-parameters) over ``model``'s new parameters."""
    if callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer(model.parameters())
    if any(optimizer.state.values()):
        raise RuntimeError("wrap the model before the first optimizer step (the optimizer already has state)")
    new = dict(model.named_parameters())
    groups = []
    for group in optimizer.param_groups:
        params = [new[names[id(p)]] for p in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    accepted = inspect.signature(type(optimizer)).parameters
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    rebuilt = type(optimizer)(groups, **kwargs)
    rebuilt.defaults.update(optimizer.defaults)
    return rebuilt


def init(config: RunConfig | None = None) -> Context:
    """Start this process's part of the run.

    Reads the run configuration from ``$TRAINPLAN_RUN_CONFIG`` (set by
    ``trainplan run``) unless ``config`` is given.  Run bare, without either,
    it is a single process on the best local device, without metrics or
    checkpoints.  Initialises ``torch.distributed`` (gloo on CPU, NCCL on
    CUDA) when the run has several processes or uses DeepSpeed, sets the CPU
    thread count, installs a SIGTERM handler and starts the peak-memory meter.
    """
    ctx = Context(config if config is not None else RunConfig.from_env())
    ctx._start()
    return ctx

