"""Apply a strategy to a model and its optimizer: one function per engine.

* plain torch (``single``, ``ddp``): the model on the device, wrapped in
  ``DistributedDataParallel`` for DDP; a ``GradScaler`` for fp16 on CUDA;
* FSDP2 (``fsdp``, ``fsdp-grad-op``, ``fsdp-offload``): ``fully_shard`` on every ``ModuleList``
  item and then the root, over a one-dimensional device mesh (``fsdp-offload``: with
  ``offload_policy=CPUOffloadPolicy()``, parameter and gradient shards in host RAM, the
  optimizer stepping there); the optimizer is rebuilt over the sharded parameters;
* DeepSpeed (``zero*``): ``deepspeed.initialize`` with the run's generated
  ZeRO config; its engine then owns backward and step.

A new engine gets a ``_wrap_<engine>`` function here and a branch in :func:`wrap`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from trainplan.spec import Precision
from trainplan.strategies import Engine, Strategy

OptimizerArg = torch.optim.Optimizer | Callable[[Any], torch.optim.Optimizer]
#: Fills a sharded meta-device model's storage on a device (each rank its own shards).
Materialize = Callable[[torch.nn.Module, torch.device], None]


@dataclass(frozen=True)
class Placement:
    """How and where this process trains: the strategy, its device, the precision, the process count,
    and the generated DeepSpeed config (DeepSpeed strategies)."""

    strategy: Strategy
    device: torch.device
    precision: Precision
    world_size: int
    deepspeed_config: Mapping[str, Any] | None = None
    tp: int = 1  # tensor-parallel degree: FSDP shards over world_size / tp ranks, tensor parallel inside (2-D mesh)
    sequence_parallel: bool = False
    ep: int = 1  # expert-parallel degree: each MoE layer's experts split over ep ranks, FSDP over world_size / ep
    pp: int = 1  # pipeline stages: ranks ordered (pp, dp), FSDP over the world_size / pp ranks of a stage
    vpp: int = 1  # chunks per pipeline rank (interleaved 1F1B when > 1)
    microbatches: int = 1  # pipeline micro-batches a step (the accumulation count)


@dataclass
class Wrapped:
    """What :func:`wrap` built: the model and optimizer to train with, and the engine's extras."""

    model: Any
    optimizer: Any
    strategy: Strategy
    engine: Any = None  # the DeepSpeed engine (DeepSpeed strategies)
    scaler: Any = None  # torch.amp.GradScaler (fp16 on CUDA, plain torch)
    pipeline: "Pipeline | None" = None  # pipeline-parallel runs: this rank's schedule

    @property
    def module(self) -> torch.nn.Module:
        """The user's module inside whatever wraps it."""
        if self.engine is not None:
            return self.engine.module
        if self.strategy is Strategy.DDP:
            return self.model.module
        return self.model

    def set_grad_sync(self, sync: bool) -> None:
        """Whether the next backward synchronises gradients (off inside an accumulation window).

        DDP only. FSDP keeps reduce-scattering every micro-batch, as torchtitan and torchtune do: with
        ``set_requires_gradient_sync(False)`` FSDP2 would keep the *unsharded* gradients of the whole model until
        the last micro-batch (PyTorch FSDP docs, no_sync), which defeats sharding for the models FSDP is chosen
        for. The estimate counts it the same way (stacks.yaml plain: unsharded_accumulation false; comms.py
        reduce-scatters per micro-batch).
        """
        if self.strategy is Strategy.DDP:
            self.model.require_backward_grad_sync = sync

    def describe(self) -> dict[str, Any]:
        """What was really built (recorded per rank, checked by the tests)."""
        info: dict[str, Any] = {"wrapped_as": type(self.model).__name__}
        if self.engine is not None:
            info["zero_stage"] = int(self.engine.zero_optimization_stage())
            info["offload_optimizer"] = bool(self.engine.zero_cpu_offload())
            info["offload_param"] = self.engine.zero_offload_param() is not None
        else:
            first = next(self.model.parameters(), None)
            info["sharded_params"] = bool(first is not None and hasattr(first, "full_tensor"))
            if self.strategy.engine is Engine.FSDP:
                info["offload_params"] = _fsdp2_offloads(self.model)
        return info


def _fsdp2_offloads(model: torch.nn.Module) -> bool:
    """Whether FSDP2 keeps this model's parameter shards in host RAM (its per-parameter ``offload_to_cpu``)."""
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state else None
        if group is not None and group.fsdp_params:
            return bool(group.fsdp_params[0].offload_to_cpu)
    return False


def _is_factory(optimizer: Any) -> bool:
    return callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer)


