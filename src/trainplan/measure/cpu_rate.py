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

:func:`step_thread_scaling` times two reference training steps of small networks at one thread and at all of
torch's threads: their speedup is what more cores buy a small-model step, whose kernels are too short to keep
every core busy and between which the Python dispatch and the per-parameter optimizer loop run on one core.
A 1024³ GEMM speeds up with the cores (2.0× from 1 to 2 here); these steps do not (1.1-1.8× for 12 small
models, docs/benchmarks.md).  :func:`matmul_one_thread_tflops` is the probe's GEMM on one thread, the base the
speedup multiplies (``planner/local.py: measured_cpu_rates``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainplan.measure.microbench import Measurement

NAME = "cpu_runtime_overhead"
ACTIVATION_NAME = "activation_rate"
SCALING_NAME = "cpu_step_scaling"
OPERATOR_NAME = "cpu_operator_overhead"
CONV_NAME = "cpu_conv_efficiency"
RNN_NAME = "cpu_rnn_efficiency"
MATMUL_ONE_THREAD_NAME = "matmul_fp32_1thread"


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

    pairs, saved = _element_wise_pairs(torch, channels, side, batch)

    def once() -> float:
        s = time.perf_counter()
        pairs()
        return time.perf_counter() - s

    rate, reps = _best_rate(once, saved, budget_s)
    method = (f"BatchNorm2d+ReLU and LayerNorm+GELU forward+backward on {batch}x{channels}x{side}x{side} fp32, "
              f"{torch.get_num_threads()} threads, best of {reps}")  # fmt: skip
    return Measurement(ACTIVATION_NAME, rate / 1e9, "GB/s", "cpu", method, time.perf_counter() - t0)


def bytes_per_saved_byte(*, channels: int = 64, side: int = 32, batch: int = 16) -> float:
    """Bytes the operators of :func:`activation_rate_gb_s`'s pairs read and write, forward + backward, per byte they
    save: counted with the trace's operator tally (``estimate/trace/flops.py``) on the same shapes.  The element-wise
    rate × this is the rate at which a step's memory-bound operators move bytes (``estimate/hardware.py``)."""
    import torch

    from trainplan.estimate.trace.flops import FlopTally

    pairs, saved = _element_wise_pairs(torch, channels, side, batch)
    tally = FlopTally()
    with tally:
        pairs()
    return tally.memory_bytes / saved


def _element_wise_pairs(torch: Any, channels: int, side: int, batch: int) -> tuple[Callable[[], None], float]:
    """The reference pairs' forward + backward as one call, and the bytes they save: ``BatchNorm2d → ReLU`` and
    ``LayerNorm → GELU`` on one ``batch × channels × side × side`` fp32 input of n bytes, each saving 2n."""
    nn = torch.nn
    x = torch.randn(batch, channels, side, side, requires_grad=True)
    g = torch.randn(batch, channels, side, side)
    blocks = (nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU()), nn.Sequential(nn.LayerNorm(side), nn.GELU()))

    def run() -> None:
        for block in blocks:
            block(x).backward(g)
        x.grad = None

    return run, float(2 * 2 * x.numel() * x.element_size())


def operator_overhead_us(*, reps: int = 200) -> Measurement:
    """Microseconds an eager training step spends per operator when the operators do almost no work.

    Two tiny steps, one dense (6 × Linear 8→8 + ReLU, batch 2) and one convolutional (Conv2d 3→4 + BatchNorm +
    ReLU + max-pool + Linear, batch 2 × 3 × 8 × 8), each forward + cross-entropy + backward + AdamW step: their
    fastest times over ``reps`` steps, summed, over the operators the trace's tally counts in one step of each
    (``estimate/trace/flops.py``).  What is left is dispatch, autograd's bookkeeping and torch.optim's Python loop:
    what every operator of a real step costs on top of its arithmetic (``estimate/cpu.py``).  torch's threads.
    """
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError:
        return Measurement(OPERATOR_NAME, None, "us", "cpu", "", note="needs torch")
    from trainplan.estimate.trace.flops import FlopTally

    nn = torch.nn
    dense = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(8, 8), nn.ReLU())])
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 8))  # fmt: skip
    steps = [(dense, torch.randn(2, 8)), (conv, torch.randn(2, 3, 8, 8))]
    target = torch.tensor([1, 2])
    opts = [torch.optim.AdamW(model.parameters()) for model, _ in steps]

    def once(i: int) -> float:
        (model, x), opt = steps[i], opts[i]
        s = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), target).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - s

    for i in range(len(steps)):  # warm-up: optimizer state, kernel selection
        once(i)
        once(i)
    tally = FlopTally()
    with tally:
        for i in range(len(steps)):
            once(i)
    best = sum(min(once(i) for _ in range(reps)) for i in range(len(steps)))
    method = (f"tiny dense and conv training steps (AdamW), {torch.get_num_threads()} threads: best "
              f"{best * 1e6:.0f} us for {tally.ops} operators")  # fmt: skip
    return Measurement(OPERATOR_NAME, best * 1e6 / tally.ops, "us", "cpu", method, time.perf_counter() - t0)


