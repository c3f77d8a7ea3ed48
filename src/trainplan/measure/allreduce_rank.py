"""One rank of the probe's all-reduce benchmark, run as a script by :func:`trainplan.measure.microbench.allreduce_bus_gb_s`.

    python allreduce_rank.py RANK WORLD PORT BACKEND BYTES REPS

Imports torch only (not trainplan), so a rank starts as fast as torch does.  Rank 0 prints the median
seconds of one all-reduce of BYTES bytes over REPS timed repetitions (after two warm-up calls).
"""

from __future__ import annotations

import statistics
import sys
import time


def run_rank(rank: int, world: int, port: int, backend: str, nbytes: int, reps: int) -> float | None:
    """Join the group on 127.0.0.1:``port``, time ``reps`` all-reduces; rank 0 returns the median seconds."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    cuda = backend == "nccl"
    dev = torch.device(f"cuda:{rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    t = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(2):  # warm-up: connection set-up, buffer registration
        dist.all_reduce(t)
    sync()
    times = []
    for _ in range(reps):
        dist.barrier()
        sync()
        start = time.perf_counter()
        dist.all_reduce(t)
        sync()
        times.append(time.perf_counter() - start)
    dist.destroy_process_group()
    return statistics.median(times) if rank == 0 else None


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        print("usage: allreduce_rank.py RANK WORLD PORT BACKEND BYTES REPS", file=sys.stderr)
        return 2
    rank, world, port, backend, nbytes, reps = argv
    median = run_rank(int(rank), int(world), int(port), backend, int(nbytes), int(reps))
    if median is not None:
        print(median)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
