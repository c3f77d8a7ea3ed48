"""Short measurements of this machine: what ``trainplan probe`` runs, each a pure function returning a figure.

* matmul throughput, TFLOP/s: ``2·n³`` FLOPs per ``n × n`` product (the
  count every GEMM benchmark uses), best rate over repetitions in a time
  budget; torch when installed (fp32, bf16; fp16 and tf32 on CUDA), numpy
  (fp32) otherwise.
* memory bandwidth, GB/s: a STREAM-style copy ``b[:] = a`` of a large array,
  counted as bytes read + bytes written (McCalpin, STREAM benchmark, "Copy");
  on a CUDA device the same copy in device memory.
* host-to-device bandwidth, GB/s: a pinned host buffer copied to the GPU.
* all-reduce bus bandwidth, GB/s, between local processes: gloo on CPU, NCCL
  between GPUs; bus bandwidth = algorithm bandwidth × 2(n − 1)/n, the figure
  ``nccl-tests`` reports (its doc/PERFORMANCE.md), so it compares with a
  link's bandwidth whatever the number of ranks.
* tabular per-core rate, ns per unit of work: single-thread fits of each
  installed GBDT library on synthetic data, converted with the work count of
  :mod:`trainplan.estimate.tabular` — the unit of ``tabular_rates.csv``.

Every benchmark returns a :class:`Measurement`; one that cannot run here (no
torch, no GPU, a library missing) returns one with ``value=None`` and a
``note`` saying why.  Progress goes to a callback, never to a terminal.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

GB = 1e9
MIB = 1024**2

#: progress(label, done, total): called before each benchmark and once at the end (done == total)
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Measurement:
    """One measured figure of this machine (``value`` None: not measured here, ``note`` says why)."""

    name: str  # e.g. "matmul_bf16", "memory_bandwidth", "allreduce_bus_bandwidth", "tabular_xgboost"
    value: float | None
    unit: str  # "TFLOP/s" | "GB/s" | "ns/cell"
    device: str  # "cpu" | "cuda:0" | "cuda:0-1" ...
    method: str  # what was run, in words
    seconds: float = 0.0  # wall time spent measuring
    note: str | None = None
    spread: float | None = None  # (max − min) / median of the repeated measurements, when repeated

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def _best_rate(run_once: Callable[[], float], work: float, budget_s: float, min_reps: int = 3) -> tuple[float, int]:
    """``work`` / fastest of the timed calls (each returns its own seconds), within ``budget_s``."""
    run_once()  # warm-up: allocation, kernel selection, thread-pool start
    best = float("inf")
    reps = 0
    t_end = time.perf_counter() + budget_s
    while reps < min_reps or time.perf_counter() < t_end:
        best = min(best, run_once())
        reps += 1
        if reps >= 200:
            break
    return work / best, reps


# ----------------------------------------------------------------------------- matmul


def matmul_tflops(dtype: str = "fp32", *, device: str = "cpu", n: int | None = None, budget_s: float = 1.5) -> Measurement:
    """Dense ``n × n`` matmul throughput in TFLOP/s (``dtype``: fp32, tf32, bf16, fp16).

    Named ``matmul_<dtype>`` on the CPU and ``matmul_<dtype>_cuda`` on a GPU.
    """
    t0 = time.perf_counter()
    name = f"matmul_{dtype}" + ("" if device == "cpu" else "_cuda")
    torch = _torch()
    if torch is None:
        if device != "cpu" or dtype != "fp32":
            return Measurement(name, None, "TFLOP/s", device, "", note=f"{dtype} matmul needs torch (numpy has no {dtype} GEMM)")
        return _numpy_matmul(n or 1024, budget_s, t0)
    if device == "cpu" and dtype in ("fp16", "tf32"):
        return Measurement(name, None, "TFLOP/s", device, "", note=f"no {dtype} matmul units on a CPU")
    n = n or (8192 if device.startswith("cuda") else 1024)
    tdtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32 if cuda else None
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    try:
        a = torch.randn(n, n, device=dev).to(tdtype)
        b = torch.randn(n, n, device=dev).to(tdtype)
        c = torch.empty(n, n, device=dev, dtype=tdtype)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        inner = 10 if cuda else 1  # GPU products take milliseconds: time several per sample

        def once() -> float:
            sync()
            s = time.perf_counter()
            for _ in range(inner):
                torch.matmul(a, b, out=c)
            sync()
            return (time.perf_counter() - s) / inner

        rate, reps = _best_rate(once, 2.0 * n**3, budget_s)
    except (RuntimeError, TypeError) as exc:  # a dtype this device or build lacks
        return Measurement(name, None, "TFLOP/s", device, "", time.perf_counter() - t0, f"{dtype} matmul failed: {exc}".splitlines()[0])
    finally:
        if cuda:
            torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    threads = "" if cuda else f", {torch.get_num_threads()} threads"
    method = f"torch.matmul {n}x{n} {dtype}{threads}, best of {reps}"
    return Measurement(name, rate / 1e12, "TFLOP/s", device, method, time.perf_counter() - t0)


def _numpy_matmul(n: int, budget_s: float, t0: float) -> Measurement:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)

    def once() -> float:
        s = time.perf_counter()
        np.matmul(a, b, out=c)
        return time.perf_counter() - s

    rate, reps = _best_rate(once, 2.0 * n**3, budget_s)
    return Measurement("matmul_fp32", rate / 1e12, "TFLOP/s", "cpu", f"numpy.matmul {n}x{n} fp32, best of {reps}", time.perf_counter() - t0)


# ----------------------------------------------------------------------------- memory


def memory_bandwidth_gb_s(*, device: str = "cpu", mib: int | None = None, budget_s: float = 1.0) -> Measurement:
    """STREAM-style copy bandwidth in GB/s (read + write bytes) of a ``mib`` MiB array."""
    t0 = time.perf_counter()
    torch = _torch()
    mib = mib or (1024 if device.startswith("cuda") else 256)
    nbytes = mib * MIB
    if torch is None:
        if device != "cpu":
            return Measurement("memory_bandwidth", None, "GB/s", device, "", note="device memory bandwidth needs torch")
        import numpy as np

        src = np.ones(nbytes // 8, dtype=np.float64)
        dst = np.zeros_like(src)

        def once_np() -> float:
            s = time.perf_counter()
            np.copyto(dst, src)
            return time.perf_counter() - s

        rate, reps = _best_rate(once_np, 2.0 * nbytes, budget_s)
        method = f"numpy copyto {mib} MiB float64, best of {reps}"
        return Measurement("memory_bandwidth", rate / GB, "GB/s", device, method, time.perf_counter() - t0)
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.zeros_like(src)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def once() -> float:
        sync()
        s = time.perf_counter()
        dst.copy_(src)
        sync()
        return time.perf_counter() - s

    rate, reps = _best_rate(once, 2.0 * nbytes, budget_s)
    threads = "" if cuda else f", {torch.get_num_threads()} threads"
    method = f"torch copy_ {mib} MiB float32{threads}, best of {reps}"
    return Measurement("memory_bandwidth" if not cuda else "device_memory_bandwidth", rate / GB, "GB/s", device, method,
                       time.perf_counter() - t0)  # fmt: skip


def h2d_bandwidth_gb_s(*, device: str = "cuda:0", mib: int = 256, budget_s: float = 1.0) -> Measurement:
    """Host-to-device copy bandwidth in GB/s from pinned memory (CUDA only)."""
    t0 = time.perf_counter()
    torch = _torch()
    if torch is None or not torch.cuda.is_available():
        return Measurement("h2d_bandwidth", None, "GB/s", device, "", note="no CUDA device")
    nbytes = mib * MIB
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def once() -> float:
        torch.cuda.synchronize()
        s = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        return time.perf_counter() - s

    rate, reps = _best_rate(once, float(nbytes), budget_s)
    return Measurement("h2d_bandwidth", rate / GB, "GB/s", device, f"pinned {mib} MiB host→{device}, best of {reps}",
                       time.perf_counter() - t0)  # fmt: skip


# ----------------------------------------------------------------------------- all-reduce


def bus_bandwidth(nbytes: float, seconds: float, world: int) -> float:
    """NCCL-tests bus bandwidth of an all-reduce: (bytes / time) × 2(n − 1)/n, in bytes/s."""
    return nbytes / seconds * 2.0 * (world - 1) / world


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def allreduce_bus_gb_s(*, backend: str | None = None, world: int = 2, mib: int = 32, reps: int = 10,
                       timeout_s: float = 60.0) -> Measurement:  # fmt: skip
    """All-reduce bus bandwidth in GB/s between ``world`` local processes (gloo on CPU, NCCL on GPUs).

    The ranks are fresh interpreters running :mod:`trainplan.measure.allreduce_rank` as a script (it
    imports torch only): nothing of this process (its threads, its CUDA context, its ``__main__``) is inherited.
    """
    t0 = time.perf_counter()
    torch = _torch()
    if torch is None:
        return Measurement("allreduce_bus_bandwidth", None, "GB/s", "cpu", "", note="all-reduce needs torch.distributed")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    device = f"cuda:0-{world - 1}" if backend == "nccl" else "cpu"
    nbytes = mib * MIB
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).with_name("allreduce_rank.py"))]
    procs = [subprocess.Popen(cmd + [str(a) for a in (r, world, port, backend, nbytes, reps)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]  # fmt: skip
    outputs: list[tuple[str, str]] = []
    try:
        for p in procs:
            left = max(1.0, timeout_s - (time.perf_counter() - t0))
            outputs.append(p.communicate(timeout=left))
    except subprocess.TimeoutExpired:
        outputs = []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    method = f"{backend} all_reduce {mib} MiB float32, {world} processes, median of {reps}"
    seconds = time.perf_counter() - t0
    if not outputs:
        return Measurement("allreduce_bus_bandwidth", None, "GB/s", device, method, seconds, f"no answer within {timeout_s:.0f} s")
    failed = [(p.returncode, err) for p, (_, err) in zip(procs, outputs) if p.returncode != 0]
    if failed:
        code, err = failed[0]
        last = (err.strip().splitlines() or [f"exit code {code}"])[-1]
        return Measurement("allreduce_bus_bandwidth", None, "GB/s", device, method, seconds, f"a rank failed: {last}")
    median_s = float(outputs[0][0].strip().splitlines()[-1])
    busbw = bus_bandwidth(nbytes, median_s, world) / GB
    return Measurement("allreduce_bus_bandwidth", busbw, "GB/s", device, method, seconds)


# ----------------------------------------------------------------------------- tabular


#: the probe's synthetic fits: two fits that differ only in trees, so their difference is tree building alone
TABULAR_SHAPE = {"rows": 100_000, "features": 28, "trees": 2, "more_trees": 8, "depth": 8}
#: Per library, where its probe departs from TABULAR_SHAPE. XGBoost (per-term rates, estimate/tabular.py gbdt_terms) is
#: probed where the histogram and row-pass terms carry
#: the work, as in most jobs: at 100k rows of depth 8 its split scans are two thirds of the modelled work, and their
#: rate, fitted on benchmarks/tabular_terms.py's grid A (mostly hundreds to thousands of features), prices 28-feature
#: split scans about twice what they cost (a 100k x 28 depth-8 round took 28 ms on one thread where the terms
#: measured on the same machine say 54; 500k x 28 depth 6: 73 ms against 83), so a probe there set this machine's
#: unit rate too low and `trainplan run` predicted 17-54% fast (docs/benchmarks.md, "Tabular runs on this
#: machine"). LightGBM's split scans are a quarter of its modelled work at 100k x 28 depth 8: it keeps that shape.
TABULAR_SHAPE_BY_LIBRARY = {"xgboost": {"rows": 300_000, "depth": 6}}
TABULAR_LIBRARIES = ("xgboost", "lightgbm", "catboost", "sklearn-hgb")


def _fit_once(library: str, x: Any, y: Any, trees: int, depth: int) -> float:
    """Seconds of one single-thread fit (data preparation included; the library imported before the clock)."""
    import importlib

    if library == "xgboost":
        xgboost = importlib.import_module("xgboost")
        s = time.perf_counter()
        dm = xgboost.DMatrix(x, label=y, nthread=1)
        xgboost.train({"tree_method": "hist", "max_depth": depth, "nthread": 1, "objective": "binary:logistic"}, dm, trees)
    elif library == "lightgbm":
        lightgbm = importlib.import_module("lightgbm")
        params = {"num_leaves": 2**depth - 1, "num_threads": 1, "objective": "binary", "verbose": -1}
        s = time.perf_counter()
        lightgbm.train(params, lightgbm.Dataset(x, y), trees)
    elif library == "catboost":
        catboost = importlib.import_module("catboost")
        s = time.perf_counter()
        catboost.CatBoostClassifier(iterations=trees, depth=depth, thread_count=1, border_count=254,
                                    allow_writing_files=False, verbose=False).fit(x, y)  # fmt: skip
    else:
        from sklearn.ensemble import HistGradientBoostingClassifier
        from threadpoolctl import threadpool_limits

        s = time.perf_counter()
        with threadpool_limits(1):
            HistGradientBoostingClassifier(max_iter=trees, max_depth=depth, max_leaf_nodes=None,
                                           early_stopping=False).fit(x, y)  # fmt: skip
    return time.perf_counter() - s


def _library_installed(library: str) -> bool:
    import importlib.util

    module = {"xgboost": "xgboost", "lightgbm": "lightgbm", "catboost": "catboost", "sklearn-hgb": "sklearn"}[library]
    return importlib.util.find_spec(module) is not None


def tabular_rate_unit(library: str) -> str:
    """The unit of a measured tabular rate: ns per cell, qualified by the cost model's work unit where it is not the
    original one (:func:`trainplan.estimate.tabular.tabular_work_unit`), so a rate probed under an earlier model is
    recognised and not applied."""
    from trainplan.estimate.tabular import tabular_work_unit

    unit = tabular_work_unit(library)
    return "ns/cell" if unit is None else f"ns/cell ({unit})"


def tabular_ns_per_cell(library: str, *, shape: dict[str, int] | None = None, repeats: int = 3,
                        min_extra_s: float = 0.5, max_trees: int = 2048) -> Measurement:  # fmt: skip
    """Per-core rate of ``library``: ns per unit of work on one thread, the unit of tabular_rates.csv.

    Pairs of fits with ``trees`` and more trees; the rate is the extra time over the extra work
    (:func:`trainplan.estimate.tabular.work_cells`), so the one-off data preparation (binning, the
    quantile sketch), which a short probe fit cannot amortise as a real job does, is left out.  The extra
    work grows (×4 per try, up to ``max_trees``) until the extra time is at least ``min_extra_s`` — a few trees
    of a 100k-row table differ by milliseconds, inside the run-to-run noise of the data preparation — and the
    pair is then timed ``repeats`` times: the value is the median rate, ``spread`` the range over the median.
    """
    t0 = time.perf_counter()
    name = f"tabular_{library}"
    if not _library_installed(library):
        return Measurement(name, None, tabular_rate_unit(library), "cpu", "", note=f"{library} is not installed (pip install 'trainplan[tabular]')")
    import statistics

    import numpy as np

    from trainplan.estimate.tabular import work_cells
    from trainplan.spec import TabularJob, parse_job

    sh = {**TABULAR_SHAPE, **TABULAR_SHAPE_BY_LIBRARY.get(library, {}), **(shape or {})}
    job = parse_job({"kind": "tabular", "library": library, "rows": sh["rows"], "features": sh["features"],
                     "trees": sh["more_trees"], "max_depth": sh["depth"], "cv_folds": 1})  # fmt: skip
    assert isinstance(job, TabularJob)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((sh["rows"], sh["features"]), dtype=np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int32)
    few_trees, more_trees = sh["trees"], sh["more_trees"]

    def pair() -> tuple[float, float]:
        return _fit_once(library, x, y, few_trees, sh["depth"]), _fit_once(library, x, y, more_trees, sh["depth"])

    few, more = pair()
    while more - few < min_extra_s and more_trees < max_trees:  # grow the extra work above the noise
        more_trees = min(max_trees, more_trees * 4)
        few, more = pair()
    pairs = [(few, more)] + [pair() for _ in range(max(0, repeats - 1))]
    from trainplan.catalog import get_catalog

    rate = get_catalog().tabular_rates.get((library, "cpu"))  # its per-term weights, so the unit is the catalog's
    extra_cells = work_cells(job, rounds=more_trees, rate=rate) - work_cells(job, rounds=few_trees, rate=rate)
    rates = [(m - f) * 1e9 / extra_cells for f, m in pairs if m > f]
    extra = statistics.median(m - f for f, m in pairs)
    method = (f"{library} {sh['rows']:,} x {sh['features']} depth {sh['depth']}, 1 thread: {few_trees} vs {more_trees} "
              f"trees, {len(pairs)} pairs, extra time median {extra:.2f} s")  # fmt: skip
    if not rates:
        return Measurement(name, None, tabular_rate_unit(library), "cpu", method, time.perf_counter() - t0,
                           "more trees took no longer (machine busy?); rate not measured")  # fmt: skip
    value = statistics.median(rates)
    spread = (max(rates) - min(rates)) / value if len(rates) > 1 else None
    if spread is not None:
        method += f", rates {min(rates):.3g}-{max(rates):.3g} ns/cell (spread {spread:.0%})"
    note = None
    if extra < min_extra_s:
        note = f"extra time {extra:.2f} s < {min_extra_s:g} s even at {more_trees} trees: a noisy figure"
    return Measurement(name, value, tabular_rate_unit(library), "cpu", method, time.perf_counter() - t0, note, spread)


# ----------------------------------------------------------------------------- the whole probe


@dataclass(frozen=True)
class Bench:
    """One benchmark to run: its label (for progress) and the call."""

    label: str
    run: Callable[[], Measurement]


def plan_benchmarks(*, cuda_devices: int = 0, bf16: bool | None = None, torch_installed: bool = True,
                    tabular: bool = True, allreduce: bool = True, quick: bool = False) -> list[Bench]:  # fmt: skip
    """The benchmarks ``trainplan probe`` runs on a machine with ``cuda_devices`` GPUs.

    ``quick`` shortens every time budget (tests); the figures are then noisier.
    """
    b = 0.3 if quick else 1.5
    out = [Bench("matmul fp32 (CPU)", lambda: matmul_tflops("fp32", budget_s=b, n=512 if quick else None))]
    if torch_installed:
        out.append(Bench("matmul bf16 (CPU)", lambda: matmul_tflops("bf16", budget_s=b, n=256 if quick else 512)))
    out.append(Bench("memory bandwidth (CPU)", lambda: memory_bandwidth_gb_s(budget_s=b / 1.5, mib=64 if quick else None)))
    if torch_installed:  # what the CPU time model of a neural-network step uses (measure/cpu_rate.py)
        from trainplan.measure import cpu_rate

        out.append(Bench("matmul fp32, one thread (CPU)", lambda: cpu_rate.matmul_one_thread_tflops(budget_s=b)))
        out.append(Bench("training-step thread scaling (CPU)",
                         lambda: cpu_rate.step_thread_scaling(rounds=1 if quick else 5, reps=1 if quick else 3)))  # fmt: skip
        out.append(Bench("element-wise layers (CPU)", lambda: cpu_rate.activation_rate_gb_s(budget_s=b / 1.5)))
        out.append(Bench("per-operator overhead (CPU)", lambda: cpu_rate.operator_overhead_us(reps=20 if quick else 200)))
        out.append(Bench("convolutions vs GEMM (CPU)", lambda: cpu_rate.conv_efficiency(rounds=1 if quick else 5)))
        out.append(Bench("recurrent layer vs GEMM (CPU)", lambda: cpu_rate.rnn_efficiency(rounds=1 if quick else 5)))
        out.append(Bench("PyTorch CPU runtime (fresh process)", lambda: cpu_rate.runtime_overhead_gib()))
    if cuda_devices:
        dtypes = ["fp32", "tf32", "fp16"] + (["bf16"] if bf16 else [])
        for dt in dtypes:
            out.append(Bench(f"matmul {dt} (cuda:0)", lambda dt=dt: matmul_tflops(dt, device="cuda:0", budget_s=b)))
        out.append(Bench("device memory bandwidth (cuda:0)", lambda: memory_bandwidth_gb_s(device="cuda:0", budget_s=b)))
        out.append(Bench("host-to-device bandwidth", lambda: h2d_bandwidth_gb_s(budget_s=b)))
    if allreduce and torch_installed:
        backend = "nccl" if cuda_devices >= 2 else "gloo"
        label = "all-reduce NCCL (2 GPUs)" if backend == "nccl" else "all-reduce gloo (2 processes)"
        out.append(Bench(label, lambda: allreduce_bus_gb_s(backend=backend, mib=8 if quick else 32, reps=4 if quick else 10)))
    if tabular:
        shape = {"rows": 20_000, "trees": 1, "more_trees": 3} if quick else None
        extra_s, repeats = (0.05, 2) if quick else (0.5, 3)
        for lib in TABULAR_LIBRARIES:
            out.append(Bench(f"{lib} per-core rate", lambda lib=lib: tabular_ns_per_cell(lib, shape=shape, repeats=repeats,
                                                                                         min_extra_s=extra_s)))  # fmt: skip
    return out


def run_benchmarks(benches: list[Bench], progress: Progress | None = None) -> list[Measurement]:
    """Run each benchmark in turn, telling ``progress`` before each; a crash becomes a note, not an exception."""
    results = []
    for i, bench in enumerate(benches):
        if progress:
            progress(bench.label, i, len(benches))
        try:
            results.append(bench.run())
        except Exception as exc:  # a benchmark that breaks must not lose the others' figures
            results.append(Measurement(bench.label, None, "", "", "", note=f"failed: {type(exc).__name__}: {exc}".splitlines()[0]))
    if progress:
        progress("done", len(benches), len(benches))
    return results


def cpu_threads() -> int:
    """Threads the CPU benchmarks use (torch's intra-op pool, else the usable cores)."""
    torch = _torch()
    if torch is not None:
        return int(torch.get_num_threads())
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