def wrap(model: torch.nn.Module, optimizer: OptimizerArg, placement: Placement, *,
         materialize: Materialize | None = None) -> Wrapped:
    """Apply ``placement.strategy`` to ``model`` and ``optimizer`` (an optimizer over its parameters, or a factory).

    A model on the meta device is accepted under FSDP only, with ``materialize``
    to fill its shards after sharding.
    """
    engine = placement.strategy.engine
    if placement.pp > 1:
        return _wrap_pipeline(model, optimizer, placement)
    if engine is Engine.FSDP:
        return _wrap_fsdp(model, optimizer, placement, materialize)
    if any(p.is_meta for p in model.parameters()):
        raise RuntimeError(f"a model on the meta device can be wrapped by FSDP only, not {placement.strategy.value}")
    if engine is Engine.TORCH:
        return _wrap_torch(model, optimizer, placement)
    return _wrap_deepspeed(model, optimizer, placement)


def _wrap_torch(model: torch.nn.Module, optimizer: OptimizerArg, placement: Placement) -> Wrapped:
    strategy, device, precision = placement.strategy, placement.device, placement.precision
    model = model.to(device)
    if precision is Precision.BF16_PURE:
        model = model.to(torch.bfloat16)
    opt = optimizer(model.parameters()) if _is_factory(optimizer) else optimizer
    if strategy is Strategy.DDP:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    scaler = torch.amp.GradScaler("cuda") if precision is Precision.FP16 and device.type == "cuda" else None
    return Wrapped(model, opt, strategy, scaler=scaler)


