"""Candidate hardware × strategy options for a job, from the catalog."""

from __future__ import annotations

from typing import Iterator

from trainplan.catalog import Catalog, Instance
from trainplan.estimate.hardware import Hardware, hardware_for_cpus, hardware_for_gpu, hardware_for_instance
from trainplan.planner.this_machine import this_machine_candidates
from trainplan.spec import Constraints, Job, TabularJob
from trainplan.strategies import Strategy, strategies_for

__all__ = ["NODE_COUNTS", "candidates", "hardware_for_cpus", "hardware_for_gpu", "hardware_for_instance"]

NODE_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def _allowed(inst: Instance, c: Constraints) -> bool:
    if inst.cloud not in {cl.value for cl in c.clouds}:
        return False
    if c.spot and inst.spot_price_usd_per_h is None and inst.cloud != "local":
        return False
    return inst.accelerator_count <= c.max_gpus


def candidates(job: Job, catalog: Catalog) -> Iterator[tuple[Hardware, Strategy | None]]:
    """Every (hardware, strategy) worth estimating for ``job`` under its constraints."""
    c = job.constraints
    for inst in catalog.instances:
        if not _allowed(inst, c):
            continue
        spot = c.spot and inst.cloud != "local"
        if isinstance(job, TabularJob):
            yield hardware_for_instance(inst, catalog, spot=spot), None
            continue
        if inst.accelerator is None:
            continue
        multi_node_ok = inst.cloud != "local" and inst.accelerator_count >= 4 and bool(inst.network_gbps)
        for nodes in NODE_COUNTS:
            if nodes > 1 and not multi_node_ok:
                break
            if inst.accelerator_count * nodes > c.max_gpus:
                break
            hw = hardware_for_instance(inst, catalog, nodes=nodes, spot=spot)
            for strategy in strategies_for(hw.layout.world_size):
                yield hw, strategy
    yield from this_machine_candidates(job, catalog)  # "this machine", when `trainplan probe` saved a profile here
