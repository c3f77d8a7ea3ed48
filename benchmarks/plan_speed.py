"""How fast is planning?  Full-catalog plans in-process and `trainplan plan` end to end: a 70B LoRA job, and a 405B
pretraining on up to 16,384 GPUs with its tensor / pipeline / context parallel layouts searched.

    python benchmarks/plan_speed.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from trainplan.catalog import get_catalog
from trainplan.cli.common import example_path
from trainplan.planner.core import plan_job
from trainplan.spec import load_job


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    get_catalog()  # load once, as a process does
    for name in ("llama2-70b-lora.yaml", "llama3-405b-pretrain.yaml"):
        job = load_job(example_path(name))
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            plan = plan_job(job)
            times.append(time.perf_counter() - t0)
        n = len(plan.options) + len(plan.rejected) + len(plan.unowned)
        print(f"in-process plan, {name}, {n} options: median {statistics.median(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms")
        ends = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "trainplan.cli.main", "plan", str(example_path(name))],
                           check=True, capture_output=True)  # fmt: skip
            ends.append(time.perf_counter() - t0)
        print(f"`trainplan plan {name}` end to end (process start to exit): median {statistics.median(ends):.2f} s, max {max(ends):.2f} s")


if __name__ == "__main__":
    main()