@dataclass
class Pipeline:
    """This rank's part of a pipeline-parallel run (run/runtime/model_parallel.py): its schedule, whether it feeds
    the first stage or holds the last, and the groups of its stage's data-parallel ranks."""

    schedule: Any
    first: bool
    last: bool
    stage: int  # this rank's pipeline rank (0 … pp − 1)
    pp: int
    dp_group: Any  # the ranks of this pipeline rank that train on other data (FSDP's dimension)

    def step(self, rows: torch.Tensor) -> torch.Tensor:
        """Collective: forward and backward of ``rows`` (the step's micro-batches, stacked) through the pipeline;
        returns the mean loss of the whole step over every data-parallel rank (every rank gets it)."""
        import torch.distributed as dist

        losses: list[torch.Tensor] = []
        inputs = (rows,) if self.first else ()
        if self.last:
            self.schedule.step(*inputs, target=rows, losses=losses)
        else:
            self.schedule.step(*inputs)
        mine = torch.stack([v.detach().float() for v in losses]).mean() if losses else torch.zeros(())
        total = mine.reshape(1).to(rows.device)
        dist.all_reduce(total)  # only the last stage's ranks contribute: the sum over data-parallel ranks
        return total[0] / (dist.get_world_size() // self.pp)


def _wrap_pipeline(model: torch.nn.Module, optimizer: OptimizerArg, placement: Placement) -> Wrapped:
    """Pipeline parallel × FSDP: ranks on a (pp, dp) mesh; this rank keeps its chunks of the model
    (``pipeline_split``), FSDP shards each block and each chunk over the stage's dp ranks, and torch's 1F1B or
    interleaved 1F1B schedule runs the step's micro-batches (gradients scaled to their mean by the schedule)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainplan.run.runtime.model_parallel import causal_lm_loss, pipeline_schedule, pipeline_split

    device, precision, pp = placement.device, placement.precision, placement.pp
    if placement.strategy is not Strategy.FSDP:
        raise RuntimeError(f"pipeline parallel runs with fsdp over each stage's ranks, not {placement.strategy.value}")
    mesh = init_device_mesh(device.type, (pp, placement.world_size // pp), mesh_dim_names=("pp", "dp"))
    stage = mesh["pp"].get_local_rank()
    chunks = pipeline_split(model, pp_rank=stage, pp=pp, vpp=placement.vpp)
    model = model.to(device)
    if precision is Precision.BF16_PURE:
        model = model.to(torch.bfloat16)
    mp = MixedPrecisionPolicy()
    if device.type == "cuda" and precision in (Precision.BF16, Precision.FP16):
        half = torch.bfloat16 if precision is Precision.BF16 else torch.float16
        mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    for _, chunk in chunks:
        for layer in chunk.layers:
            fully_shard(layer, mesh=mesh["dp"], mp_policy=mp)
        fully_shard(chunk, mesh=mesh["dp"], mp_policy=mp)  # the embedding / norm / head this chunk holds
    if not _is_factory(optimizer):
        raise RuntimeError("pipeline parallel builds the optimizer over this rank's stages: pass an optimizer factory")
    opt = optimizer(model.parameters())  # type: ignore[operator]
    schedule = pipeline_schedule(chunks, pp=pp, vpp=placement.vpp, microbatches=placement.microbatches,
                                 group=mesh["pp"].get_group(), device=device, loss_fn=causal_lm_loss)  # fmt: skip
    pipe = Pipeline(schedule, first=any(c.first for _, c in chunks), last=any(c.last for _, c in chunks),
                    stage=stage, pp=pp, dp_group=mesh["dp"].get_group())  # fmt: skip
    return Wrapped(model, opt, placement.strategy, pipeline=pipe)


def _wrap_fsdp(model: torch.nn.Module, optimizer: OptimizerArg, placement: Placement,
               materialize: Materialize | None = None) -> Wrapped:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    strategy, device, precision = placement.strategy, placement.device, placement.precision
    names = param_names(model)
    on_meta = any(p.is_meta for p in model.parameters())
    if on_meta and materialize is None:
        raise RuntimeError("the model is on the meta device: pass materialize= to fill its shards")
    if not on_meta:
        model = model.to(device)
    if precision is Precision.BF16_PURE:
        model = model.to(torch.bfloat16)
    if placement.tp > 1:
        # 2-D: tensor parallel on the inner dimension, FSDP over the outer (run/runtime/model_parallel.py)
        from trainplan.run.runtime.model_parallel import apply_tensor_parallel

        mesh2 = init_device_mesh(device.type, (placement.world_size // placement.tp, placement.tp), mesh_dim_names=("dp", "tp"))
        apply_tensor_parallel(model, mesh2["tp"], sequence_parallel=placement.sequence_parallel)
        mesh = mesh2["dp"]
    else:
        mesh = init_device_mesh(device.type, (placement.world_size,))
    mp = MixedPrecisionPolicy()
    if device.type == "cuda" and precision in (Precision.BF16, Precision.FP16):
        half = torch.bfloat16 if precision is Precision.BF16 else torch.float16
        mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32)
    reshard = strategy in (Strategy.FSDP, Strategy.FSDP_OFFLOAD)  # fsdp-grad-op keeps parameters gathered (ZeRO-2-like)
    # pinned host buffers need an accelerator (torch: pin_memory() raises without one)
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if strategy is Strategy.FSDP_OFFLOAD else OffloadPolicy()
    if placement.ep > 1:
        shard_experts(model, device.type, placement.world_size, placement.ep,
                      reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)  # fmt: skip
    for block in shard_blocks(model):
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
    if on_meta:
        assert materialize is not None
        # with CPU offload the shards live in host memory
        materialize(model, torch.device("cpu") if strategy is Strategy.FSDP_OFFLOAD else device)
    return Wrapped(model, rebuild_optimizer(optimizer, names, model), strategy)


def _wrap_deepspeed(model: torch.nn.Module, optimizer: OptimizerArg, placement: Placement) -> Wrapped:
    import deepspeed

    if placement.deepspeed_config is None:
        raise RuntimeError(f"strategy {placement.strategy.value} needs a DeepSpeed config; launch with trainplan run")
    if _is_factory(optimizer):
        optimizer = optimizer(model.parameters())  # type: ignore[operator]
    engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=dict(placement.deepspeed_config))
    return Wrapped(engine, opt, placement.strategy, engine=engine)


def shard_experts(model: torch.nn.Module, device_type: str, world_size: int, ep: int, **fsdp: Any) -> None:
    """Expert parallel under FSDP (run/runtime/expert_parallel.py): the experts split ``ep`` ways on the inner
    dimension of a (world / ep, ep) mesh and sharded by FSDP over the outer one, as tensor parallel is."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from trainplan.run.runtime.expert_parallel import apply_expert_parallel

    if world_size % ep:
        raise RuntimeError(f"expert parallel degree {ep} must divide the {world_size} processes")
    mesh = init_device_mesh(device_type, (world_size // ep, ep), mesh_dim_names=("dp_mod_ep", "ep"))
    for experts in apply_expert_parallel(model, mesh["ep"]):
        fully_shard(experts, mesh=mesh["dp_mod_ep"], **fsdp)


def param_names(model: torch.nn.Module) -> dict[int, str]:
    """Parameter name by ``id`` of the parameter (to find each one again after sharding)."""
    return {id(p): name for name, p in model.named_parameters()}


def shard_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: the items of every ``ModuleList``, innermost first
    (``fully_shard`` goes bottom-up)."""
    blocks: list[torch.nn.Module] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList):
            blocks.extend(module)
    return blocks[::-1]


def rebuild_optimizer(optimizer: OptimizerArg, names: dict[int, str], model: torch.nn.Module) -> torch.optim.Optimizer:
    """An optimizer like ``optimizer`` (same class, groups, hyper-parameters) over ``model``'s new parameters."""
    if _is_factory(optimizer):
        return optimizer(model.parameters())  # type: ignore[operator]
    assert isinstance(optimizer, torch.optim.Optimizer)
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
