"""`plan` offers "this machine" with the figures the probe measured (planner/this_machine.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from trainplan import get_catalog, load_job, parse_job, plan_job
from trainplan.estimate.result import RejectKind
from trainplan.measure.microbench import Measurement
from trainplan.measure.probe import cpu_model_name, usable_cores
from trainplan.measure.profile import HardwareProfile, save_profile, this_host
from trainplan.planner.this_machine import (
    is_this_machine,
    measured_rate_lookup,
    this_machine_candidates,
    this_machine_hardware,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "trainplan" / "examples"


def profile(*, host: str | None = None, gpus: list[dict[str, Any]] | None = None, links: list[dict[str, Any]] | None = None,
            measured: dict[str, tuple[float, str]] | None = None) -> HardwareProfile:  # fmt: skip
    machine = {
        "cpu_model": cpu_model_name(), "cpu_cores": usable_cores(), "logical_cpus": usable_cores(), "memory_gib": 64.0,
        "accelerator": "cuda" if gpus else "cpu", "gpus": gpus or [], "nvml": {"links": links or []},
    }  # fmt: skip
    ms = tuple(Measurement(name, value, unit_of(name), device, "test") for name, (value, device) in (measured or {}).items())
    return HardwareProfile(recorded_at="2026-12-03T08:00:00+00:00", host=host or this_host(), hardware_id="test",
                           machine=machine, measurements=ms)  # fmt: skip


def unit_of(name: str) -> str:
    from trainplan.measure.microbench import tabular_rate_unit

    return tabular_rate_unit(name.removeprefix("tabular_")) if name.startswith("tabular_") else ""


def mine(plan: Any) -> list[Any]:
    return [e for e in plan.options + plan.rejected if is_this_machine(e.hardware)]


def test_no_profile_no_option() -> None:
    plan = plan_job(load_job(EXAMPLES / "xgboost-10m.yaml"))
    assert mine(plan) == []


def test_tabular_job_uses_measured_rate_and_says_so() -> None:
    job = load_job(EXAMPLES / "xgboost-10m.yaml")
    save_profile(profile(measured={"tabular_xgboost": (5.0, "cpu")}))
    plain = plan_job(job)
    (e,) = mine(plain)
    assert e.fits and e.cost_usd == 0.0 and e.hardware.label == "local:this-machine"
    assert e.hardware.vcpus_per_node == usable_cores() and e.capacity_gib == 64.0
    assert "measured by trainplan probe 2026-12-03" in e.to_dict()["price_note"]
    measured = plan_job(job, efficiency_for=measured_rate_lookup(job))
    (m,) = mine(measured)
    assert m.calibrated and not e.calibrated
    catalog_rate = get_catalog().tabular_rates[("xgboost", "cpu")].ns_per_cell
    def work(x):  # the part the per-core rate prices (the threads' synchronisation is not a rate)
        return x.time_breakdown["fit_s"] - x.time_breakdown.get("thread_sync_s", 0.0)

    assert work(m) / work(e) == pytest.approx(5.0 / catalog_rate)
    # other options keep their own (catalog) rates
    others = {(x.hardware.label, x.strategy): x.train_s for x in plain.options if not is_this_machine(x.hardware)}
    assert all(others[(x.hardware.label, x.strategy)] == x.train_s for x in measured.options if not is_this_machine(x.hardware))


def test_a_rate_probed_under_the_earlier_cost_model_is_not_applied() -> None:
    """XGBoost's probe rate was ns per cell of the one-rate model (unit "ns/cell") before the per-term model: in the
    new unit it would price this machine ~5× too slow, so it is left out until the machine is probed again."""
    job = load_job(EXAMPLES / "xgboost-10m.yaml")
    old = profile(measured={"tabular_xgboost": (2.5, "cpu")})
    old = replace(old, measurements=tuple(replace(m, unit="ns/cell") for m in old.measurements))
    assert measured_rate_lookup(job, old) is None
    new = profile(measured={"tabular_xgboost": (2.5, "cpu")})
    assert measured_rate_lookup(job, new)(this_machine_hardware(new, get_catalog())) == 2.5


def test_a_run_here_is_predicted_at_the_probed_rate_until_a_run_calibrates_it() -> None:
    """`trainplan run` of a tabular job on this machine prices it at the rate `trainplan probe` measured here (when no
    earlier run of the library is in the calibration store), and says so; another CPU keeps the catalog's rate."""
    from trainplan.estimate.tabular import estimate_tabular
    from trainplan.measure.probe import cpu_hardware_id
    from trainplan.planner.local import local_cpu_hardware, predict_run

    job = parse_job({"kind": "tabular", "library": "xgboost", "rows": 100_000, "features": 20, "trees": 50})
    here = cpu_hardware_id(cpu_model_name(), usable_cores())
    catalog_s = predict_run(job, "cpu", 1, here)["train_s"]
    save_profile(profile(measured={"tabular_xgboost": (5.0, "cpu")}))
    probed = predict_run(job, "cpu", 1, here)
    expected = estimate_tabular(job, local_cpu_hardware(usable_cores()), get_catalog(), ns_per_cell=5.0)
    assert probed["train_s"] == pytest.approx(expected.train_s) and probed["train_s"] != pytest.approx(catalog_s)
    assert probed["from_calibration"] is False and "trainplan probe measured on this machine" in probed["note"]
    other = predict_run(job, "cpu", 1, "cpu:Other CPU:2")
    assert other["train_s"] == pytest.approx(estimate_tabular(job, local_cpu_hardware(2), get_catalog()).train_s)
    assert other["note"] is None
    lightgbm = parse_job({"kind": "tabular", "library": "lightgbm", "rows": 100_000, "features": 20, "trees": 50})
    assert predict_run(lightgbm, "cpu", 1, here)["note"] is None  # no probed rate for that library


