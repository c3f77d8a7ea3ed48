"""Candidate hardware × strategy options for a job, from the catalog."""

from __future__ import annotations

from typing import Iterator

from trainplan.catalog import Catalog, Instance
from trainplan.estimate.hardware import (
    Hardware,
    hardware_for_cpus,
    hardware_for_gpu,
    hardware_for_instance,
    hardware_for_instance_cpus,
)
from trainplan.planner.local import with_measured_cpu
from trainplan.planner.this_machine import this_machine_candidates
from trainplan.estimate.tabular import MAX_TABULAR_NODES, MULTI_NODE_LIBRARIES
from trainplan.spec import Constraints, Job, TabularJob, TorchJob, TransformerJob
from trainplan.strategies import Strategy, strategies_for

__all__ = ["candidates", "gpu_hardware", "hardware_for_cpus", "hardware_for_gpu", "hardware_for_instance", "node_counts"]


def node_counts(gpus_per_node: int, max_gpus: int) -> Iterator[int]:
    """1, 2, 4, … nodes while the job's ``constraints.max_gpus`` allows: no cap of trainplan's own."""
    nodes = 1
    while gpus_per_node * nodes <= max_gpus:
        yield nodes
        nodes *= 2


def _allowed(inst: Instance, c: Constraints) -> bool:
    if not c.allows(inst.cloud):
        return False
    if c.spot and inst.spot_price_usd_per_h is None and inst.cloud != "local":
        return False
    return inst.accelerator_count <= c.max_gpus


def gpu_hardware(job: Job, catalog: Catalog) -> Iterator[Hardware]:
    """Every GPU instance of the catalog the job's constraints allow, on 1, 2, 4 … nodes (multi-node where the
    instance has a network figure and at least 4 GPUs)."""
    c = job.constraints
    for inst in catalog.instances:
        if inst.accelerator is None or not _allowed(inst, c):
            continue
        spot = c.spot and inst.cloud != "local"
        multi_node_ok = inst.cloud != "local" and inst.accelerator_count >= 4 and bool(inst.network_gbps)
        for nodes in node_counts(max(1, inst.accelerator_count), c.max_gpus):
            if nodes > 1 and not multi_node_ok:
                break
            yield hardware_for_instance(inst, catalog, nodes=nodes, spot=spot)


def candidates(job: Job, catalog: Catalog) -> Iterator[tuple[Hardware, Strategy | None]]:
    """Every (hardware, strategy) worth estimating for ``job`` under its constraints, data parallel; the
    model-parallel layouts of the same hardware are searched apart (planner/layouts.py)."""
    c = job.constraints
    for inst in catalog.instances:
        if not _allowed(inst, c):
            continue
        spot = c.spot and inst.cloud != "local"
        if isinstance(job, TabularJob):
            yield hardware_for_instance(inst, catalog, spot=spot), None
            if inst.accelerator is None and inst.cloud != "local" and inst.network_gbps and job.library in MULTI_NODE_LIBRARIES:
                for nodes in (2, 4, 8, MAX_TABULAR_NODES):  # one model over several machines (xgboost.dask, LightGBM Dask)
                    yield hardware_for_instance(inst, catalog, nodes=nodes, spot=spot), None
            continue
        if inst.accelerator is None and isinstance(job, (TransformerJob, TorchJob)):
            # CPUs: one process on every core (estimate/cpu.py)
            yield hardware_for_instance(inst, catalog, spot=spot), Strategy.SINGLE
    if not isinstance(job, TabularJob):
        for hw in gpu_hardware(job, catalog):
            for strategy in strategies_for(hw.layout.world_size):
                yield hw, strategy
    if isinstance(job, (TransformerJob, TorchJob)):
        yield from workstation_cpu_candidates(job, catalog)
    for hw, strategy in this_machine_candidates(job, catalog):  # "this machine", when `trainplan probe` saved a profile here
        # a neural job on its CPUs: the cores as the probe measured them (planner/local.py)
        yield (with_measured_cpu(hw) if strategy is not None else hw), strategy


def workstation_cpu_candidates(job: Job, catalog: Catalog) -> Iterator[tuple[Hardware, Strategy | None]]:
    """The CPUs of each owned (``local``) machine with GPUs, for a model that fits none of its GPUs but its RAM
    (priced as the whole machine)."""
    for inst in catalog.instances:
        if inst.cloud == "local" and inst.accelerator is not None and _allowed(inst, job.constraints):
            yield hardware_for_instance_cpus(inst, catalog), Strategy.SINGLE
