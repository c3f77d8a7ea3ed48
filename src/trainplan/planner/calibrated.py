"""Use measured runs (the calibration store of ``trainplan.measure``) in place of default efficiencies."""

from __future__ import annotations

from typing import Callable

from trainplan.estimate.result import Hardware
from trainplan.spec import Job, TabularJob, TransformerJob


def efficiency_lookup(job: Job, *, this_machine: str | None = None) -> Callable[[Hardware], float | None] | None:
    """A function giving an option's measured efficiency, if a run on its hardware was recorded.

    A transformer run records its achieved model TFLOP/s per device; divided by
    the accelerator's dense peak for the job's dtype it is the efficiency the
    estimator would otherwise take from assumptions.yaml.  A tabular run records
    the per-core rate (ns per cell) of its library on the CPU it ran on, which
    replaces the rate from tabular_rates.csv for that CPU: ``this_machine`` is
    the probe's hardware id (``cpu:<model>:<cores>``) of the machine the option
    stands for.  Latest record wins.
    """
    if isinstance(job, TabularJob):
        return _tabular_rate_lookup(job, this_machine)
    if not isinstance(job, TransformerJob):
        return None
    try:
        from trainplan.measure.calibration import load_calibrations
    except ImportError:  # pragma: no cover - measure package absent
        return None
    records = [c for c in load_calibrations() if c.kind == "transformer" and c.achieved_tflops]
    if not records:
        return None
    latest: dict[str, float] = {}
    for c in sorted(records, key=lambda c: c.recorded_at):
        latest[c.hardware_id] = float(c.achieved_tflops or 0.0)
    dtype = job.precision.half or "fp32"

    def lookup(hw: Hardware) -> float | None:
        acc = hw.accelerator
        if acc is None or acc.id not in latest:
            return None
        peak = acc.peak_tflops(dtype)
        return min(1.0, latest[acc.id] / peak) if peak else None

    return lookup


def _tabular_rate_lookup(job: TabularJob, this_machine: str | None) -> Callable[[Hardware], float | None] | None:
    if this_machine is None:
        return None  # catalog instances are not the machine a run measured
    from trainplan.measure.calibration import lookup as find

    from trainplan.estimate.tabular import tabular_work_unit

    record = find(this_machine, "tabular", job.library.value)
    if record is None or not record.ns_per_cell or record.work_unit != tabular_work_unit(job.library.value):
        return None  # none, or a rate in the unit of an earlier cost model
    rate = float(record.ns_per_cell)

    def lookup(hw: Hardware) -> float | None:
        return rate if hw.accelerator is None and hw.instance is None else None

    return lookup
