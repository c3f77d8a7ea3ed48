"""kind: keras — the XLA-based estimate against the measured peak of a training step on CPU, five models.

    python benchmarks/keras_peaks.py

For each model: trainplan's analysis (estimate/keras.py: XLA buffer assignment of the jit-compiled
train_step) and, in a fresh process with TF_CPU_ALLOCATOR_USE_BFC=true, the peak of
tf.config.experimental.get_memory_info("CPU:0") over 3 steady-state train_on_batch steps (reset after the
first, compiling, step).  Printed as a Markdown table (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
sys.path.insert(0, str(REPO))

from trainplan.estimate.keras import analyse_keras_jobs, profile_from_analysis  # noqa: E402
from trainplan.spec import parse_job  # noqa: E402

CASES = [
    ("dense", {"features": 256, "hidden": 1024}, [{"shape": [256]}], "sparse_categorical_crossentropy", 256),
    ("cnn", {"size": 64, "filters": 32}, [{"shape": [64, 64, 3]}], "sparse_categorical_crossentropy", 64),
    ("transformer_block", {"seq": 128, "dim": 128, "vocab": 2000}, [{"shape": [128], "dtype": "int32", "high": 2000}],
     "sparse_categorical_crossentropy", 32),
    ("rnn", {"seq": 50, "features": 32, "units": 256}, [{"shape": [50, 32]}], "sparse_categorical_crossentropy", 128),
    ("two_tower", {"a_features": 512, "b_features": 256, "hidden": 1024}, [{"shape": [512]}, {"shape": [256]}], "mse", 256),
]

MEASURE = r"""
import json, sys, numpy as np, tensorflow as tf
from trainplan.spec import parse_job
from trainplan.estimate.keras import build_model, synthetic_batch
job = parse_job(json.loads(sys.argv[1]))
model = build_model(job)
x, _ = synthetic_batch(job, 1, 0)
y0 = model(x, training=False)
x, y = synthetic_batch(job, job.micro_batch, 1, tuple(int(d) for d in y0.shape))
model.train_on_batch(x, y)
state = tf.config.experimental.get_memory_info("CPU:0")["current"]
tf.config.experimental.reset_memory_stats("CPU:0")
for _ in range(3):
    model.train_on_batch(x, y)
print(json.dumps({"peak": tf.config.experimental.get_memory_info("CPU:0")["peak"], "resident": state}))
"""


def main() -> None:
    jobs = [parse_job({"kind": "keras", "model": f"tests.keras.models:{m}", "model_args": args, "inputs": inputs,
                       "loss": loss, "micro_batch": mb, "steps": 1}) for m, args, inputs, loss, mb in CASES]  # fmt: skip
    os.chdir(REPO)
    analyses = analyse_keras_jobs(jobs)
    env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "tensorflow",
           "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}  # fmt: skip
    print("| model | params | XLA state MiB | XLA temp MiB | predicted peak MiB | measured peak MiB | error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, *_), job, a in zip(CASES, jobs, analyses):
        out = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(job.model_dump(mode="json"))], env=env,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        m = json.loads(out.strip().splitlines()[-1])
        pred = profile_from_analysis(job, a).trace["single_device_peak_gib"] * 2**30
        x = a["xla"]
        print(f"| {name} | {a['params']:,} | {x['state'] / 2**20:.1f} | {x['temp'] / 2**20:.1f} | {pred / 2**20:.1f} "
              f"| {m['peak'] / 2**20:.1f} | {(pred - m['peak']) / m['peak']:+.0%} |")


if __name__ == "__main__":
    main()
