"""Predictions for a run on *this* machine (used by ``trainplan run`` to compare with what it measures)."""

from __future__ import annotations

from typing import Any

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.estimate.memory import GIB
from trainplan.estimate.result import Hardware
from trainplan.planner.calibrated import efficiency_lookup
from trainplan.planner.candidates import hardware_for_gpu
from trainplan.planner.core import make_estimator
from trainplan.spec import Job, KerasJob, TabularJob
from trainplan.strategies import Layout, Strategy


def local_cpu_hardware(cores: int, ram_gib: float = 0.0) -> Hardware:
    """This machine's CPUs as a (free, already running) option."""
    return Hardware(
        layout=Layout(1, 1),
        accelerator=None,
        instance=None,
        price_usd_per_h_per_node=0.0,
        price_note="this machine",
        vcpus_per_node=cores,
        ram_gib_per_node=ram_gib or 1e6,
        intra_node_bw_gb_s=None,
        network_gbps=None,
        cloud="local",
        terms=None,
    )


def predict_run(job: Job, strategy: str, devices: int, device_kind: str) -> dict[str, Any]:
    """Predicted step time, peak memory, throughput and training time of ``job`` on this machine.

    ``device_kind`` is the probe's hardware id: a canonical GPU id (``A100-80GB``)
    or ``cpu:<model>:<cores>``.  Figures the estimators cannot give are None,
    with a ``note`` saying why.
    """
    catalog = get_catalog()
    if device_kind.startswith("cpu") and isinstance(job, KerasJob):
        from trainplan.estimate.keras import keras_profile

        peak = keras_profile(job).trace["single_device_peak_gib"]  # type: ignore[index]
        return {"peak_gib": peak, "note": "keras on CPU: one replica's step as XLA assigns its buffers; no CPU time model"}
    if device_kind.startswith("cpu"):
        if not isinstance(job, TabularJob):
            return {"note": "no CPU throughput model for neural jobs (trainplan plans them on accelerators)"}
        try:
            cores = int(device_kind.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            cores = 1
        hw = local_cpu_hardware(cores)
    else:
        acc = find_accelerator(device_kind, catalog)
        hw = hardware_for_gpu(acc, catalog, gpus=max(1, devices))
    lookup = efficiency_lookup(job, this_machine=device_kind)
    est = make_estimator(job, catalog, efficiency_for=lookup)
    e = est(hw, None if isinstance(job, TabularJob) else Strategy.parse(strategy))
    out: dict[str, Any] = {
        "step_time_s": None if isinstance(job, TabularJob) else e.step_time_s,
        "peak_gib": e.memory.peak / GIB,
        "train_s": e.train_s,
        "from_calibration": e.calibrated,
        "note": e.reason,
    }
    out["rows_per_s" if isinstance(job, TabularJob) else "tokens_per_s" if e.throughput_unit == "tokens_per_s" else "samples_per_s"] = e.throughput
    return out
