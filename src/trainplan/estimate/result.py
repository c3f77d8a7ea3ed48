"""Typed results shared by every estimator, and the hardware an estimate is for."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainplan.catalog import Accelerator, CloudTerms, Instance
from trainplan.estimate.memory import GIB, MemoryBreakdown
from trainplan.strategies import Layout


@dataclass(frozen=True)
class Hardware:
    """What an option runs on: an instance type (× nodes), or a bare accelerator/CPU count."""

    layout: Layout
    accelerator: Accelerator | None  # None: CPU only
    instance: Instance | None  # None when named by --gpu/--cpus without an instance
    price_usd_per_h_per_node: float
    price_note: str
    vcpus_per_node: int
    ram_gib_per_node: float
    intra_node_bw_gb_s: float | None
    network_gbps: float | None
    cloud: str
    terms: CloudTerms | None
    cpu_model: str = ""

    @property
    def label(self) -> str:
        if self.instance is not None:
            base = f"{self.instance.cloud}:{self.instance.name}"
        elif self.accelerator is not None:
            base = f"{self.layout.gpus_per_node}x{self.accelerator.id}"
        else:
            base = f"{self.vcpus_per_node} vCPU"
        return base if self.layout.nodes == 1 else f"{self.layout.nodes}x {base}"


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


@dataclass(frozen=True)
class Estimate:
    """Everything trainplan predicts for one (job, hardware, strategy)."""

    kind: str
    strategy: str  # a Strategy value, or "cpu"/"gpu" engine names for tabular jobs
    hardware: Hardware
    fits: bool
    reason: str | None
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

    @property
    def hours(self) -> float:
        return (self.train_s + self.startup_s) / 3600.0

    @property
    def devices(self) -> int:
        return self.hardware.layout.world_size

    def to_dict(self) -> dict[str, Any]:
        hw = self.hardware
        m = self.memory
        d: dict[str, Any] = {
            "kind": self.kind,
            "fits": self.fits,
            "strategy": self.strategy,
            "accelerator": hw.accelerator.id if hw.accelerator else None,
            "count": hw.layout.gpus_per_node if hw.accelerator else 0,
            "nodes": hw.layout.nodes,
            "instance": hw.instance.name if hw.instance else None,
            "cloud": hw.cloud,
            "vcpus": hw.vcpus_per_node,
            "memory": {
                "peak_gib": m.peak / GIB,
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
            "hint": self.hint,
            "notes": list(self.notes),
        }
        if self.trace is not None:
            d["trace"] = dict(self.trace)
        return d
