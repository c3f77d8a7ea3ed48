"""The CPU-step figures of the probe (measure/cpu_rate.py): the 1-thread GEMM and the training-step thread scaling.

Timing-dependent assertions are loose bounds that hold on any machine (a speedup is positive; a 1-thread GEMM is
slower than a 10 TFLOP/s chip); the arithmetic that uses them is tested exactly in tests/estimate/test_cpu.py.
"""

from __future__ import annotations

import pytest

from trainplan.measure.cpu_rate import (
    MATMUL_ONE_THREAD_NAME,
    SCALING_NAME,
    matmul_one_thread_tflops,
    step_thread_scaling,
)
from trainplan.measure.microbench import plan_benchmarks


def test_step_scaling_times_the_reference_steps_at_one_and_at_n_threads_and_restores_the_threads() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    m = step_thread_scaling(threads=2, rounds=1, reps=1)
    assert torch.get_num_threads() == before
    assert m.name == SCALING_NAME and m.unit == "x" and m.device == "cpu"
    assert m.value is not None and 0.05 < m.value < 4.0, m  # two threads: at most ~2x, never negative
    assert "at 1 and 2 threads" in m.method and " ms vs " in m.method


def test_step_scaling_on_one_thread_has_nothing_to_measure() -> None:
    pytest.importorskip("torch")
    m = step_thread_scaling(threads=1)
    assert m.value is None and m.note == "one thread: nothing to scale"


def test_the_one_thread_gemm_runs_on_one_thread_and_restores_the_threads() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    m = matmul_one_thread_tflops(budget_s=0.2)
    assert torch.get_num_threads() == before
    assert m.name == MATMUL_ONE_THREAD_NAME and m.unit == "TFLOP/s"
    assert m.value is not None and 0 < m.value < 10.0
    assert "1 threads" in m.method


def test_the_probe_plans_the_cpu_step_figures_when_torch_is_installed() -> None:
    labels = [b.label for b in plan_benchmarks(cuda_devices=0, tabular=False, allreduce=False)]
    assert {"matmul fp32, one thread (CPU)", "training-step thread scaling (CPU)", "element-wise layers (CPU)",
            "PyTorch CPU runtime (fresh process)"} <= set(labels)  # fmt: skip
    bare = [b.label for b in plan_benchmarks(cuda_devices=0, tabular=False, allreduce=False, torch_installed=False)]
    assert not any("thread" in label or "element-wise" in label for label in bare)
