"""Worker for tests/run/test_backends.py: which gradients a DeepSpeed ZeRO stage keeps on the device between the
micro-steps of one accumulation window, with and without the optimizer offloaded; started by torchrun over gloo.

Prints one JSON line on rank 0: for each (stage, offload), the elements held in the parameters' ``.grad`` after the
first micro-step's backward (not an accumulation boundary) and after the second's (the boundary)."""

from __future__ import annotations

import json

import deepspeed
import torch
import torch.distributed as dist


def held_after_each_backward(stage: int, offload: bool) -> list[int]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    zero: dict = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": zero,
              "zero_allow_untested_optimizer": True, "zero_force_ds_cpu_optimizer": False}  # fmt: skip
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config)
    held = []
    for _ in range(2):
        loss = torch.nn.functional.mse_loss(engine(torch.randn(4, 64)), torch.randn(4, 8))
        engine.backward(loss)
        held.append(sum(p.grad.numel() for p in engine.module.parameters() if p.grad is not None))
        engine.step()
    return held


def main() -> None:
    deepspeed.init_distributed("gloo")
    out = {f"{stage}-{offload}": held_after_each_backward(stage, offload) for stage in (1, 2) for offload in (False, True)}
    out["params"] = 64 * 256 + 256 + 256 * 8 + 8
    if dist.get_rank() == 0:
        print("ZERO_GRADS " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
