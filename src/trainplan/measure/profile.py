"""The hardware profile: what ``trainplan probe`` found and measured on this machine, kept for the planner.

Stored as ``$TRAINPLAN_HOME/hardware_profile.json`` (the home of the
calibration store, :func:`trainplan.files.trainplan_home`),
rewritten atomically.  One file describes one machine: it names the host and
the probe's ``hardware_id``, and :func:`profile_for_this_machine` uses it only
when both still match — a home directory shared between machines never lends
one machine's figures to another.
"""

from __future__ import annotations

import math
import platform
import socket
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainplan.errors import TrainplanError
from trainplan.files import write_json_atomic
from trainplan.measure.calibration import trainplan_home
from trainplan.measure.microbench import Measurement, Progress, plan_benchmarks, run_benchmarks
from trainplan.measure.probe import cpu_hardware_id, cpu_model_name, describe_machine, usable_cores

PROFILE_VERSION = 1
PROFILE_NAME = "hardware_profile.json"
_REQUIRED = ("version", "recorded_at", "host", "hardware_id", "machine", "measurements")


def profile_path() -> Path:
    """Where the hardware profile lives."""
    return trainplan_home() / PROFILE_NAME


def this_host() -> str:
    return socket.gethostname() or platform.node() or "unknown"


@dataclass(frozen=True)
class HardwareProfile:
    """This machine as the probe saw it (``machine``: :meth:`MachineDescription.to_dict`) and what it measured."""

    recorded_at: str  # ISO 8601, UTC
    host: str
    hardware_id: str
    machine: dict[str, Any]
    measurements: tuple[Measurement, ...]
    seconds: float = 0.0  # wall time of the whole probe
    version: int = PROFILE_VERSION

    def figure(self, name: str) -> float | None:
        """A measured value by name (``"matmul_fp32"``, ``"memory_bandwidth"`` …), None when not measured."""
        return next((m.value for m in self.measurements if m.name == name and m.value is not None), None)

    def measurement(self, name: str) -> Measurement | None:
        return next((m for m in self.measurements if m.name == name), None)

    @property
    def date(self) -> str:
        return self.recorded_at[:10]

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "recorded_at": self.recorded_at,
            "host": self.host,
            "hardware_id": self.hardware_id,
            "seconds": self.seconds,
            "machine": self.machine,
            "measurements": [m.to_dict() for m in self.measurements],
        }

    @classmethod
    def from_json(cls, data: Any) -> "HardwareProfile":
        """Read and check a stored profile; raises ``ValueError`` naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        if data["version"] != PROFILE_VERSION:
            raise ValueError(f"version {data['version']!r}, this trainplan reads version {PROFILE_VERSION}")
        rows = data["measurements"]
        if not isinstance(rows, list) or not isinstance(data["machine"], dict):
            raise ValueError("measurements must be a list and machine an object")
        ms = []
        for row in rows:
            m = Measurement(**row)
            if m.value is not None and not (isinstance(m.value, (int, float)) and math.isfinite(m.value) and m.value > 0):
                raise ValueError(f"{m.name}: value must be a positive number or null, got {m.value!r}")
            ms.append(m)
        return cls(
            recorded_at=str(data["recorded_at"]),
            host=str(data["host"]),
            hardware_id=str(data["hardware_id"]),
            machine=data["machine"],
            measurements=tuple(ms),
            seconds=float(data.get("seconds", 0.0)),
            version=int(data["version"]),
        )


def run_probe(*, progress: Progress | None = None, tabular: bool = True, allreduce: bool = True,
              quick: bool = False) -> HardwareProfile:  # fmt: skip
    """Describe this machine and measure it (about a minute on a 2-core machine); nothing is saved."""
    import time

    t0 = time.perf_counter()
    desc = describe_machine()
    view = desc.torch
    benches = plan_benchmarks(cuda_devices=view.cuda_devices, bf16=view.bf16_supported, torch_installed=view.installed,
                              tabular=tabular, allreduce=allreduce, quick=quick)  # fmt: skip
    measured = run_benchmarks(benches, progress)
    return HardwareProfile(
        recorded_at=datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
        host=this_host(),
        hardware_id=desc.hardware.hardware_id,
        machine=desc.to_dict(),
        measurements=tuple(measured),
        seconds=time.perf_counter() - t0,
    )


def save_profile(profile: HardwareProfile, path: Path | None = None) -> Path:
    """Write ``profile`` (atomically) to ``path`` or :func:`profile_path`; returns where."""
    target = path or profile_path()
    write_json_atomic(target, profile.to_json())
    return target


def load_profile(path: Path | None = None) -> HardwareProfile | None:
    """The stored profile, None when there is none; an unreadable one is a one-line :class:`TrainplanError`."""
    import json

    target = path or profile_path()
    if not target.exists():
        return None
    try:
        return HardwareProfile.from_json(json.loads(target.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError, ValueError) as exc:
        msg = str(exc).splitlines()[0]
        raise TrainplanError(f"hardware profile is unreadable ({msg}); run `trainplan probe` again or delete it",
                             source=str(target)) from None  # fmt: skip


def profile_for_this_machine(path: Path | None = None) -> HardwareProfile | None:
    """The stored profile if it was made on this host and its CPU still matches; else None.

    The check is cheap (no torch import): host name, CPU model and usable cores.  A GPU machine's
    ``hardware_id`` names its GPU, so there the CPU part is compared with the profile's own CPU fields.
    """
    prof = load_profile(path)
    if prof is None or prof.host != this_host():
        return None
    cpu_id = cpu_hardware_id(cpu_model_name(), usable_cores())
    recorded = cpu_hardware_id(str(prof.machine.get("cpu_model", "")), int(prof.machine.get("cpu_cores", 0) or 0))
    return prof if recorded == cpu_id else None
