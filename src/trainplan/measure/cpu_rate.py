"""What a CPU training process costs beyond its tensors, measured on this machine (for ``trainplan probe``).

:func:`runtime_overhead_gib` starts a fresh interpreter (nothing of this process — its imported modules, its
threads, pages already touched — is inherited), imports torch, resets the kernel's high-water mark of the
resident set (``echo 5 > /proc/self/clear_refs``, proc(5): the method ``trainplan run`` measures CPU peaks
with, ``measure/memory.py``), trains tiny models for a few AdamW steps (a Linear + GELU stack and a Conv2d +
BatchNorm stack, so that both the BLAS and the oneDNN kernels are loaded) and reports the growth of
``VmHWM``.  Their tensors are under 0.1 MiB, so the growth is PyTorch's CPU runtime: the code pages of the
kernel libraries and their buffers, faulted in by the first step.  The CPU estimate (``estimate/cpu.py``)
adds it to a step's tensors, as the GPU estimate adds the CUDA context.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from trainplan.measure.microbench import Measurement

NAME = "cpu_runtime_overhead"

_SCRIPT = r"""
import re, sys
import torch
def hwm():
    return int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
torch.set_num_threads(int(sys.argv[1]))
open("/proc/self/clear_refs", "w").write("5")
base = rss()
nn = torch.nn
models = [
    (nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 2)), torch.randn(4, 8)),
    (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(512, 2)),
     torch.randn(4, 3, 8, 8)),
]
for model, x in models:
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(3):
        nn.functional.cross_entropy(model(x), torch.tensor([0, 1, 0, 1])).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
print(max(hwm(), rss()) - base)
"""


def runtime_overhead_gib(*, threads: int | None = None, timeout_s: float = 120.0) -> Measurement:
    """Resident memory (GiB) a fresh CPU training process gains in its first steps beyond its tensors."""
    t0 = time.perf_counter()
    if not Path("/proc/self/clear_refs").exists():
        return Measurement(NAME, None, "GiB", "cpu", "", note="needs Linux /proc/self/clear_refs to reset the resident peak")
    try:
        import torch
    except ImportError:
        return Measurement(NAME, None, "GiB", "cpu", "", note="needs torch")
    n = threads or int(torch.get_num_threads())
    method = f"fresh interpreter: VmHWM growth over 3 AdamW steps of a tiny Linear and a tiny Conv2d model, {n} threads"
    try:
        out = subprocess.run([sys.executable, "-c", _SCRIPT, str(n)], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Measurement(NAME, None, "GiB", "cpu", method, time.perf_counter() - t0, f"no answer within {timeout_s:.0f} s")
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        return Measurement(NAME, None, "GiB", "cpu", method, time.perf_counter() - t0, f"the measuring process failed: {last}")
    grown = int(lines[-1])
    if grown <= 0:
        return Measurement(NAME, None, "GiB", "cpu", method, time.perf_counter() - t0, "no growth seen (pages shared?)")
    return Measurement(NAME, grown / 2**30, "GiB", "cpu", method, time.perf_counter() - t0)
