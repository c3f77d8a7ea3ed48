"""The real glibc replaying an allocation sequence: the check of ``estimate/heap.py``'s simulation.

:func:`replay_resident_peak` starts a fresh interpreter, optionally imports torch first (so that its heap and its
mmap threshold are a training process's), and replays (key, ±bytes) events with ``posix_memalign(64)`` and
``free`` through ``ctypes`` — the calls ``c10::alloc_cpu`` / ``free_cpu`` make — writing every byte as a kernel
writes its output.  It returns the peak growth of the resident set (``VmHWM`` after ``echo 5 >
/proc/self/clear_refs``, proc(5)), the figure ``trainplan run`` measures.  Linux with glibc only
(:func:`glibc_available`).
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from collections.abc import Iterable

__all__ = ["glibc_available", "replay_resident_peak"]

_REPLAY = r"""
import ctypes, sys
if sys.argv[1] == "torch":
    import torch  # noqa: F401
ops = [tuple(map(int, line.split())) for line in sys.stdin.read().split("\n") if line]
libc = ctypes.CDLL("libc.so.6")
libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
ptrs = [ctypes.c_void_p() for _ in range(max(k for k, _ in ops) + 1)]
def kib(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = kib("VmRSS")
for key, delta in ops:
    if delta > 0:
        libc.posix_memalign(ctypes.byref(ptrs[key]), 64, delta)
        libc.memset(ptrs[key], 1, delta)
    else:
        libc.free(ptrs[key])
print((kib("VmHWM") - base) * 1024)
"""


def glibc_available() -> bool:
    """This is Linux with glibc and /proc/self/clear_refs: the replay can run."""
    return (sys.platform.startswith("linux") and ctypes.util.find_library("c") == "libc.so.6"
            and os.path.exists("/proc/self/clear_refs"))  # fmt: skip


def replay_resident_peak(events: Iterable[tuple[int, int]], *, import_torch: bool = False,
                         fixed_threshold: bool = False, timeout_s: float = 300.0) -> int:  # fmt: skip
    """Peak resident growth (bytes) of a fresh interpreter replaying ``events`` through glibc.

    ``import_torch``: import torch before the replay.  ``fixed_threshold``: ``MALLOC_MMAP_THRESHOLD_=131072``, which
    fixes glibc's mmap threshold at its default and so turns its dynamic rule off (mallopt(3)).
    """
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072") if fixed_threshold else None
    text = "\n".join(f"{k} {d}" for k, d in events)
    out = subprocess.run([sys.executable, "-c", _REPLAY, "torch" if import_torch else "fresh"], input=text,
                         capture_output=True, text=True, check=True, env=env, timeout=timeout_s)  # fmt: skip
    return int(out.stdout)
