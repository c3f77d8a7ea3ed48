"""Measurement: probe the local hardware, track peak memory, keep calibrations.

* :mod:`trainplan.measure.probe` — what this machine is (CPU model and cores,
  GPUs) and a stable ``hardware_id`` for it.
* :mod:`trainplan.measure.memory` — peak memory of a training process.
* :mod:`trainplan.measure.calibration` — measured figures of finished runs,
  stored under ``$TRAINPLAN_HOME`` for the planner to use.
"""

from trainplan.measure.calibration import Calibration, load_calibrations, lookup, record_calibration
from trainplan.measure.probe import Hardware, canonical_gpu_id, probe_hardware

__all__ = [
    "Calibration",
    "Hardware",
    "canonical_gpu_id",
    "load_calibrations",
    "lookup",
    "probe_hardware",
    "record_calibration",
]
