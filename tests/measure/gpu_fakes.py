"""Fakes for the GPU branches of the probe: NVML (``pynvml``) and torch, so they run on any machine."""

from __future__ import annotations

import types
from typing import Any

GIB = 1024**3


class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[dict[str, Any]], *, init_error: str | None = None, topology: int = 30) -> types.ModuleType:
    """A ``pynvml`` stand-in.  Each GPU: name, memory_gib, bus, and ``nvlink_to``: {peer index: links}."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_NVLINK_MAX_LINKS = 18
    nv.NVML_FEATURE_ENABLED = 1
    calls = {"shutdown": 0}
    nv.calls = calls

    def init() -> None:
        if init_error:
            raise NVMLError(init_error)

    def shutdown() -> None:
        calls["shutdown"] += 1

    def link_state(h: int, link: int) -> int:
        peers = gpus[h].get("nvlink_to", {})
        total = sum(peers.values())
        if not peers:
            raise NVMLError("Not Supported")
        if link >= 12:
            raise NVMLError("Invalid Argument")
        return 1 if link < total else 0

    def remote(h: int, link: int) -> Any:
        order = [peer for peer, n in sorted(gpus[h].get("nvlink_to", {}).items()) for _ in range(n)]
        return types.SimpleNamespace(busId=gpus[order[link]]["bus"].encode())

    nv.nvmlInit = init
    nv.nvmlShutdown = shutdown
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: gpus[h]["name"].encode()  # older bindings return bytes
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=int(gpus[h]["memory_gib"] * GIB))
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=gpus[h]["bus"])
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 4
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0)
    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = remote
    nv.nvmlDeviceGetTopologyCommonAncestor = lambda a, b: topology
    nv.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12040
    return nv


def fake_torch(gpus: list[tuple[str, float]], *, bf16: bool = True) -> types.ModuleType:
    """A ``torch`` stand-in with ``gpus`` CUDA devices (name, GiB); none: a CPU-only build."""
    t = types.ModuleType("torch")
    t.__version__ = "2.13.0+fake"
    cuda = types.SimpleNamespace(
        is_available=lambda: bool(gpus),
        device_count=lambda: len(gpus),
        get_device_properties=lambda i: types.SimpleNamespace(name=gpus[i][0], total_memory=int(gpus[i][1] * GIB)),
        is_bf16_supported=lambda: bf16,
    )
    t.cuda = cuda
    t.version = types.SimpleNamespace(cuda="12.4" if gpus else None)
    t.backends = types.SimpleNamespace()
    return t


TWO_A100_NVLINK = [
    {"name": "NVIDIA A100-SXM4-80GB", "memory_gib": 79.15, "bus": "00000000:07:00.0", "nvlink_to": {1: 12}},
    {"name": "NVIDIA A100-SXM4-80GB", "memory_gib": 79.15, "bus": "00000000:0F:00.0", "nvlink_to": {0: 12}},
]
