"""Predictions for a run on *this* machine (used by ``trainplan run`` to compare with what it measures),
and this machine's CPU cores as ``trainplan probe`` measured them (:func:`measured_cpu_rates`).

``planner.core`` is imported inside :func:`predict_run`: ``candidates`` uses the measured CPU rates, and
``core`` imports ``candidates``.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trainplan.catalog import Catalog, find_accelerator, get_catalog
from trainplan.estimate.hardware import CpuRates, hardware_for_cpus, hardware_for_gpu
from trainplan.estimate.memory import GIB
from trainplan.estimate.result import Hardware, RejectKind
from trainplan.spec import Job, KerasJob, Precision, TabularJob
from trainplan.strategies import Layout, Strategy

if TYPE_CHECKING:
    from trainplan.measure.profile import HardwareProfile


def _probe_threads(profile: "HardwareProfile") -> int:
    """Threads the probe's CPU matmul ran on (its method says ``N threads``), else the machine's usable cores."""
    m = profile.measurement("matmul_fp32")
    found = re.search(r"(\d+) threads", m.method) if m is not None else None
    return int(found.group(1)) if found else int(profile.machine.get("cpu_cores") or 1)


def measured_cpu_rates(profile: "HardwareProfile", vcpus: int | None = None) -> CpuRates | None:
    """This machine's cores as ``trainplan probe`` measured them, scaled to ``vcpus`` (default: as measured).

    Matmul rates (fp32, bf16) and the copy bandwidth are the probe's (``measure/microbench.py``: best
    ``n × n`` GEMM rate, STREAM-style copy), taken with ``t`` threads; ``vcpus`` other than ``t`` scale both
    by ``vcpus / t`` (each vCPU of this CPU adds its matmul units and its share of the memory channels, the
    rule the catalog's spec follows).  The runtime overhead is the probe's ``cpu_runtime_overhead`` when it
    measured one.  None without a measured fp32 matmul rate or bandwidth.
    """
    fp32 = profile.figure("matmul_fp32")
    bw = profile.figure("memory_bandwidth")
    if not fp32 or not bw:
        return None
    threads = _probe_threads(profile)
    scale = (vcpus or threads) / threads
    matmul = [("fp32", fp32 * 1e12 * scale)]
    bf16 = profile.figure("matmul_bf16")
    if bf16:
        matmul.append(("bf16", bf16 * 1e12 * scale))
    overhead = profile.figure("cpu_runtime_overhead")
    act = profile.figure("activation_rate")  # GB/s; without it the catalog's per-core figure × threads
    act_bytes_s = (act * 1e9 if act else get_catalog().assumption("cpu_activation_gb_s_per_core") * 1e9 * threads) * scale
    scaled = f", scaled to {vcpus} vCPUs" if vcpus and vcpus != threads else ""
    rates = ", ".join(f"{dt} {r / 1e9:,.0f} GFLOP/s" for dt, r in matmul)
    return CpuRates(
        matmul=tuple(matmul),
        peak=tuple(matmul),
        mem_bw_bytes_s=bw * 1e9 * scale,
        activation_bytes_s=act_bytes_s,
        cores=float(vcpus or threads),
        source=(f"{profile.machine.get('cpu_model') or 'this CPU'}: measured by trainplan probe on {profile.host}, "
                f"{profile.date} ({threads} threads: matmul {rates}, copy {bw:.1f} GB/s, element-wise "
                f"{act_bytes_s / scale / 1e9:.2f} GB/s{'' if act else ' (catalog per-core figure)'}{scaled})"),  # fmt: skip
        measured=True,
        runtime_overhead_bytes=overhead * GIB if overhead else None,
    )


def this_machine_cpu_rates(vcpus: int | None = None) -> tuple[CpuRates | None, str]:
    """The measured rates of this machine's cores (None when ``trainplan probe`` has not run here) and its CPU model."""
    from trainplan.measure.probe import cpu_model_name
    from trainplan.measure.profile import profile_for_this_machine

    profile = profile_for_this_machine()
    if profile is None:
        return None, cpu_model_name()
    return measured_cpu_rates(profile, vcpus), str(profile.machine.get("cpu_model") or cpu_model_name())


def cpus_hardware(vcpus: int, catalog: Catalog) -> Hardware:
    """``--cpus N``: N vCPUs priced at the catalog's cheapest rate per vCPU (with its RAM per vCPU), as fast as
    this machine's cores measured by ``trainplan probe``, else as the reference instance's CPU (cpus.csv)."""
    rates, model = this_machine_cpu_rates(vcpus)
    if rates is None:
        return hardware_for_cpus(vcpus, catalog)
    return hardware_for_cpus(vcpus, catalog, cpu=rates, cpu_model=model)


def with_measured_cpu(hw: Hardware, profile: "HardwareProfile | None" = None) -> Hardware:
    """``hw`` (this machine's option) with its cores' measured rates, when it has no GPU and a probe ran here."""
    if hw.accelerator is not None or hw.cpu is not None:
        return hw
    if profile is None:
        from trainplan.measure.profile import profile_for_this_machine

        profile = profile_for_this_machine()
    rates = measured_cpu_rates(profile) if profile is not None else None
    return replace(hw, cpu=rates) if rates is not None else hw


def local_cpu_hardware(cores: int, ram_gib: float = 0.0, *, cpu: CpuRates | None = None, cpu_model: str = "") -> Hardware:
    """This machine's CPUs as a (free, already running) option; ``cpu``: their rates for neural jobs."""
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
        cpu_model=cpu_model,
        cpu=cpu,
    )


