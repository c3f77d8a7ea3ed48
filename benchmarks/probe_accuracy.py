"""Does `trainplan probe` measure what a direct measurement measures?  Matmul rate and memory bandwidth,
the probe's functions against plain timeit loops (torch, and numpy for reference) in the same run.

    python benchmarks/probe_accuracy.py [--rounds 3] [--full-probe]

Both take the fastest single call (the probe over its time budget, the direct loop over timeit repeats).
Probe and direct measurement alternate (probe, direct, probe, direct …) so load from other processes falls
on both; the ratio is probe / direct-torch per round, and the median ratio must lie in 0.8–1.25 (exit 1
otherwise).  --full-probe also times one whole probe (every benchmark, as `trainplan probe` runs it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit

import numpy as np
import torch

from trainplan.measure.microbench import matmul_tflops, memory_bandwidth_gb_s

N = 1024  # the probe's CPU matmul size
MIB = 256  # the probe's CPU copy size
LOW, HIGH = 0.8, 1.25


def direct_torch_matmul() -> float:
    a, b = torch.randn(N, N), torch.randn(N, N)
    t = min(timeit.repeat(lambda: torch.mm(a, b), repeat=20, number=1))
    return 2 * N**3 / t / 1e12


def direct_numpy_matmul() -> float:
    a = np.random.default_rng(0).standard_normal((N, N), dtype=np.float32)
    b = a.copy()
    t = min(timeit.repeat(lambda: a @ b, repeat=20, number=1))
    return 2 * N**3 / t / 1e12


def direct_torch_copy() -> float:
    src = torch.ones(MIB * 2**20 // 4)
    dst = torch.empty_like(src)
    t = min(timeit.repeat(lambda: dst.copy_(src), repeat=15, number=1))
    return 2 * MIB * 2**20 / t / 1e9


def direct_numpy_copy() -> float:
    src = np.ones(MIB * 2**20 // 8)
    dst = np.empty_like(src)
    t = min(timeit.repeat(lambda: np.copyto(dst, src), repeat=15, number=1))
    return 2 * MIB * 2**20 / t / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full-probe", action="store_true")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; numpy {np.__version__}")
    rows = {"matmul fp32 TFLOP/s": ([], [], []), "memory copy GB/s": ([], [], [])}
    for _ in range(args.rounds):
        rows["matmul fp32 TFLOP/s"][0].append(matmul_tflops("fp32").value)
        rows["matmul fp32 TFLOP/s"][1].append(direct_torch_matmul())
        rows["matmul fp32 TFLOP/s"][2].append(direct_numpy_matmul())
        rows["memory copy GB/s"][0].append(memory_bandwidth_gb_s().value)
        rows["memory copy GB/s"][1].append(direct_torch_copy())
        rows["memory copy GB/s"][2].append(direct_numpy_copy())
    ok = True
    print(f"{'figure':22} {'probe':>9} {'torch':>9} {'numpy':>9} {'probe/torch':>12}  per round")
    for name, (probe, direct, numpy_) in rows.items():
        ratios = [p / d for p, d in zip(probe, direct)]
        med = statistics.median(ratios)
        ok &= LOW <= med <= HIGH
        print(f"{name:22} {statistics.median(probe):9.4g} {statistics.median(direct):9.4g} {statistics.median(numpy_):9.4g} "
              f"{med:12.3f}  {', '.join(f'{r:.2f}' for r in ratios)}")
    if args.full_probe:
        from trainplan.measure.profile import run_probe

        prof = run_probe()
        print(f"full probe: {prof.seconds:.1f} s, {len(prof.measurements)} figures")
        for m in prof.measurements:
            print(f"  {m.name:26} {m.value if m.value is None else f'{m.value:.4g}':>10} {m.unit:8} {m.note or m.method}")
    print("within 0.8–1.25" if ok else "OUTSIDE 0.8–1.25")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