def _against_gemm(name: str, kernel: str, work: Callable[[], None], *, rounds: int, reps: int) -> Measurement:
    """``work``'s FLOP rate (FLOPs by the trace's tally, ``estimate/trace/flops.py``) over the 1024³ fp32 GEMM's,
    the two alternating over ``rounds`` rounds (load from other processes falls on both alike), best of ``reps``
    each, with torch's threads."""
    import torch

    from trainplan.estimate.trace.flops import FlopTally

    t0 = time.perf_counter()
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)

    def timed(fn: Callable[[], object]) -> float:
        s = time.perf_counter()
        fn()
        return time.perf_counter() - s

    work()  # warm-up: kernel selection, oneDNN primitive creation
    tally = FlopTally()
    with tally:
        work()
    best_work = best_gemm = float("inf")
    for _ in range(rounds):
        best_work = min(best_work, *(timed(work) for _ in range(reps)))
        best_gemm = min(best_gemm, *(timed(lambda: a @ b) for _ in range(reps)))
    rate, gemm = tally.total / best_work, 2 * 1024**3 / best_gemm
    method = (f"{kernel} forward+backward {rate / 1e9:.0f} GFLOP/s vs 1024^3 fp32 GEMM {gemm / 1e9:.0f} GFLOP/s, "
              f"{torch.get_num_threads()} threads, best of {rounds}x{reps}")  # fmt: skip
    return Measurement(name, rate / gemm, "x", "cpu", method, time.perf_counter() - t0)


def conv_efficiency(*, rounds: int = 5, reps: int = 3) -> Measurement:
    """A small CNN's convolutions, forward + backward, as a fraction of the 1024³ fp32 GEMM's rate.

    The convolutions of the convolutional reference step (:func:`_reference_steps`: 3→32 channels on 32 × 32 and
    32→64 on 16 × 16, 3 × 3, batch 16); FLOPs by PyTorch's convolution formulas (the backward twice the forward).
    oneDNN's direct convolutions on these shapes (few channels, small images) reach about half the GEMM rate.
    """
    try:
        import torch
    except ImportError:
        return Measurement(CONV_NAME, None, "x", "cpu", "", note="needs torch")
    nn = torch.nn
    layers = [(nn.Conv2d(3, 32, 3, padding=1), torch.randn(16, 3, 32, 32, requires_grad=True), torch.randn(16, 32, 32, 32)),
              (nn.Conv2d(32, 64, 3, padding=1), torch.randn(16, 32, 16, 16, requires_grad=True), torch.randn(16, 64, 16, 16))]  # fmt: skip

    def convs() -> None:
        for conv, x, g in layers:
            conv(x).backward(g)

    return _against_gemm(CONV_NAME, "conv 3->32 on 32x32 and 32->64 on 16x16 (3x3, batch 16)", convs,
                         rounds=rounds, reps=reps)  # fmt: skip


def rnn_efficiency(*, rounds: int = 5, reps: int = 3) -> Measurement:
    """An LSTM layer (oneDNN's fused ``mkldnn_rnn_layer``), forward + backward, as a fraction of the GEMM's rate.

    nn.LSTM(128, 256), 64 time steps, batch 32; FLOPs by the trace's formula for the operator (the gates' GEMMs:
    2·(4H·I + 4H·H) per step and sample, the backward twice that).  The kernel multiplies one time step at a time
    (a batch × 4H product per step) and then runs the gates' element-wise arithmetic, which the formula does not
    count: it reaches a fraction of the GEMM rate.
    """
    try:
        import torch
    except ImportError:
        return Measurement(RNN_NAME, None, "x", "cpu", "", note="needs torch")
    lstm = torch.nn.LSTM(128, 256, batch_first=True)
    x = torch.randn(32, 64, 128, requires_grad=True)
    g = torch.randn(32, 64, 256)

    def layer() -> None:
        lstm(x)[0].backward(g)

    return _against_gemm(RNN_NAME, "LSTM 128->256, 64 steps, batch 32", layer, rounds=rounds, reps=reps)


