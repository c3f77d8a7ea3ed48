"""The GPU branches of the probe with NVML and torch mocked: no library, no device, two GPUs with NVLink."""

from __future__ import annotations

import sys

import pytest
from gpu_fakes import TWO_A100_NVLINK, fake_nvml, fake_torch

from trainplan.measure.microbench import plan_benchmarks
from trainplan.measure.nvml import read_nvml
from trainplan.measure.probe import Accelerator, describe_machine, probe_hardware


def test_no_nvml_library_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    r = read_nvml()
    assert not r.available and r.gpus == ()
    assert "nvidia-ml-py is not installed" in (r.note or "")


def test_no_driver_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_nvml([], init_error="NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    r = read_nvml()
    assert not r.available
    assert r.note == "no NVIDIA driver on this machine (NVML: NVML Shared Library Not Found)"
    assert nv.calls["shutdown"] == 0  # never initialised, never shut down


def test_two_gpus_with_nvlink(gpu_machine) -> None:
    r = read_nvml()
    assert r.available and r.driver_version == "550.54.15" and r.cuda_driver_version == "12.4"
    assert [g.name for g in r.gpus] == ["NVIDIA A100-SXM4-80GB"] * 2
    assert [g.nvlinks for g in r.gpus] == [12, 12]
    assert r.gpus[0].memory_gib == pytest.approx(79.15) and r.gpus[0].pcie_gen == 4 and r.gpus[0].compute_capability == "8.0"
    assert [(link.a, link.b, link.kind, link.nvlinks) for link in r.links] == [(0, 1, "nvlink", 12)]
    assert gpu_machine.calls["shutdown"] == 1


@pytest.mark.parametrize(("level", "kind"), [(10, "pcie-switch"), (30, "pcie-hostbridge"), (50, "cpu-interconnect")])
def test_pcie_pairs_take_nvml_topology_level(monkeypatch: pytest.MonkeyPatch, level: int, kind: str) -> None:
    gpus = [{"name": "NVIDIA GeForce RTX 4090", "memory_gib": 23.6, "bus": f"0000:0{i}:00.0"} for i in (1, 2)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus, topology=level))
    r = read_nvml()
    assert [(link.kind, link.nvlinks) for link in r.links] == [(kind, 0)]
    assert [g.nvlinks for g in r.gpus] == [0, 0]


def test_describe_two_gpus(gpu_machine) -> None:
    d = describe_machine()
    assert d.hardware.accelerator is Accelerator.CUDA
    assert d.hardware.hardware_id == "A100-80GB" and d.hardware.device_count == 2
    assert d.torch.cuda_available and d.torch.cuda_devices == 2 and d.torch.bf16_supported
    assert d.gpu_note is None
    out = d.to_dict()
    assert out["nvml"]["links"] == [{"a": 0, "b": 1, "kind": "nvlink", "nvlinks": 12}]
    assert [g["canonical_id"] for g in out["gpus"]] == ["A100-80GB", "A100-80GB"]


def test_gpu_benchmarks_planned_for_two_gpus() -> None:
    labels = [b.label for b in plan_benchmarks(cuda_devices=2, bf16=True, tabular=False)]
    assert "all-reduce NCCL (2 GPUs)" in labels and "host-to-device bandwidth" in labels
    assert {"matmul fp32 (cuda:0)", "matmul tf32 (cuda:0)", "matmul fp16 (cuda:0)", "matmul bf16 (cuda:0)"} <= set(labels)
    one = [b.label for b in plan_benchmarks(cuda_devices=1, bf16=False, tabular=False)]
    assert "all-reduce gloo (2 processes)" in one and "matmul bf16 (cuda:0)" not in one
    cpu = [b.label for b in plan_benchmarks(cuda_devices=0, tabular=False)]
    assert not any("cuda" in label or "host-to-device" in label for label in cpu)


def test_nvml_sees_gpus_torch_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(TWO_A100_NVLINK))
    monkeypatch.setitem(sys.modules, "torch", fake_torch([]))
    d = describe_machine()
    assert d.hardware.accelerator is Accelerator.CPU
    assert d.gpu_note == "NVML lists 2 GPU(s) but torch sees no CUDA device; training runs on the CPU"
    assert len(d.hardware.gpus) == 2  # described, though a run uses the CPU


def test_no_torch_no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], init_error="Driver Not Loaded"))
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr("trainplan.measure.probe._gpu_driver_visible", lambda: False)
    d = describe_machine()
    assert not d.torch.installed
    assert d.gpu_note == "no GPU: no NVIDIA driver on this machine (NVML: Driver Not Loaded); torch is not installed; training runs on the CPU"
    assert probe_hardware().accelerator is Accelerator.CPU


def test_nvml_only_process_gets_gpus_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """probe_hardware's NVML path (no torch in the process): run/ relies on it for tabular jobs."""
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(TWO_A100_NVLINK))
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr("trainplan.measure.probe._gpu_driver_visible", lambda: True)
    hw = probe_hardware()
    assert hw.accelerator is Accelerator.CUDA and [g.canonical_id for g in hw.gpus] == ["A100-80GB"] * 2


def test_amd_gpus_are_seen_through_a_rocm_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ROCm build of PyTorch reports AMD GPUs through torch.cuda (PyTorch's HIP semantics); their names map to the
    catalog's AMD rows, and the ROCm driver's /dev/kfd counts as a GPU driver before torch is imported."""
    from pathlib import Path
    from types import SimpleNamespace

    from trainplan.measure import probe
    from trainplan.measure.probe import canonical_gpu_id

    assert canonical_gpu_id("AMD Instinct MI300X", 191.98) == "MI300X"
    assert canonical_gpu_id("AMD Instinct MI325X", 255.98) == "MI325X"
    props = SimpleNamespace(name="AMD Instinct MI300X", total_memory=192 * 2**30)
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: 8, get_device_properties=lambda i: props)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    gpus = probe._cuda_gpus()
    assert [g.canonical_id for g in gpus] == ["MI300X"] * 8
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(probe.shutil, "which", lambda name: None)
    monkeypatch.setattr(Path, "exists", lambda self: str(self) == "/dev/kfd")
    assert probe._gpu_driver_visible()
    monkeypatch.setattr(Path, "exists", lambda self: False)
    assert not probe._gpu_driver_visible()
