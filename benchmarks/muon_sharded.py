"""torch.optim.Muon on FSDP2-sharded parameters: the result and the collectives it costs (why trainplan plans Muon with
single and DDP only; docs/estimates.md, "Muon optimizer").

    python benchmarks/muon_sharded.py            # 2 processes on gloo, CPU only, a few seconds

Prints, for one r × c linear layer sharded by ``fully_shard`` over the ranks: the largest difference between the
sharded step's weights and one unsharded torch.optim.Muon step on the same gradient, and the collectives DTensor
issues inside ``optimizer.step()`` (``torch.distributed.tensor.debug.CommDebugMode``).
"""

from __future__ import annotations

import os
import sys


def worker(rank: int, world: int, rows: int, cols: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.debug import CommDebugMode

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    sharded = torch.nn.Linear(cols, rows, bias=False)
    plain = torch.nn.Linear(cols, rows, bias=False)
    plain.load_state_dict(sharded.state_dict())
    fully_shard(sharded)
    x = torch.randn(8, cols)
    opts = []
    for model in (sharded, plain):
        model(x).square().sum().backward()
        opts.append(torch.optim.Muon(model.parameters(), lr=0.02))
    with CommDebugMode() as comm:
        opts[0].step()
    opts[1].step()
    diff = (sharded.weight.full_tensor() - plain.weight).abs().max().item()
    if rank == 0:
        counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
        print(f"{rows} x {cols} on {world} ranks: max |sharded - unsharded| = {diff:.3g}; "
              f"collectives in one optimizer.step(): {counts}")
    dist.destroy_process_group()


def main() -> int:
    import torch.multiprocessing as mp

    world = 2
    for rows, cols in ((128, 256), (256, 128), (192, 192)):
        mp.spawn(worker, args=(world, rows, cols), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
