"""Probe the local machine: CPU model and usable cores, memory, GPUs.

The probe is cheap (no ``py-cpuinfo``, which takes about a second): the CPU
model comes from ``/proc/cpuinfo`` or :mod:`platform`, cores from the process's
CPU affinity (so a container limited to 2 cores reports 2), GPUs from
``torch.cuda`` and, when it is installed, NVML (``nvidia-ml-py``).  Where no
NVIDIA driver is visible (Linux) torch is not imported at all.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainplan.measure.nvml import NvmlReading

GIB = 1024**3


class Accelerator(str, Enum):
    """The kind of device a training process runs on."""

    CUDA = "cuda"
    MPS = "mps"
    CPU = "cpu"


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the driver reports it."""

    name: str
    memory_gib: float

    @property
    def canonical_id(self) -> str:
        return canonical_gpu_id(self.name, self.memory_gib)


@dataclass(frozen=True)
class Hardware:
    """What this machine offers to a training job."""

    cpu_model: str
    cpu_cores: int  # cores this process may use (CPU affinity), logical
    memory_gib: float
    gpus: tuple[GpuInfo, ...] = ()
    accelerator: Accelerator = Accelerator.CPU

    @property
    def hardware_id(self) -> str:
        """A stable name for calibration records.

        The canonical GPU id (e.g. ``"A100-80GB"``) when the machine has a
        recognised GPU, ``"gpu:<name>"`` for an unrecognised one, ``"mps:<cpu>"``
        on Apple silicon, else ``"cpu:<model>:<cores>"``.
        """
        if self.accelerator is Accelerator.CUDA and self.gpus:
            return self.gpus[0].canonical_id
        if self.accelerator is Accelerator.MPS:
            return f"mps:{self.cpu_model}"
        return cpu_hardware_id(self.cpu_model, self.cpu_cores)

    @property
    def device_count(self) -> int:
        """GPUs on a CUDA machine, else 1 (one MPS device, or the CPU)."""
        return len(self.gpus) if self.accelerator is Accelerator.CUDA else 1

    @property
    def device_memory_gib(self) -> float:
        """Memory of one device: a GPU's, else the host's."""
        if self.accelerator is Accelerator.CUDA and self.gpus:
            return self.gpus[0].memory_gib
        return self.memory_gib


def cpu_hardware_id(cpu_model: str, cores: int) -> str:
    """``cpu:<model>:<cores>`` with the model's whitespace collapsed."""
    model = re.sub(r"\s+", " ", cpu_model).strip() or "unknown"
    return f"cpu:{model}:{cores}"


# Recognised GPU names → canonical catalog ids.  Order matters: the first match
# wins, and the memory size separates the variants sold under one name.
_GPU_PATTERNS: tuple[tuple[str, float | None, str], ...] = (
    (r"\bH200\b", None, "H200"),
    (r"\bH100\b.*\bNVL\b", None, "H100-NVL"),  # "NVIDIA H100 NVL"
    (r"\bH100\b.*\bPCIe\b", None, "H100-PCIe"),  # "NVIDIA H100 PCIe"
    (r"\bH100\b", None, "H100-80GB"),  # "NVIDIA H100 80GB HBM3" (SXM)
    (r"\bGB300\b", None, "GB300"),  # "NVIDIA GB300"
    (r"\bB300\b", None, "B300"),  # "NVIDIA B300 SXM6 AC"
    (r"\bGB200\b", None, "GB200"),  # "NVIDIA GB200" (before B200: the name contains it)
    (r"\bB200\b", None, "B200"),
    (r"\bMI355X\b", None, "MI355X"),  # ROCm: "AMD Instinct MI355X"
    (r"\bMI350X\b", None, "MI350X"),
    (r"\bMI325X\b", None, "MI325X"),  # ROCm: "AMD Instinct MI325X"
    (r"\bMI300X\b", None, "MI300X"),
    (r"\bL40S\b", None, "L40S"),
    (r"\bA100\b", 60.0, "A100-80GB"),  # more than 60 GiB → the 80 GB part
    (r"\bA100\b", None, "A100-40GB"),
    (r"\bV100\b", 24.0, "V100-32GB"),
    (r"\bV100\b", None, "V100-16GB"),
    (r"\bA10G\b", None, "A10G"),
    (r"\bL4\b", None, "L4"),
    (r"\bT4\b", None, "T4"),
    (r"RTX\s*5090", None, "RTX5090"),
    (r"RTX\s*4090", None, "RTX4090"),
    (r"RTX\s*3090", None, "RTX3090"),
)


def canonical_gpu_id(name: str, memory_gib: float) -> str:
    """Map a driver's GPU name (``"NVIDIA A100-SXM4-80GB"``) to a catalog id.

    Unrecognised names give ``"gpu:<name>"``.
    """
    for pattern, min_gib, gid in _GPU_PATTERNS:
        if re.search(pattern, name, flags=re.IGNORECASE) and (min_gib is None or memory_gib > min_gib):
            return gid
    return "gpu:" + re.sub(r"\s+", "-", name.strip())


def usable_cores() -> int:
    """Logical cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_model_name() -> str:
    """The CPU's marketing name, e.g. ``"AMD EPYC"`` or ``"Apple M2"``."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def host_memory_gib() -> float:
    """Total host memory in GiB (psutil when present, else sysconf)."""
    try:
        import psutil

        return psutil.virtual_memory().total / GIB
    except ImportError:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        except (ValueError, OSError, AttributeError):
            return 0.0


