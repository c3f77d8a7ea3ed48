"""Hardware probe, peak memory, and the calibration store."""

from __future__ import annotations

import mmap

import pytest

from trainplan.errors import TrainplanError
from trainplan.measure.calibration import Calibration, load_calibrations, lookup, record_calibration, store_path
from trainplan.measure.memory import PeakMemory
from trainplan.measure.probe import Accelerator, GpuInfo, Hardware, canonical_gpu_id, probe_hardware


@pytest.mark.parametrize(
    "name,gib,expected",
    [
        ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 39.4, "A100-40GB"),
        ("NVIDIA H100 80GB HBM3", 79.6, "H100-80GB"),
        ("NVIDIA H200", 139.8, "H200"),  # nvidia-smi and torch on the H200 this project measured on
        ("NVIDIA H100 PCIe", 79.6, "H100-PCIe"),
        ("NVIDIA H100 NVL", 93.6, "H100-NVL"),
        ("NVIDIA B200", 178.4, "B200"),
        ("NVIDIA B300 SXM6 AC", 268.6, "B300"),  # the names public nvidia-smi logs print (2026-12-06)
        ("NVIDIA GB300", 277.5, "GB300"),
        ("NVIDIA GB200", 185.0, "GB200"),
        ("AMD Instinct MI355X", 288.0, "MI355X"),
        ("AMD Instinct MI350X", 288.0, "MI350X"),
        ("NVIDIA GeForce RTX 5090", 31.8, "RTX5090"),
        ("NVIDIA L40S", 44.4, "L40S"),
        ("AMD Instinct MI300X", 191.5, "MI300X"),
        ("Tesla V100-SXM2-16GB", 15.8, "V100-16GB"),
        ("Tesla V100-SXM2-32GB", 31.7, "V100-32GB"),
        ("NVIDIA GeForce RTX 4090", 23.6, "RTX4090"),
        ("NVIDIA GeForce RTX 3090", 23.7, "RTX3090"),
        ("NVIDIA A10G", 22.0, "A10G"),
        ("NVIDIA L4", 22.0, "L4"),
        ("Tesla T4", 14.7, "T4"),
        ("Mystery Accelerator 9000", 8.0, "gpu:Mystery-Accelerator-9000"),
    ],
)
def test_gpu_names_map_to_catalog_ids(name, gib, expected) -> None:
    assert canonical_gpu_id(name, gib) == expected
    if not expected.startswith("gpu:"):
        from trainplan.catalog import get_catalog

        assert expected in get_catalog().accelerators  # a probed GPU finds its catalog row


def test_probe_of_this_machine() -> None:
    hw = probe_hardware(use_gpus=False)
    assert hw.accelerator is Accelerator.CPU and hw.cpu_cores >= 1 and hw.memory_gib > 0
    assert hw.hardware_id == f"cpu:{' '.join(hw.cpu_model.split())}:{hw.cpu_cores}"
    gpu = Hardware("X", 16, 64.0, gpus=(GpuInfo("NVIDIA L4", 22.0),) * 2, accelerator=Accelerator.CUDA)
    assert gpu.hardware_id == "L4" and gpu.device_count == 2 and gpu.device_memory_gib == 22.0


def test_peak_memory_sees_an_allocation_after_reset() -> None:
    # An anonymous mapping gets fresh pages from the kernel; a malloc'd array could reuse pages the
    # allocator already holds from earlier tests, and the resident set would not grow.
    meter = PeakMemory("cpu")
    meter.reset()
    block = mmap.mmap(-1, 64 * 1024 * 1024)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1  # touch every page
    assert meter.peak_bytes() >= 60 * 1024 * 1024  # while it is held
    block.close()
    assert meter.peak_bytes() >= 60 * 1024 * 1024  # and after it is gone
    meter.reset()
    assert meter.peak_bytes() < 60 * 1024 * 1024 or meter.method.endswith("(getrusage)")


def _cal(**changes) -> Calibration:
    base = dict(
        hardware_id="cpu:Test:2", kind="tabular", key="xgboost", devices=2, step_time_s=0.01, throughput=1e5,
        throughput_unit="rows/s", peak_gib=0.1, achieved_tflops=None, ns_per_cell=2.5,
        recorded_at="2026-12-01T00:00:00+00:00", host="h", job_name="j", run_dir="/r",
    )
    return Calibration(**{**base, **changes})


def test_calibrations_round_trip_and_lookup(tmp_path) -> None:
    assert load_calibrations() == []
    assert store_path().parent == tmp_path / "home"  # TRAINPLAN_HOME is honoured
    record_calibration(_cal())
    record_calibration(_cal(recorded_at="2026-12-02T00:00:00+00:00", step_time_s=0.02))
    record_calibration(_cal(kind="transformer", key="ddp", achieved_tflops=1.5, throughput_unit="tokens/s"))
    assert len(load_calibrations()) == 3
    latest = lookup("cpu:Test:2", "tabular", "xgboost")
    assert latest is not None and latest.step_time_s == 0.02
    assert lookup("cpu:Test:2", "transformer", "ddp").achieved_tflops == 1.5
    assert lookup("A100-80GB", "tabular", "xgboost") is None
    with pytest.raises(Exception):
        latest.step_time_s = 1.0  # frozen


def test_a_corrupt_store_is_a_clear_error() -> None:
    store_path().parent.mkdir(parents=True)
    store_path().write_text("{not json")
    with pytest.raises(TrainplanError, match="calibration store is unreadable"):
        load_calibrations()


def test_a_store_written_before_ns_per_cell_still_loads() -> None:
    """Records from the first store format (a core-seconds field, no ns_per_cell) load; the rate is unknown."""
    import json

    old = _cal().to_json()
    del old["ns_per_cell"]
    old["core_s_per_row_feature_tree_depth"] = 1e-9
    store_path().parent.mkdir(parents=True)
    store_path().write_text(json.dumps({"version": 1, "calibrations": [old]}))
    (loaded,) = load_calibrations()
    assert loaded.ns_per_cell is None and loaded.throughput == 1e5
    broken = {k: v for k, v in old.items() if k != "hardware_id"}
    store_path().write_text(json.dumps({"version": 1, "calibrations": [broken]}))
    with pytest.raises(TrainplanError, match="missing hardware_id"):
        load_calibrations()
