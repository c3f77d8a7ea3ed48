"""What a CPU training step costs beyond its matmuls, measured on this machine (for ``trainplan probe``).

:func:`activation_rate_gb_s` times the element-wise work of a training step: normalisation and activation
layers, forward and backward.  On a CPU these kernels are not bound by DRAM bandwidth (a copy runs at tens
of GB/s per core; BatchNorm, LayerNorm and GELU, which reduce and evaluate transcendentals, at a few GB/s),
so the CPU time model (``estimate/cpu.py``) charges a step's saved activations at this measured rate.

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
ACTIVATION_NAME = "activation_rate"


def activation_rate_gb_s(*, channels: int = 64, side: int = 32, batch: int = 16, budget_s: float = 1.0) -> Measurement:
    """GB/s of saved activations the element-wise layers of a training step get through, forward and backward.

    Two reference pairs, each the norm + nonlinearity that follows nearly every matmul or convolution:
    ``BatchNorm2d → ReLU`` (CNNs) and ``LayerNorm → GELU`` (MLPs, transformers), on a ``batch × channels ×
    side × side`` fp32 tensor of n bytes; each pair saves 2n bytes for backward (the norm's input and the
    nonlinearity's input or output, as autograd keeps them).  Rate = saved bytes of both pairs / the fastest
    forward + backward of both, with torch's current threads, best of the repetitions in ``budget_s``.
    """
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError:
        return Measurement(ACTIVATION_NAME, None, "GB/s", "cpu", "", note="needs torch")
    from trainplan.measure.microbench import _best_rate

    nn = torch.nn
    x = torch.randn(batch, channels, side, side, requires_grad=True)
    g = torch.randn(batch, channels, side, side)
    cnn = nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU())
    mlp = nn.Sequential(nn.LayerNorm(side), nn.GELU())
    saved = 2 * 2 * x.numel() * x.element_size()

    def once() -> float:
        s = time.perf_counter()
        for block in (cnn, mlp):
            block(x).backward(g)
        x.grad = None
        return time.perf_counter() - s

    rate, reps = _best_rate(once, float(saved), budget_s)
    method = (f"BatchNorm2d+ReLU and LayerNorm+GELU forward+backward on {batch}x{channels}x{side}x{side} fp32, "
              f"{torch.get_num_threads()} threads, best of {reps}")  # fmt: skip
    return Measurement(ACTIVATION_NAME, rate / 1e9, "GB/s", "cpu", method, time.perf_counter() - t0)

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