def _gpu_driver_visible() -> bool:
    """Whether an NVIDIA or AMD GPU driver is visible, without importing torch (which takes seconds).  AMD's ROCm
    kernel driver exposes ``/dev/kfd`` (the device node ROCm containers are given); a ROCm build of PyTorch then
    reports its GPUs through the same ``torch.cuda`` calls (PyTorch's "HIP (ROCm) semantics" notes)."""
    if not sys.platform.startswith("linux"):
        return True  # no cheap test elsewhere: ask torch
    return (
        Path("/proc/driver/nvidia/version").exists()
        or Path("/dev/nvidiactl").exists()
        or shutil.which("nvidia-smi") is not None
        or Path("/dev/kfd").exists()
    )


def _cuda_gpus() -> tuple[GpuInfo, ...]:
    if "torch" not in sys.modules and not _gpu_driver_visible():
        return ()
    try:
        import torch
    except ImportError:
        return _nvml_gpus()
    if not torch.cuda.is_available():
        return ()
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(GpuInfo(name=props.name, memory_gib=props.total_memory / GIB))
    return tuple(gpus)


def _nvml_gpus() -> tuple[GpuInfo, ...]:
    """GPUs through NVML, for processes without torch (e.g. tabular jobs)."""
    from trainplan.measure.nvml import read_nvml

    return _gpus_from(read_nvml())


def _mps_available() -> bool:
    if sys.platform != "darwin":
        return False
    try:
        import torch
    except ImportError:
        return False
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def probe_hardware(*, use_gpus: bool = True) -> Hardware:
    """Probe this machine.  ``use_gpus=False`` ignores GPUs (tabular jobs)."""
    gpus = _cuda_gpus() if use_gpus else ()
    if gpus:
        accel = Accelerator.CUDA
    elif use_gpus and _mps_available():
        accel = Accelerator.MPS
    else:
        accel = Accelerator.CPU
    return Hardware(
        cpu_model=cpu_model_name(),
        cpu_cores=usable_cores(),
        memory_gib=host_memory_gib(),
        gpus=gpus,
        accelerator=accel,
    )


# --------------------------------------------------------------------------- the full description
# (``trainplan probe``: slower than probe_hardware because it imports torch and asks NVML everything)


@dataclass(frozen=True)
class TorchView:
    """What PyTorch sees on this machine (``installed`` False: torch is not installed)."""

    installed: bool
    version: str | None = None
    cuda_available: bool = False
    cuda_devices: int = 0
    cuda_version: str | None = None  # the CUDA runtime torch was built with
    mps_available: bool = False
    bf16_supported: bool | None = None  # on the CUDA device (None: no CUDA device)


def torch_view() -> TorchView:
    """Ask torch for CUDA (devices, runtime version, bf16) and MPS; a missing torch says so."""
    try:
        import torch
    except ImportError:
        return TorchView(installed=False)
    cuda = bool(torch.cuda.is_available())
    backend = getattr(torch.backends, "mps", None)
    return TorchView(
        installed=True,
        version=str(torch.__version__),
        cuda_available=cuda,
        cuda_devices=int(torch.cuda.device_count()) if cuda else 0,
        cuda_version=getattr(torch.version, "cuda", None),
        mps_available=bool(backend is not None and backend.is_available()),
        bf16_supported=bool(torch.cuda.is_bf16_supported()) if cuda else None,
    )


@dataclass(frozen=True)
class MachineDescription:
    """This machine for ``trainplan probe``: the :class:`Hardware` a run uses, NVML's account of the GPUs
    (driver, PCIe, NVLink topology) and torch's view.  ``gpu_note`` says in words why there is no GPU."""

    hardware: Hardware
    logical_cpus: int
    nvml: "NvmlReading"
    torch: TorchView
    gpu_note: str | None

    def to_dict(self) -> dict[str, object]:
        from dataclasses import asdict

        hw = self.hardware
        return {
            "hardware_id": hw.hardware_id,
            "accelerator": hw.accelerator.value,
            "cpu_model": hw.cpu_model,
            "cpu_cores": hw.cpu_cores,
            "logical_cpus": self.logical_cpus,
            "memory_gib": hw.memory_gib,
            "gpus": [{"name": g.name, "memory_gib": g.memory_gib, "canonical_id": g.canonical_id} for g in hw.gpus],
            "nvml": self.nvml.to_dict(),
            "torch": asdict(self.torch),
            "gpu_note": self.gpu_note,
        }


def describe_machine() -> MachineDescription:
    """CPU, memory, GPUs (NVML: driver, PCIe, NVLink; torch: CUDA/MPS) — and in words why no GPU, if none."""
    from trainplan.measure.nvml import read_nvml

    view = torch_view()
    reading = read_nvml()
    hw = probe_hardware()
    if hw.accelerator is Accelerator.CPU and not hw.gpus:
        hw = Hardware(hw.cpu_model, hw.cpu_cores, hw.memory_gib, _gpus_from(reading), Accelerator.CPU)
    note = None
    if hw.accelerator is Accelerator.MPS:
        note = "no CUDA GPU; torch uses Apple's MPS device"
    elif hw.accelerator is Accelerator.CPU:
        torch_says = "torch is not installed" if not view.installed else "torch sees no CUDA device"
        if reading.gpus:
            note = f"NVML lists {len(reading.gpus)} GPU(s) but {torch_says}; training runs on the CPU"
        else:
            note = f"no GPU: {reading.note or 'NVML lists none'}; {torch_says}; training runs on the CPU"
    return MachineDescription(hardware=hw, logical_cpus=os.cpu_count() or hw.cpu_cores, nvml=reading, torch=view,
                              gpu_note=note)  # fmt: skip


def _gpus_from(reading: "NvmlReading") -> tuple[GpuInfo, ...]:
    return tuple(GpuInfo(name=g.name, memory_gib=g.memory_gib) for g in reading.gpus)
