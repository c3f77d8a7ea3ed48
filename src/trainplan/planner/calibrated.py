"""Use measured runs (the calibration store of ``trainplan.measure``) in place of default efficiencies."""

from __future__ import annotations

from typing import Callable

from trainplan.estimate.result import Hardware
from trainplan.spec import Job, TransformerJob


def efficiency_lookup(job: Job) -> Callable[[Hardware], float | None] | None:
    """A function giving the measured MFU for an option's accelerator, if a run on it was recorded.

    A transformer run records its achieved model TFLOP/s per device; divided by
    the accelerator's dense peak for the job's dtype it is the efficiency the
    estimator would otherwise take from assumptions.yaml.  Latest record wins.
    """
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
