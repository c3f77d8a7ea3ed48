"""What the built-in neural workloads share: their shape, seeding, optimizers."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from trainplan.run.workloads.checks import check_optimizer
from trainplan.spec import Optimizer


def parameter_count(model: torch.nn.Module, *, trainable: bool = False) -> int:
    """Parameters of ``model`` as the model counts them: a 4-bit bitsandbytes weight (QLoRA) packs two values
    per byte, so its element count is read from its quantization state's shape, not from the packed tensor."""
    total = 0
    for p in model.parameters():
        if trainable and not p.requires_grad:
            continue
        state = getattr(p, "quant_state", None)
        total += math.prod(state.shape) if state is not None else p.numel()
    return total


@dataclass(frozen=True)
class NeuralWorkload:
    """A model with its batches and its loss.

    ``batch(step, micro, rank)`` returns the inputs of one micro-batch on the
    CPU — a pure function of its arguments, so a resumed run replays the same
    data; ``loss(model, inputs)`` returns a scalar tensor.
    """

    model: torch.nn.Module
    batch: Callable[[int, int, int], Any]
    loss: Callable[[Any, Any], torch.Tensor]
    tokens_per_sample: int | None = None  # transformer jobs
    flops_per_token: float | None = None  # model FLOPs per trained token
    #: fills a meta-device model's shards after FSDP sharded it (a pretrained checkpoint under FSDP)
    materialize: Callable[[torch.nn.Module, torch.device], None] | None = None
    #: collective: mean loss per target token over the eval rows (None without an eval split)
    evaluate: Callable[[Any, Any], float] | None = None
    eval_every: int | None = None
    #: rank 0: write the trained model (given its full state dict) where users' tools read it
    save_final: Callable[[dict[str, torch.Tensor]], Any] | None = None
    #: how the weights were loaded (a pretrained checkpoint), written as a ``load`` event
    load_note: str | None = None


def batch_generator(seed: int, *key: int) -> torch.Generator:
    """A torch generator seeded from ``(seed, *key)`` (stable across runs and platforms)."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    gen = torch.Generator()
    gen.manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))
    return gen


def to_device(obj: Any, device: torch.device) -> Any:
    """Move a tensor, or the tensors in a dict / tuple / list, to ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def optimizer_factory(kind: Optimizer, lr: float, *, model: torch.nn.Module | None = None,
                      ) -> Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]:  # fmt: skip
    """A function that builds the job's optimizer over the trainable parameters it is given (Muon: ``model``'s own
    parameters, which it splits into hidden matrices and the rest)."""
    check_optimizer(kind)

    def make(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        trainable = [p for p in params if p.requires_grad]
        if kind is Optimizer.MUON:
            from trainplan.estimate.trace.optimizers import make_optimizer

            if model is None:
                raise ValueError("muon needs the model to split its parameters")
            return make_optimizer(trainable, kind, lr=lr, model=model)
        if kind is Optimizer.SGD:
            return torch.optim.SGD(trainable, lr=lr, momentum=0.9)
        if kind is Optimizer.ADAFACTOR:
            return torch.optim.Adafactor(trainable, lr=lr)
        return torch.optim.AdamW(trainable, lr=lr)

    return make
