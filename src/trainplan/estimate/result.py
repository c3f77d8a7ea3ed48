"""Typed results shared by every estimator: the estimate, its typed rejection, job time and cost."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from trainplan.catalog import CloudTerms
from trainplan.estimate.energy import Energy
from trainplan.estimate.hardware import Hardware
from trainplan.estimate.memory import GIB, MemoryBreakdown


def billed_seconds(seconds: float, terms: CloudTerms | None) -> float:
    """Seconds a cloud bills for ``seconds`` of use: its minimum, rounded up to its increment."""
    if terms is None:
        return seconds
    s = max(seconds, terms.billing_minimum_s)
    if terms.billing_increment_s > 0:
        s = math.ceil(s / terms.billing_increment_s - 1e-9) * terms.billing_increment_s
    return s


@dataclass(frozen=True)
class Timing:
    """Whole-job time and cost from steps × step time, the cloud's start-up and its billing terms."""

    train_s: float
    startup_s: float
    cost_usd: float


def job_timing(hw: Hardware, *, train_s: float) -> Timing:
    """Start-up is billed too; cost = billed seconds × price × nodes (inf when the time is unknown)."""
    startup = hw.terms.startup_s if hw.terms else 0.0
    if train_s == float("inf"):
        return Timing(train_s, startup, float("inf"))
    billed = billed_seconds(train_s + startup, hw.terms)
    return Timing(train_s, startup, billed / 3600.0 * hw.price_usd_per_h_per_node * hw.layout.nodes)


class RejectKind(str, Enum):
    """Why an option was rejected: what the planner sorts and explains by (never by the text)."""

    NO_DEVICE = "no-device"  # the job needs a device kind this option lacks (an accelerator, a CUDA GPU)
    LAYOUT = "layout"  # strategy and device count do not go together
    PRECISION = "precision"  # the device has no units for the job's precision
    PLATFORM = "platform"  # the software stack does not run there (DeepSpeed on TPU, bitsandbytes off CUDA)
    MISSING_FIGURE = "missing-figure"  # the catalog lacks a figure the estimate needs (a bandwidth, a peak)
    BATCH = "batch"  # the global batch does not divide over the devices
    DEVICE_MEMORY = "device-memory"  # the step does not fit in one device's memory
    HOST_MEMORY = "host-memory"  # host RAM (offload, tabular data) does not suffice
    WASTE = "waste"  # it would run, but leaves hardware idle (a tabular job on 8 GPUs)
    DEADLINE = "deadline"  # a job constraint: takes longer than the deadline
    BUDGET = "budget"  # a job constraint: costs more than the budget


@dataclass(frozen=True)
class Rejection:
    """A typed reason: its kind, the numbers behind it (``needed`` vs ``available`` in ``unit``), and its text."""

    kind: RejectKind
    text: str
    needed: float | None = None
    available: float | None = None
    unit: str = ""

    @property
    def ratio(self) -> float | None:
        """needed / available, where both are known (how far from fitting)."""
        if self.needed is None or not self.available:
            return None
        return self.needed / self.available

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "needed": self.needed, "available": self.available, "unit": self.unit}


