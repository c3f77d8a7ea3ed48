"""Peak memory of a training process.

On CUDA the figure is ``torch.cuda.max_memory_allocated`` — the same quantity
the planner predicts (tensors the caching allocator handed out).  Elsewhere it
is the growth of the process's peak resident set size since :meth:`reset`: on
Linux the kernel's high-water mark ``VmHWM`` is reset by writing ``5`` to
``/proc/self/clear_refs`` (proc(5)), so the peak covers exactly the training;
on other systems ``getrusage`` gives the lifetime peak, an upper bound.
"""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+)\s+kB", _STATUS.read_text(), flags=re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def current_rss_bytes() -> int:
    """Resident set size of this process now."""
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        return 0


def _lifetime_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB on Linux


class PeakMemory:
    """Tracks the peak memory of one process on one device.

    ``device`` is a ``torch.device`` or a string (``"cuda:0"``, ``"cpu"``).
    """

    def __init__(self, device: object = "cpu") -> None:
        self.device = str(device)
        self.is_cuda = self.device.startswith("cuda")
        self._baseline = 0
        self._resettable = False

    def reset(self) -> None:
        """Start measuring from now."""
        if self.is_cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            _CLEAR_REFS.write_text("5")
            self._resettable = _status_kib("VmHWM") is not None
        except OSError:
            self._resettable = False
        self._baseline = current_rss_bytes()

    def peak_bytes(self) -> int:
        """Peak bytes since :meth:`reset` (see the module docstring for what is counted)."""
        if self.is_cuda:
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        peak = (_status_kib("VmHWM") or 0) * 1024 if self._resettable else _lifetime_peak_rss_bytes()
        return max(0, peak - self._baseline, current_rss_bytes() - self._baseline)

    @property
    def method(self) -> str:
        """How the peak is measured, for the run summary."""
        if self.is_cuda:
            return "torch.cuda.max_memory_allocated"
        return "peak RSS growth (VmHWM)" if self._resettable else "peak RSS growth (getrusage)"