def _predict_cpu_neural(job: Job, strategy: str, cores: int) -> tuple[Job, Hardware] | dict[str, Any]:
    """The job as ``trainplan run`` trains it on this CPU (fp32, ``run/api.py``) and this machine's cores; or a
    note when no prediction can be made."""
    from trainplan.measure.probe import host_memory_gib

    rates, model = this_machine_cpu_rates(cores)
    if rates is None:
        return {"note": f"no measured CPU rates for this machine ({model}): run `trainplan probe` once for a prediction"}
    if getattr(job, "precision", Precision.FP32) is not Precision.FP32:
        job = job.model_copy(update={"precision": Precision.FP32})
    return job, local_cpu_hardware(cores, host_memory_gib(), cpu=rates, cpu_model=model)


def predict_run(job: Job, strategy: str, devices: int, device_kind: str) -> dict[str, Any]:
    """Predicted step time, peak memory, throughput and training time of ``job`` on this machine.

    ``device_kind`` is the probe's hardware id: a canonical GPU id (``A100-80GB``)
    or ``cpu:<model>:<cores>``.  Figures the estimators cannot give are None,
    with a ``note`` saying why.
    """
    from trainplan.planner.calibrated import efficiency_lookup
    from trainplan.planner.core import make_estimator

    catalog = get_catalog()
    if device_kind.startswith("cpu") and isinstance(job, KerasJob):
        from trainplan.estimate.keras import keras_profile

        peak = keras_profile(job).trace["single_device_peak_gib"]  # type: ignore[index]
        return {"peak_gib": peak, "note": "keras on CPU: one replica's step as XLA assigns its buffers; no CPU time model"}
    if device_kind.startswith("cpu"):
        try:
            cores = int(device_kind.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            cores = 1
        if isinstance(job, TabularJob):
            hw = local_cpu_hardware(cores)
        else:  # a neural job on this CPU: the CPU time model over the probe's measurement (estimate/cpu.py)
            got = _predict_cpu_neural(job, strategy, cores)
            if isinstance(got, dict):
                return got
            job, hw = got
    else:
        acc = find_accelerator(device_kind, catalog)
        hw = hardware_for_gpu(acc, catalog, gpus=max(1, devices))
    lookup = efficiency_lookup(job, this_machine=device_kind)
    est = make_estimator(job, catalog, efficiency_for=lookup)
    e = est(hw, None if isinstance(job, TabularJob) else Strategy.parse(strategy))
    if hw.accelerator is None and not isinstance(job, TabularJob) and e.rejection is not None \
            and e.rejection.kind not in (RejectKind.HOST_MEMORY,):
        return {"note": f"no CPU prediction for {strategy}: {e.reason}"}
    out: dict[str, Any] = {
        "step_time_s": None if isinstance(job, TabularJob) else e.step_time_s,
        "peak_gib": e.memory.peak / GIB,
        "train_s": e.train_s,
        "from_calibration": e.calibrated,
        "note": e.reason,
    }
    out["rows_per_s" if isinstance(job, TabularJob) else "tokens_per_s" if e.throughput_unit == "tokens_per_s" else "samples_per_s"] = e.throughput
    return out