@dataclass(frozen=True)
class Estimate:
    """Everything trainplan predicts for one (job, hardware, strategy)."""

    kind: str
    strategy: str  # a Strategy value, or "cpu"/"gpu" engine names for tabular jobs
    hardware: Hardware
    rejection: Rejection | None  # None: the option fits
    memory: MemoryBreakdown
    capacity_gib: float  # per device (GPU memory, or host RAM for CPU jobs)
    step_time_s: float
    steps: int
    train_s: float
    startup_s: float
    cost_usd: float
    throughput: float  # tokens/s (neural) or samples/s (tabular), whole job
    throughput_unit: str  # "tokens_per_s" | "samples_per_s"
    mfu: float | None
    params: int | None = None
    trainable_params: int | None = None
    flops_per_step: float | None = None  # per device, per optimizer step (hardware FLOPs)
    time_breakdown: dict[str, float] = field(default_factory=dict)
    hint: str | None = None  # what would make a rejected option fit
    calibrated: bool = False  # efficiency or rate from a measured run
    notes: tuple[str, ...] = ()
    trace: dict[str, Any] | None = None  # what tracing the real model found (params, FLOPs, single-device peak)
    # the estimator's measured peak-memory error, as measured / predicted − 1: a real run's peak lands up to
    # memory_band above the estimate and up to memory_band_below under it (None: not known; below None: the same)
    memory_band: float | None = None
    memory_band_below: float | None = None
    energy: Energy | None = None  # kWh and kg CO2e of the whole job (estimate/energy.py); the planner attaches it

    @property
    def energy_kwh(self) -> float:
        """Facility kWh of the job (inf when unknown, so that it ranks last)."""
        return self.energy.kwh if self.energy is not None and self.energy.kwh is not None else float("inf")

    @property
    def co2_kg(self) -> float:
        """kg CO2e of the job (inf when unknown, so that it ranks last)."""
        return self.energy.co2_kg if self.energy is not None and self.energy.co2_kg is not None else float("inf")

    @property
    def margin_bytes(self) -> float:
        """Capacity left at the peak (negative: short by that much)."""
        return self.capacity_gib * GIB - self.memory.peak

    @property
    def margin_fraction(self) -> float | None:
        return self.margin_bytes / (self.capacity_gib * GIB) if self.capacity_gib else None

    @property
    def borderline(self) -> bool:
        """The capacity lies within the estimator's error band of the peak: the verdict could go either way.

        A run whose estimate is P peaks between P·(1 − below) and P·(1 + band) (4 in 5 runs out of sample for the
        analytic band); borderline when the capacity falls in that range."""
        if self.memory_band is None or not self.capacity_gib:
            return False
        capacity = self.capacity_gib * GIB
        return self.memory.peak * (1.0 - self._band_below) <= capacity <= self.memory.peak * (1.0 + self.memory_band)

    @property
    def _band_below(self) -> float | None:
        return self.memory_band if self.memory_band_below is None else self.memory_band_below

    @property
    def band_text(self) -> str:
        """"±10%", or "−25% … +31% of the estimate" when the band is not symmetric."""
        below = self._band_below
        if self.memory_band is None or below is None or abs(below - self.memory_band) < 0.005:
            return f"±{self.memory_band or 0:.0%}"
        return f"−{below:.0%} … +{self.memory_band:.0%} of the estimate"

    def memory_verdict(self) -> str:
        """"fits, 6.1 GiB (8%) to spare", or why it is borderline, in one phrase."""
        frac = self.margin_fraction
        if frac is None:
            return "capacity unknown"
        gib = abs(self.margin_bytes) / GIB
        head = f"{gib:.1f} GiB ({abs(frac):.0%}) to spare" if frac >= 0 else f"short by {gib:.1f} GiB ({abs(frac):.0%})"
        if self.borderline:
            text = f"borderline: {head}, within the estimator's measured error band ({self.band_text})"
        else:
            text = f"fits, {head}" if frac >= 0 else f"does not fit, {head}"
        # on CPUs host RAM is the device memory: its rejection is the memory verdict itself
        memory_kinds = (RejectKind.DEVICE_MEMORY,) + ((RejectKind.HOST_MEMORY,) if self.hardware.accelerator is None else ())
        if self.rejection is not None and self.rejection.kind not in memory_kinds:
            # the memory figure is still worth showing, but it must not read as the option's verdict
            text = f"memory {text}; the option is rejected for another reason ({self.rejection.kind.value})"
        return text

    @property
    def fits(self) -> bool:
        return self.rejection is None

    @property
    def reason(self) -> str | None:
        return self.rejection.text if self.rejection else None

    @property
    def hours(self) -> float:
        return (self.train_s + self.startup_s) / 3600.0

    @property
    def devices(self) -> int:
        return self.hardware.layout.world_size

    @property
    def setup(self) -> str:
        """The strategy, with the model-parallel degrees when the layout splits the model (``fsdp tp8·pp8·dp8+sp``)."""
        layout = self.hardware.layout
        return f"{self.strategy} {layout.describe()}" if layout.model_parallel else self.strategy

    def _parallel(self) -> dict[str, Any] | None:
        """The layout's degrees (neural jobs on accelerators; None for tabular and CPU options)."""
        from trainplan.strategies import Strategy

        if self.kind == "tabular" or self.hardware.accelerator is None:
            return None
        try:
            strategy = Strategy(self.strategy)
        except ValueError:
            return None
        return self.hardware.layout.to_dict(strategy)

    def to_dict(self) -> dict[str, Any]:
        hw = self.hardware
        m = self.memory
        d: dict[str, Any] = {
            "kind": self.kind,
            "fits": self.fits,
            "strategy": self.strategy,
            "parallel": self._parallel(),
            "accelerator": hw.accelerator.id if hw.accelerator else None,
            "count": hw.layout.gpus_per_node if hw.accelerator else 0,
            "nodes": hw.layout.nodes,
            "instance": hw.instance.name if hw.instance else None,
            "cloud": hw.cloud,
            "vcpus": hw.vcpus_per_node,
            "memory": {
                "peak_gib": m.peak / GIB,
                "allocated_gib": m.allocated / GIB,
                "reserved_gib": m.reserved / GIB,
                "reserved_expandable_gib": m.reserved_expandable / GIB,
                "context_gib": m.context / GIB,
                "weights_gib": m.weights / GIB,
                "gradients_gib": m.gradients / GIB,
                "optimizer_gib": m.optimizer / GIB,
                "activations_gib": m.activations / GIB,
                "overhead_gib": m.overhead / GIB,
                "host_gib": m.host / GIB,
                "capacity_gib": self.capacity_gib,
                "peak_phase": m.phase,
            },
            "step_time_s": self.step_time_s,
            "steps": self.steps,
            self.throughput_unit: self.throughput,
            "train_s": self.train_s,
            "startup_s": self.startup_s,
            "mfu": self.mfu,
            "hours": self.hours,
            "cost_usd": self.cost_usd,
            "price_usd_per_h": hw.price_usd_per_h_per_node * hw.layout.nodes,
            "price_note": hw.price_note,
            "params": self.params,
            "trainable_params": self.trainable_params,
            "flops_per_step": self.flops_per_step,
            "time_breakdown_s": dict(self.time_breakdown),
            "calibrated": self.calibrated,
            "reason": self.reason,
            "rejection": self.rejection.to_dict() if self.rejection else None,
            "memory_verdict": {
                "margin_gib": self.margin_bytes / GIB,
                "margin_fraction": self.margin_fraction,
                "band": self.memory_band,
                "band_below": self._band_below,
                "borderline": self.borderline,
                "verdict_on": "reserved + context",
                "text": self.memory_verdict(),
            },
            "hint": self.hint,
            "notes": list(self.notes),
            "energy_kwh": self.energy.kwh if self.energy else None,
            "co2_kg": self.energy.co2_kg if self.energy else None,
            "energy": self.energy.to_dict() if self.energy else None,
        }
        if self.trace is not None:
            d["trace"] = dict(self.trace)
        return d
