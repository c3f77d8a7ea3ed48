"""GPUs as the NVIDIA driver describes them, through NVML (``nvidia-ml-py``, imported as ``pynvml``).

:func:`read_nvml` returns what NVML says — every GPU (name, memory, PCI bus,
PCIe link, active NVLinks), the driver version and, for each pair of GPUs,
how they are connected — or, when NVML cannot answer, an empty reading whose
``note`` says why in plain words ("nvidia-ml-py is not installed", "no NVIDIA
driver on this machine").  Nothing here raises for a machine without GPUs.

Pairs are classified from NVML's own answers: two GPUs with an NVLink
between them (``nvmlDeviceGetNvLinkRemotePciInfo`` of an active link names
the other GPU's bus id) are ``nvlink``; otherwise the common PCIe ancestor
(``nvmlDeviceGetTopologyCommonAncestor``) gives ``pcie-switch`` (one or
more PCIe switches), ``pcie-hostbridge`` (same host bridge / CPU) or
``cpu-interconnect`` (across CPU sockets) — the levels ``nvidia-smi topo -m``
prints as PIX/PXB, PHB/NODE and SYS.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

GIB = 1024**3

# NVML topology levels (nvml.h, nvmlGpuTopologyLevel_t) → a link kind.
_TOPOLOGY_KIND = {
    0: "same-board",  # NVML_TOPOLOGY_INTERNAL: two GPUs on one board
    10: "pcie-switch",  # NVML_TOPOLOGY_SINGLE: one PCIe switch
    20: "pcie-switch",  # NVML_TOPOLOGY_MULTIPLE: several PCIe switches, no host bridge
    30: "pcie-hostbridge",  # NVML_TOPOLOGY_HOSTBRIDGE
    40: "pcie-hostbridge",  # NVML_TOPOLOGY_NODE: host bridges of one NUMA node
    50: "cpu-interconnect",  # NVML_TOPOLOGY_SYSTEM: across sockets (QPI/UPI/Infinity Fabric)
}


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML reports it."""

    index: int
    name: str
    memory_gib: float
    bus_id: str | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlinks: int = 0  # active NVLink links
    compute_capability: str | None = None


@dataclass(frozen=True)
class GpuLink:
    """How two GPUs (by index) are connected; ``nvlinks`` counts the links between them."""

    a: int
    b: int
    kind: str  # nvlink | same-board | pcie-switch | pcie-hostbridge | cpu-interconnect | unknown
    nvlinks: int = 0


@dataclass(frozen=True)
class NvmlReading:
    """What NVML said (``available``), or why it said nothing (``note``)."""

    available: bool
    gpus: tuple[NvmlGpu, ...] = ()
    links: tuple[GpuLink, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    note: str | None = None
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """As JSON would hold it (lists, not tuples)."""
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(call: Any, *args: Any) -> Any:
    """A value NVML may not support on this GPU or driver (None then)."""
    try:
        return call(*args)
    except Exception:  # pynvml raises NVMLError_NotSupported and friends; older bindings lack functions
        return None


def _cuda_version(code: Any) -> str | None:
    """NVML's CUDA driver version integer (12040) as ``"12.4"``."""
    if not isinstance(code, int) or code <= 0:
        return None
    return f"{code // 1000}.{code % 1000 // 10}"


def _nvlink_peers(nv: Any, handle: Any) -> list[str]:
    """Bus ids at the far end of each active NVLink of one GPU."""
    peers = []
    for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            state = nv.nvmlDeviceGetNvLinkState(handle, link)
        except Exception:  # NotSupported (no NVLink) or InvalidArgument (past the last link)
            break
        if state != getattr(nv, "NVML_FEATURE_ENABLED", 1):
            continue
        remote = _optional(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        peers.append(_text(getattr(remote, "busId", "")) if remote is not None else "")
    return peers


def _norm_bus(bus: str | None) -> str:
    """PCI bus ids come as ``00000000:07:00.0`` or ``0000:07:00.0``; compare the tail."""
    return (bus or "").lower().split(":", 1)[-1] if (bus or "").count(":") > 1 else (bus or "").lower()


def read_nvml() -> NvmlReading:
    """Ask NVML about the GPUs; never raises (a machine without GPUs gets a reading that says so)."""
    try:
        import pynvml as nv
    except ImportError:
        return NvmlReading(False, note="nvidia-ml-py is not installed (pip install 'trainplan[gpu]'); GPUs not described by NVML")
    try:
        nv.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded: no NVIDIA driver here
        return NvmlReading(False, note=f"no NVIDIA driver on this machine (NVML: {exc})")
    try:
        return _read(nv)
    finally:
        _optional(nv.nvmlShutdown)


def _read(nv: Any) -> NvmlReading:
    warnings: list[str] = []
    count = int(nv.nvmlDeviceGetCount())
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus: list[NvmlGpu] = []
    peers: list[list[str]] = []
    for i, h in enumerate(handles):
        pci = _optional(nv.nvmlDeviceGetPciInfo, h)
        cc = _optional(nv.nvmlDeviceGetCudaComputeCapability, h)
        links = _nvlink_peers(nv, h)
        peers.append(links)
        gpus.append(NvmlGpu(
            index=i,
            name=_text(nv.nvmlDeviceGetName(h)),
            memory_gib=nv.nvmlDeviceGetMemoryInfo(h).total / GIB,
            bus_id=_text(pci.busId) if pci is not None and getattr(pci, "busId", None) else None,
            pcie_gen=_optional(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
            pcie_width=_optional(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
            nvlinks=len(links),
            compute_capability=f"{cc[0]}.{cc[1]}" if isinstance(cc, tuple) and len(cc) == 2 else None,
        ))  # fmt: skip
    pairs: list[GpuLink] = []
    for a in range(count):
        for b in range(a + 1, count):
            target = _norm_bus(gpus[b].bus_id)
            n = sum(1 for bus in peers[a] if target and _norm_bus(bus) == target)
            if n:
                pairs.append(GpuLink(a, b, "nvlink", n))
                continue
            level = _optional(nv.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            kind = _TOPOLOGY_KIND.get(int(level), "unknown") if level is not None else "unknown"
            if kind == "unknown":
                warnings.append(f"NVML gave no topology for GPUs {a} and {b}")
            pairs.append(GpuLink(a, b, kind, 0))
    return NvmlReading(
        available=True,
        gpus=tuple(gpus),
        links=tuple(pairs),
        driver_version=_optional(lambda: _text(nv.nvmlSystemGetDriverVersion())),
        cuda_driver_version=_cuda_version(_optional(nv.nvmlSystemGetCudaDriverVersion)),
        note=None if gpus else "NVIDIA driver present but no GPU visible",
        warnings=tuple(warnings),
    )