def _reference_steps(torch: object) -> list[tuple[object, object, object]]:
    """The two reference steps: a dense network (3 × Linear 512, ReLU; batch 128) and a convolutional one
    (two conv 3×3 + BatchNorm + ReLU blocks, 32 and 64 channels, on 16 × 3 × 32 × 32), each with cross-entropy
    and AdamW — the dense and the convolutional shape of a small network, fixed once for every machine."""
    nn = torch.nn  # type: ignore[attr-defined]
    dense = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    conv = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(64, 10))  # fmt: skip
    return [(dense, torch.randn(128, 512), torch.randint(0, 10, (128,))),  # type: ignore[attr-defined]
            (conv, torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))]  # type: ignore[attr-defined]  # fmt: skip


def step_thread_scaling(*, threads: int | None = None, rounds: int = 5, reps: int = 3) -> Measurement:
    """Speedup (×) of the reference training steps from 1 thread to ``threads`` (default: torch's threads).

    Each of the two steps (:func:`_reference_steps`) is timed forward + loss + backward + AdamW step.  The
    thread counts alternate over ``rounds`` rounds of ``reps`` steps each (after a warm-up step that creates the
    optimizer state), so that load from other processes falls on both alike; each step's fastest time per
    thread count is kept (a best-of, as the probe's other figures).  Speedup = the sum of the 1-thread times
    over the sum of the ``threads``-thread times.  torch's thread count is restored afterwards.
    """
    t0 = time.perf_counter()
    try:
        import torch
    except ImportError:
        return Measurement(SCALING_NAME, None, "x", "cpu", "", note="needs torch")
    before = int(torch.get_num_threads())
    n = threads or before
    method = (f"2 reference training steps (dense 3x512 batch 128, conv 32/64ch 16x3x32x32; AdamW) at 1 and {n} "
              f"threads, alternating, best of {rounds}x{reps}")  # fmt: skip
    if n <= 1:
        return Measurement(SCALING_NAME, None, "x", "cpu", method, note="one thread: nothing to scale")
    steps = _reference_steps(torch)
    loss = torch.nn.functional.cross_entropy
    opts = [torch.optim.AdamW(model.parameters()) for model, _, _ in steps]  # type: ignore[attr-defined]

    def once(i: int) -> float:
        (model, x, y), opt = steps[i], opts[i]
        s = time.perf_counter()
        loss(model(x), y).backward()  # type: ignore[operator]
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - s

    best = {(k, i): float("inf") for k in (1, n) for i in range(len(steps))}
    try:
        for k in (1, n):  # warm-up: optimizer state, kernel selection, the thread pool
            torch.set_num_threads(k)
            for i in range(len(steps)):
                once(i)
        for _ in range(rounds):
            for k in (1, n):
                torch.set_num_threads(k)
                for i in range(len(steps)):
                    for _ in range(reps):
                        best[k, i] = min(best[k, i], once(i))
    finally:
        torch.set_num_threads(before)
    one = sum(best[1, i] for i in range(len(steps)))
    many = sum(best[n, i] for i in range(len(steps)))
    return Measurement(SCALING_NAME, one / many, "x", "cpu", f"{method}: {one * 1e3:.1f} ms vs {many * 1e3:.1f} ms",
                       time.perf_counter() - t0)  # fmt: skip


def matmul_one_thread_tflops(*, budget_s: float = 1.5) -> Measurement:
    """The probe's fp32 GEMM (``microbench.matmul_tflops``) on one thread: the per-core rate the speedup scales."""
    try:
        import torch
    except ImportError:
        return Measurement(MATMUL_ONE_THREAD_NAME, None, "TFLOP/s", "cpu", "", note="needs torch")
    from dataclasses import replace

    from trainplan.measure.microbench import matmul_tflops

    before = int(torch.get_num_threads())
    torch.set_num_threads(1)
    try:
        m = matmul_tflops("fp32", budget_s=budget_s)
    finally:
        torch.set_num_threads(before)
    return replace(m, name=MATMUL_ONE_THREAD_NAME)


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