def test_profile_of_another_host_is_not_used() -> None:
    save_profile(profile(host="some-other-host", measured={"tabular_xgboost": (5.0, "cpu")}))
    assert mine(plan_job(load_job(EXAMPLES / "xgboost-10m.yaml"))) == []


def test_neural_job_on_cpus_is_one_option_on_the_cpus() -> None:
    save_profile(profile())
    (e,) = mine(plan_job(load_job(EXAMPLES / "llama7b-sft.yaml")))
    assert e.strategy == "single" and e.hardware.accelerator is None and e.devices == 1
    assert e.fits or (e.rejection is not None and e.rejection.kind is not RejectKind.LAYOUT and e.reason)


def test_jobs_without_local_clouds_skip_it() -> None:
    save_profile(profile())
    job = parse_job({"kind": "tabular", "library": "xgboost", "rows": 1000, "features": 4, "constraints": {"clouds": ["aws"]}})
    assert list(this_machine_candidates(job, get_catalog())) == []


A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_gib": 79.15, "canonical_id": "A100-80GB"}


def test_two_known_gpus_take_measured_memory_bandwidth_and_nvlink() -> None:
    cat = get_catalog()
    p = profile(gpus=[A100, A100], links=[{"a": 0, "b": 1, "kind": "nvlink", "nvlinks": 12}],
                measured={"device_memory_bandwidth": (1600.0, "cuda:0"), "allreduce_bus_bandwidth": (150.0, "cuda:0-1"),
                          "matmul_bf16_cuda": (250.0, "cuda:0")})  # fmt: skip
    hw = this_machine_hardware(p, cat)
    acc = hw.accelerator
    assert acc is not None and acc.id == "A100-80GB" and hw.layout.world_size == 2
    assert acc.memory_gib == 79.15
    assert acc.mem_bandwidth_gb_s == pytest.approx(1600.0 / cat.assumption("mem_bw_efficiency"))
    assert acc.peak_bf16_tflops == cat.accelerators["A100-80GB"].peak_bf16_tflops  # datasheet: efficiencies are fractions of it
    assert "measured matmul bf16 250 TFLOP/s" in acc.source
    assert hw.intra_node_bw_gb_s == pytest.approx(150.0 / cat.assumption("comm_bw_efficiency"))
    assert hw.instance is not None and hw.instance.interconnect == "nvlink"
    job = load_job(EXAMPLES / "llama7b-sft.yaml")
    strategies = {s.value for _, s in this_machine_candidates(job, cat, p)}
    assert {"ddp", "zero2", "zero3", "fsdp"} <= strategies
    save_profile(p)
    fitting = [e for e in mine(plan_job(job)) if e.fits]
    assert fitting and all(e.devices == 2 and e.capacity_gib == 79.15 for e in fitting)


def test_unknown_gpu_takes_measured_peaks() -> None:
    gpu = {"name": "NVIDIA Future GPU", "memory_gib": 40.0, "canonical_id": "gpu:NVIDIA-Future-GPU"}
    p = profile(gpus=[gpu], measured={"device_memory_bandwidth": (800.0, "cuda:0"), "matmul_bf16_cuda": (120.0, "cuda:0"),
                                      "matmul_fp32_cuda": (15.0, "cuda:0")})  # fmt: skip
    acc = this_machine_hardware(p, get_catalog()).accelerator
    assert acc is not None and acc.id == "gpu:NVIDIA-Future-GPU"
    assert (acc.peak_bf16_tflops, acc.peak_fp32_tflops, acc.peak_fp16_tflops) == (120.0, 15.0, None)
    # without measurements an unknown GPU cannot be estimated: the CPU-only machine is offered instead
    assert this_machine_hardware(profile(gpus=[gpu]), get_catalog()).accelerator is None
