"""The planner's prediction for the option a run uses, behind a small adapter.

``trainplan.planner.predict_run(job, strategy, devices, device_kind) -> dict``
gives ``step_time_s``, ``peak_gib``, ``tokens_per_s``, ``rows_per_s`` or
``samples_per_s`` (reported as ``rows_per_s``: samples are a torch job's rows) and
``train_s`` (each may be None).  When the planner is not installed, or cannot
price this option, every figure is None and the reason is kept.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from trainplan.errors import TrainplanError

FIGURES = ("step_time_s", "peak_gib", "tokens_per_s", "rows_per_s", "train_s", "final_loss")


@dataclass(frozen=True)
class Prediction:
    """Predicted figures of one option (None where unknown)."""

    step_time_s: float | None = None
    peak_gib: float | None = None
    tokens_per_s: float | None = None
    rows_per_s: float | None = None
    train_s: float | None = None
    final_loss: float | None = None  # never predicted; kept so both sides have the same keys
    from_calibration: bool = False
    note: str | None = None

    def figures(self) -> dict[str, float | None]:
        return {k: getattr(self, k) for k in FIGURES}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def predict(job: Any, strategy: str, devices: int, device_kind: str) -> Prediction:
    """Ask the planner for this option; None-filled when it is absent or cannot say.

    ``device_kind`` is the machine's hardware id (``"A100-80GB"``,
    ``"cpu:<model>:<cores>"``; see :attr:`trainplan.measure.probe.Hardware.hardware_id`).
    """
    if getattr(job, "kind", None) is not None and job.kind.value == "script":
        return Prediction(note="the job describes no model (kind: script): nothing is predicted")
    try:
        from trainplan.planner import predict_run
    except ImportError:
        return Prediction(note="planner not available: no prediction")
    try:
        raw = predict_run(job, strategy, devices, device_kind)
    except TrainplanError as exc:
        return Prediction(note=f"no prediction: {exc}")
    if not isinstance(raw, dict):
        return Prediction(note=f"planner returned {type(raw).__name__}, not a dict")
    figures = {k: _number(raw.get(k)) for k in FIGURES if k != "final_loss"}
    if figures["rows_per_s"] is None:  # torch jobs: the planner says samples/s, the summary rows/s
        figures["rows_per_s"] = _number(raw.get("samples_per_s"))
    return Prediction(
        **figures,
        from_calibration=bool(raw.get("from_calibration", False)),
        note=raw.get("note"),
    )


def relative_error(measured: float | None, predicted: float | None) -> float | None:
    """``(predicted - measured) / measured``: +0.10 means the prediction was 10 % high."""
    if measured is None or predicted is None or measured == 0:
        return None
    return (predicted - measured) / measured
