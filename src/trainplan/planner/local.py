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
from trainplan.estimate.hardware import CpuRates, hardware_for_cpus, hardware_for_gpu, operator_rates
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


def amdahl_speedup(threads: float, parallel_fraction: float) -> float:
    """Amdahl's law (G. Amdahl, "Validity of the single processor approach to achieving large scale computing
    capabilities", AFIPS 1967): the speedup on ``threads`` of work whose ``parallel_fraction`` spreads over them."""
    return 1.0 / ((1.0 - parallel_fraction) + parallel_fraction / max(threads, 1.0))


def parallel_fraction(speedup: float, threads: float) -> float:
    """The parallel fraction that gives ``speedup`` on ``threads`` (Amdahl's law solved for it), within [0, 1]."""
    if threads <= 1 or speedup <= 0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - 1.0 / speedup) / (1.0 - 1.0 / threads)))


def measured_cpu_rates(profile: "HardwareProfile", vcpus: int | None = None) -> CpuRates | None:
    """This machine's cores as ``trainplan probe`` measured them, scaled to ``vcpus`` (default: as measured).

    The probe's figures are taken with ``t`` threads (``measure/microbench.py``: best ``n × n`` GEMM rate,
    STREAM-style copy; ``measure/cpu_rate.py``: element-wise rate, CPU runtime, thread scaling).

    * **Matmul rate of a training step on n vCPUs** (n = ``vcpus``, default t): when the probe measured the
      GEMM on one thread (``matmul_fp32_1thread``, R₁) and the speedup S of its reference training steps from
      1 to t threads (``cpu_step_scaling``), R(n) = R₁ × Amdahl(n, p), p the parallel fraction that gives S on t
      threads.  A training step of a small network does not scale as a large GEMM does (its kernels are short;
      dispatch and the per-parameter optimizer loop run on one core), so the 1024³ GEMM × n/t overstates what
      more cores buy.  bf16 is scaled by the same factor as fp32.  Without those two figures (an older profile,
      a one-core probe): the t-thread GEMM × n/t, as before.
    * **Element-wise rate**: the probe's at t threads, × Amdahl(n, p) / Amdahl(t, p) (× n/t without p).
    * **Copy bandwidth**: × n/t (each vCPU's share of the memory channels, the rule the catalog's spec follows).
    * **Per-operator overhead**: the probe's ``cpu_operator_overhead`` (dispatch runs on one core: not scaled),
      else the catalog's reference figure; the memory-bound operators' byte rate follows the element-wise rate
      (``estimate/hardware.py: operator_rates``); convolutions and fused recurrent layers run at the probe's
      ``cpu_conv_efficiency`` and ``cpu_rnn_efficiency`` × the matmul rate (else the catalog's reference figures).
    * **Peak** (the MFU denominator): the t-thread GEMM × n/t.

    The runtime overhead is the probe's ``cpu_runtime_overhead`` when it measured one.  None without a measured
    fp32 matmul rate or bandwidth.
    """
    fp32 = profile.figure("matmul_fp32")
    bw = profile.figure("memory_bandwidth")
    if not fp32 or not bw:
        return None
    threads = _probe_threads(profile)
    n = float(vcpus or threads)
    scale = n / threads
    one_thread, speedup = profile.figure("matmul_fp32_1thread"), profile.figure("cpu_step_scaling")
    p = parallel_fraction(speedup, threads) if one_thread and speedup and threads > 1 else None
    peak = [("fp32", fp32 * 1e12 * scale)]
    bf16 = profile.figure("matmul_bf16")
    if bf16:
        peak.append(("bf16", bf16 * 1e12 * scale))
    if p is not None:
        step_fp32 = one_thread * 1e12 * amdahl_speedup(n, p)
        matmul = [(dt, r * step_fp32 / peak[0][1]) for dt, r in peak]
        act_scale = amdahl_speedup(n, p) / amdahl_speedup(threads, p)
    else:
        matmul, act_scale = list(peak), scale
    overhead = profile.figure("cpu_runtime_overhead")
    catalog = get_catalog()
    act = profile.figure("activation_rate")  # GB/s; without it the catalog's per-core figure × threads
    act_t = act * 1e9 if act else catalog.assumption("cpu_activation_gb_s_per_core") * 1e9 * threads
    op_us = profile.figure("cpu_operator_overhead")  # µs; without it the catalog's reference figure
    op_us = op_us or catalog.assumption("cpu_operator_overhead_us")
    conv = profile.figure("cpu_conv_efficiency") or catalog.assumption("cpu_conv_efficiency")
    rnn = profile.figure("cpu_rnn_efficiency") or catalog.assumption("cpu_rnn_efficiency")
    scaled = f", scaled to {vcpus} vCPUs" if vcpus and vcpus != threads else ""
    rates = ", ".join(f"{dt} {r / 1e9:,.0f} GFLOP/s" for dt, r in matmul)
    scaling = (f"; a training step on {n:g} threads: 1-thread GEMM {one_thread * 1e3:.1f} GFLOP/s × Amdahl speedup "
               f"{amdahl_speedup(n, p):.2f} (parallel fraction {p:.2f} from the reference steps' {speedup:.2f}x on "
               f"{threads} threads)") if p is not None else ""  # fmt: skip
    return CpuRates(
        matmul=tuple(matmul),
        peak=tuple(peak),
        mem_bw_bytes_s=bw * 1e9 * scale,
        activation_bytes_s=act_t * act_scale,
        cores=n,
        source=(f"{profile.machine.get('cpu_model') or 'this CPU'}: measured by trainplan probe on {profile.host}, "
                f"{profile.date} ({threads} threads: GEMM {fp32 * 1e3:,.0f} GFLOP/s, copy {bw:.1f} GB/s, element-wise "
                f"{act_t / 1e9:.2f} GB/s{'' if act else ' (catalog per-core figure)'}, {op_us:.1f} us per operator, "
                f"convolutions at {conv:.2f} and recurrent layers at {rnn:.2f} x the GEMM rate{scaled}; matmul {rates}"
                f"{scaling})"),  # fmt: skip
        measured=True,
        runtime_overhead_bytes=overhead * GIB if overhead else None,
        conv_efficiency=conv,
        rnn_efficiency=rnn,
        **operator_rates(act_t * act_scale, op_us, catalog),
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
    probed = None
    if lookup is None and isinstance(job, TabularJob) and hw.accelerator is None:
        # no run of this library measured here yet: the rate `trainplan probe` measured on this machine, if any
        from trainplan.planner.this_machine import probed_tabular_rate

        probed = probed_tabular_rate(job, hardware_id=device_kind)
        if probed is not None:
            lookup = lambda _hw, rate=probed: rate  # noqa: E731
    est = make_estimator(job, catalog, efficiency_for=lookup)
    e = est(hw, None if isinstance(job, TabularJob) else Strategy.parse(strategy))
    if hw.accelerator is None and not isinstance(job, TabularJob) and e.rejection is not None \
            and e.rejection.kind not in (RejectKind.HOST_MEMORY,):
        return {"note": f"no CPU prediction for {strategy}: {e.reason}"}
    out: dict[str, Any] = {
        "step_time_s": None if isinstance(job, TabularJob) else e.step_time_s,
        "peak_gib": e.memory.peak / GIB,
        "train_s": e.train_s,
        "from_calibration": e.calibrated and probed is None,
        "note": e.reason or (f"{job.library.value} priced at the per-core rate trainplan probe measured on this machine "
                             f"({probed:.3g} ns per unit of work)" if probed is not None else None),
    }
    out["rows_per_s" if isinstance(job, TabularJob) else "tokens_per_s" if e.throughput_unit == "tokens_per_s" else "samples_per_s"] = e.throughput
    return out
