"""What glibc's heap keeps of a CPU training step's tensors: the same allocations, replayed in different processes.

For each model of ``benchmarks/cpu_neural.py`` (``kind: torch``), the step traced for a CPU target is repeated as a
training loop would run it (parameters first, the optimizer state in the first step, a new batch per step, the
gradients freed when the next step begins; 3 steps) and the (allocate, free) sequence is replayed through the real
glibc with ``posix_memalign(64)``, as PyTorch's CPU allocator calls it, every byte written.  The peak of resident
memory (VmHWM after clear_refs) is read in three processes:

* ``fresh``: a fresh interpreter;
* ``torch``: an interpreter that has imported torch first (its heap and mmap threshold as a training process has
  them);
* ``fixed``: a fresh interpreter with ``MALLOC_MMAP_THRESHOLD_=131072`` (glibc's dynamic threshold off);

and through the simulation the CPU estimate uses (``estimate/heap.py``).

The live peak is what the trace predicts; the difference is what the heap keeps.  The point of the table: the
same sequence keeps different amounts in different processes, so the heap's share is a property of the process's
whole allocation history, not of the step's tensors alone (docs/benchmarks.md "Neural networks on CPUs").

    python benchmarks/cpu_heap.py
    python benchmarks/cpu_heap.py --only cnn unet --steps 4
    python benchmarks/cpu_heap.py --threshold-cost            # what fixing the threshold would cost a real run

``--threshold-cost`` runs ``trainplan run`` on ``cnn``, ``unet`` and ``mlp`` (15 steps, this machine's cores) with
glibc's default and with ``MALLOC_MMAP_THRESHOLD_=131072``, and prints the peak RSS growth and the median step
of each: the memory the dynamic threshold keeps against the time the fixed one costs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

MiB = 1 << 20

def traced_loop(name: str, steps: int) -> list[tuple[int, int]]:
    """Trace ``name``'s job for a CPU target and return its training-loop sequence."""
    import cpu_neural

    from trainplan.estimate.torchjob import trace_torch_job
    from trainplan.estimate.trace import step as step_module
    from trainplan.estimate.trace.memory import training_loop_events
    from trainplan.estimate.trace.summary import _categories
    from trainplan.spec import parse_job

    seen: dict[str, list[tuple[int, int]]] = {}
    summarise = step_module.summarise

    def keep(model, opt, prepared, watch, **kwargs):  # type: ignore[no-untyped-def]
        categories = _categories(watch.timeline, model, opt, skip_scalars=False)
        seen["events"] = training_loop_events(watch.timeline, categories, steps=steps)
        return summarise(model, opt, prepared, watch, **kwargs)

    fields = dict(cpu_neural.JOBS[name], precision="fp32", optimizer="adamw", steps=10)
    step_module.summarise = keep
    try:
        trace_torch_job(parse_job(fields), device="cpu")
    finally:
        step_module.summarise = summarise
    return seen["events"]


def live_peak(events: list[tuple[int, int]]) -> int:
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def replay(events: list[tuple[int, int]], process: str) -> int:
    from trainplan.measure.glibc import replay_resident_peak

    return replay_resident_peak(events, import_torch=process == "torch", fixed_threshold=process == "fixed")


def threshold_cost(names: list[str], steps: int = 15) -> None:
    """``trainplan run`` with glibc's default and with the mmap threshold fixed: peak RSS growth and median step."""
    import os
    import tempfile

    import yaml
    from cpu_neural import JOBS, _cli

    print("| model | peak MiB, default | peak MiB, fixed threshold | median step ms, default | fixed threshold | "
          "slower |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="tp-cpu-heap-") as tmp:
        for name in names:
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(yaml.safe_dump(dict(name=name, precision="fp32", optimizer="adamw", steps=steps,
                                                **JOBS[name])), encoding="utf-8")  # fmt: skip
            got = {}
            for label, extra in (("default", {}), ("fixed", {"MALLOC_MMAP_THRESHOLD_": "131072"})):
                env = dict(os.environ, TRAINPLAN_HOME=str(Path(tmp) / "home"), PYTHONPATH=str(ROOT / "src"), **extra)
                run = _cli("run", str(path), "--out", str(Path(tmp) / name), "--overwrite", "--json", env=env)
                got[label] = (run["measured"]["peak_gib"] * 1024, run["measured"]["step_time_s"] * 1e3)
            (pd, sd), (pf, sf) = got["default"], got["fixed"]
            print(f"| {name} | {pd:.1f} | {pf:.1f} | {sd:.1f} | {sf:.1f} | {sf / sd:.2f}x |", flush=True)


def main() -> None:
    import cpu_neural

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    torch_jobs = [n for n, j in cpu_neural.JOBS.items() if j["kind"] == "torch"]
    parser.add_argument("--only", nargs="+", choices=torch_jobs, default=torch_jobs)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threshold-cost", action="store_true", help="time trainplan run with the threshold fixed")
    args = parser.parse_args()
    if args.threshold_cost:
        threshold_cost([n for n in ("cnn", "unet", "mlp") if n in args.only])
        return
    from trainplan.estimate.heap import replay_heap

    print("| model | live peak MiB | glibc: fresh | glibc: torch imported | glibc: fixed threshold | simulated "
          "(estimate/heap.py) | kept: fresh / torch / simulated |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name in args.only:
        events = traced_loop(name, args.steps)
        live = live_peak(events)
        got = {p: replay(events, p) for p in ("fresh", "torch", "fixed")}
        sim = replay_heap(events).resident
        kept = " / ".join(f"{(v - live) / MiB:+.1f}" for v in (got["fresh"], got["torch"], sim))
        print(f"| {name} | {live / MiB:.1f} | {got['fresh'] / MiB:.1f} | {got['torch'] / MiB:.1f} | "
              f"{got['fixed'] / MiB:.1f} | {sim / MiB:.1f} | {kept} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
