"""Calibration store: what finished runs measured, on which hardware.

Each completed ``trainplan run`` appends one :class:`Calibration` to a JSON
file, ``$TRAINPLAN_HOME/calibrations.json`` (default
``~/.cache/trainplan/calibrations.json``).  The planner reads them with
:func:`load_calibrations` / :func:`lookup` and marks the options whose numbers
come from a measurement.

The file is rewritten atomically (temporary file + ``os.replace``) under an
advisory lock, so concurrent runs do not lose each other's records.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import MISSING, asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any, Iterator

from trainplan.errors import TrainplanError
from trainplan.files import trainplan_home, write_json_atomic

STORE_VERSION = 1
STORE_NAME = "calibrations.json"


def store_path() -> Path:
    """The calibration file."""
    return trainplan_home() / STORE_NAME


@dataclass(frozen=True)
class Calibration:
    """Figures one finished run measured.

    ``key`` is the strategy (``"ddp"``, ``"zero2"`` …) for neural jobs and the
    library (``"xgboost"``, ``"sklearn-hgb"`` …) for tabular ones.  Throughput
    is tokens/s for transformer jobs, samples/s for torch jobs and training
    rows/s for tabular jobs (``throughput_unit`` says which).
    """

    hardware_id: str
    kind: str  # JobKind value: "transformer" | "torch" | "tabular"
    key: str
    devices: int  # GPUs, or processes / parallel fits on CPU
    step_time_s: float | None
    throughput: float | None
    throughput_unit: str  # "tokens/s" | "samples/s" | "rows/s"
    peak_gib: float | None
    #: model FLOP/s per device (6·N + attention per token, PaLM App. B), transformer jobs
    achieved_tflops: float | None
    recorded_at: str  # ISO 8601, UTC
    host: str
    job_name: str
    run_dir: str
    #: tabular CPU jobs: ns per unit of work on one core, the unit of ``tabular_rates.csv``
    #: (:func:`trainplan.estimate.tabular.measured_ns_per_cell`)
    ns_per_cell: float | None = None
    #: the unit ``ns_per_cell`` is in (:func:`trainplan.estimate.tabular.tabular_work_unit`); a record in another
    #: unit — written before the cost model changed — is not applied
    work_unit: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if data["work_unit"] is None:  # as records were written before the field: old stores stay as they were
            del data["work_unit"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Calibration":
        names = {f.name for f in fields(cls)}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        missing = required - set(data)
        if missing:
            raise ValueError(f"missing {', '.join(sorted(missing))}")
        return cls(**{k: data[k] for k in names if k in data})


def _value(x: str | Enum) -> str:
    return x.value if isinstance(x, Enum) else str(x)


def _read(path: Path) -> list[Calibration]:
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data["calibrations"]
        return [Calibration.from_json(r) for r in rows]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise TrainplanError(
            f"calibration store is unreadable ({exc}); fix or delete it", source=str(path)
        ) from None


def load_calibrations() -> list[Calibration]:
    """Every stored calibration, oldest first."""
    return _read(store_path())


def lookup(hardware_id: str, kind: str | Enum, key: str | Enum) -> Calibration | None:
    """The most recent calibration for this hardware, job kind and strategy/library."""
    k, s = _value(kind), _value(key)
    matches = [c for c in load_calibrations() if c.hardware_id == hardware_id and c.kind == k and c.key == s]
    return max(matches, key=lambda c: c.recorded_at) if matches else None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_suffix(".lock")
    with open(lock, "a+") as fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except ImportError:  # Windows: no advisory locks; atomic replace still holds
            pass
        yield


def record_calibration(cal: Calibration) -> Path:
    """Append ``cal`` to the store; returns the store's path."""
    path = store_path()
    with _locked(path):
        rows = _read(path)
        rows.append(cal)
        write_json_atomic(path, {"version": STORE_VERSION, "calibrations": [r.to_json() for r in rows]})
    return path
