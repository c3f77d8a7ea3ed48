"""Built-in workload for ``kind: torch``: the user's model factory.

``model: "pkg.mod:factory"`` is called with ``model_args``.  Batches are
synthetic tensors shaped by ``inputs`` — or, when ``data`` is an import path
``"pkg.mod:dataset_factory"``, samples of the data set it returns, in a
seeded shuffled order that every rank shares (each rank takes its own slice).

``loss`` names how the model's output becomes a scalar:

* ``mean`` / ``sum`` — of the output (every data-set item is a model input);
* ``mse`` / ``cross_entropy`` — against a target: the last data-set item, or
  a synthetic one (normal values; class ids below the output's last dimension);
* ``"pkg.mod:fn"`` — ``fn(output, *inputs[, target])`` returns the loss.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from trainplan.errors import SpecError
from trainplan.run.workloads.checks import check_loss, import_callable, is_import_path
from trainplan.run.workloads.common import NeuralWorkload, batch_generator
from trainplan.spec import InputSpec, TorchJob

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}


def synthetic_input(spec: InputSpec, rows: int, gen: torch.Generator) -> torch.Tensor:
    """One input tensor ``[rows, *shape]`` drawn from ``gen``."""
    shape = (rows, *spec.shape)
    dtype = _DTYPES[spec.dtype]
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    return torch.randint(0, spec.high or 2, shape, generator=gen, dtype=dtype)


def _first_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        return next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        return out[0]
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    raise TypeError(f"cannot take a loss of a model output of type {type(out).__name__}")


def make_loss(name: str, *, seed: int) -> Callable[[Any, dict[str, Any]], torch.Tensor]:
    """The loss function ``(model, batch) -> scalar`` for ``loss: name``.

    ``batch`` is ``{"inputs": tuple, "target": tensor | None, "key": (step, micro, rank)}``.
    """
    check_loss(name)
    custom = import_callable(name, field="loss") if is_import_path(name) else None

    def loss(model: Any, batch: dict[str, Any]) -> torch.Tensor:
        inputs, target = batch["inputs"], batch["target"]
        out = model(*inputs)
        if custom is not None:
            return custom(out, *inputs, *(() if target is None else (target,)))
        y = _first_output(out).float()
        if name == "mean":
            return y.mean()
        if name == "sum":
            return y.sum()
        if target is None:  # synthetic target, seeded by the batch's key
            gen = batch_generator(seed, -2, *batch["key"])
            if name == "mse":
                target = torch.randn(y.shape, generator=gen)
            else:
                target = torch.randint(0, y.shape[-1], y.shape[:-1], generator=gen)
            target = target.to(y.device)
        if name == "mse":
            return torch.nn.functional.mse_loss(y, target.float())
        return torch.nn.functional.cross_entropy(y.reshape(-1, y.shape[-1]), target.reshape(-1).long())

    return loss


def torch_workload(job: TorchJob, *, world_size: int, micro_batch: int, grad_accum: int) -> NeuralWorkload:
    """Model, batches and loss of a torch job."""
    factory = import_callable(job.model, field="model")
    torch.manual_seed(job.seed)
    model = factory(**job.model_args)
    if not isinstance(model, torch.nn.Module):
        raise SpecError(f"{job.model} returned {type(model).__name__}, not a torch.nn.Module", field="model")

    dataset = None
    if is_import_path(job.data):
        dataset = import_callable(str(job.data), field="data")()
        if len(dataset) == 0:
            raise SpecError(f"{job.data} returned an empty data set", field="data")

    @functools.lru_cache(maxsize=2)
    def order(epoch: int) -> list[int]:
        assert dataset is not None
        return torch.randperm(len(dataset), generator=batch_generator(job.seed, -1, epoch)).tolist()

    with_target = job.loss in ("mse", "cross_entropy")

    def batch(step: int, micro: int, rank: int) -> dict[str, Any]:
        key = (step, micro, rank)
        if dataset is None:
            gen = batch_generator(job.seed, *key)
            inputs = tuple(synthetic_input(spec, micro_batch, gen) for spec in job.inputs)
            return {"inputs": inputs, "target": None, "key": key}
        n = len(dataset)
        first = ((step * grad_accum + micro) * world_size + rank) * micro_batch
        items = []
        for g in range(first, first + micro_batch):
            epoch, pos = divmod(g, n)
            item = dataset[order(epoch)[pos]]
            items.append(tuple(item) if isinstance(item, (tuple, list)) else (item,))
        columns = tuple(torch.stack([torch.as_tensor(it[i]) for it in items]) for i in range(len(items[0])))
        if with_target:
            return {"inputs": columns[:-1], "target": columns[-1], "key": key}
        return {"inputs": columns, "target": None, "key": key}

    return NeuralWorkload(
        model=model,
        batch=batch,
        loss=make_loss(job.loss, seed=job.seed),
    )
