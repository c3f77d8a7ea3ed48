"""Overhead of `trainplan run` over the same training loop run bare.

Both sides train the same model — a Llama-style causal LM from the job's
architecture (``--kind transformer``, the default), an MLP from a factory
(``--kind torch``), or a pretrained checkpoint fine-tuned on a JSONL file
(``--kind finetune``: a Llama made and saved here with ``save_pretrained``, as
tests/run/pretrained_support.py does; the bare side is a plain Hugging Face
loop: ``from_pretrained``, the same tokenized rows, AdamW, ``save_pretrained``)
— on the same batches with AdamW, on every core:

* **bare** — a plain script: build, loop, exit (no launcher, metrics,
  checkpoints or summary);
* **trainplan** — ``python -m trainplan.cli.main run JOB --json`` (parent
  process, hardware probe, worker process, metrics line per step, final
  weights, summary, calibration record).

Printed: the wall time of each process from start to exit, its CPU time
(user + system of every descendant process), the training-loop time (bare: measured in the script; trainplan: ``train_s`` of the summary) and
the overheads of each back-to-back pair (run in alternating order) and their
median (robust to other work on a shared machine).  The target is at most 3 % of wall time.

    python benchmarks/run_overhead.py --repeat 6               # all cores
    python benchmarks/run_overhead.py --repeat 6 --cores 1     # pinned: steadier on a shared machine
    python benchmarks/run_overhead.py --steps 200 --width 512   # quicker, noisier
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = '''
import torch


def mlp(width, depth):
    layers = [torch.nn.Linear(64, width), torch.nn.ReLU()]
    for _ in range(depth - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))
'''

BARE = '''
"""The bare loop: same model, batches, loss and optimizer as the trainplan worker."""
import json
import sys
import time

import torch

from trainplan.spec import load_job

job = load_job(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
if job.kind.value == "torch":
    from trainplan.run.workloads.torchjob import torch_workload

    wl = torch_workload(job, world_size=1, micro_batch=job.micro_batch, grad_accum=1)
else:
    from trainplan.run.workloads.transformer import transformer_workload

    wl = transformer_workload(job, world_size=1, micro_batch=job.micro_batch)
opt = torch.optim.AdamW(wl.model.parameters(), lr=job.learning_rate)
start = time.perf_counter()
for step in range(job.steps):
    loss = wl.loss(wl.model, wl.batch(step, 0, 0))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    last = float(loss)
print(json.dumps({"loop_s": time.perf_counter() - start, "final_loss": last}))
'''


BARE_FINETUNE = '''
"""A bare Hugging Face fine-tuning loop: from_pretrained, tokenize, AdamW, save_pretrained."""
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainplan.run.workloads import textdata
from trainplan.spec import load_job

job = load_job(sys.argv[1])
torch.set_num_threads(int(sys.argv[2]))
out = Path(sys.argv[3])
ckpt = Path(job.model)
prepared = textdata.prepare(ckpt, Path(job.data), job.data_format, job.seq_len, job.seed)
torch.manual_seed(job.seed)
model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
rows = textdata.RowSampler(prepared.train, seed=job.seed, world_size=1, micro_batch=job.micro_batch, grad_accum=1)
opt = torch.optim.AdamW(model.parameters(), lr=job.learning_rate)
start = time.perf_counter()
for step in range(job.steps):
    loss = model(**rows.batch(step, 0, 0)).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    last = float(loss)
loop = time.perf_counter() - start
model.save_pretrained(out / "final")
AutoTokenizer.from_pretrained(ckpt).save_pretrained(out / "final")
print(json.dumps({"loop_s": loop, "final_loss": last}))
'''


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kind", choices=("transformer", "torch", "finetune"), default="transformer")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--width", type=int, default=1024, help="MLP width / transformer hidden size / 4")
    parser.add_argument("--depth", type=int, default=4, help="MLP depth / transformer layers")
    parser.add_argument("--batch", type=int, default=256, help="MLP batch / transformer sequences × 16")
    parser.add_argument("--repeat", type=int, default=1, help="alternate bare/trainplan this many times")
    parser.add_argument("--cores", type=int, default=None, help="pin both sides to this many cores (default: all)")
    args = parser.parse_args()
    src = Path(__file__).resolve().parents[1] / "src"
    if args.cores:  # both sides (and trainplan's hardware probe) then see this many cores
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.cores])
    cores = _cores()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "bench_models.py").write_text(MODEL)
        (work / "bare.py").write_text(BARE_FINETUNE if args.kind == "finetune" else BARE)
        job = work / "job.yaml"
        if args.kind == "finetune":
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "run"))
            from pretrained_support import make_checkpoint, write_data

            ckpt = make_checkpoint(work / "ckpt", steps=20, hidden=args.width // 4, layers=args.depth)
            data = write_data(work / "data", n=2000)["text"]
            job.write_text(
                f"kind: transformer\nname: overhead\nmodel: {ckpt}\ndata: {data}\nprecision: fp32\n"
                f"learning_rate: 0.001\nseq_len: 128\nmicro_batch: {max(1, args.batch // 16)}\nsteps: {args.steps}\n"
            )
        elif args.kind == "torch":
            job.write_text(
                "kind: torch\nname: overhead\nmodel: bench_models:mlp\n"
                f"model_args: {{width: {args.width}, depth: {args.depth}}}\n"
                "inputs: [{shape: [64]}]\nloss: cross_entropy\n"
                f"micro_batch: {args.batch}\nsteps: {args.steps}\nprecision: fp32\nlearning_rate: 0.001\n"
            )
        else:
            hidden = args.width // 4
            job.write_text(
                "kind: transformer\nname: overhead\ndata: synthetic\nprecision: fp32\nlearning_rate: 0.001\n"
                f"model: {{layers: {args.depth}, hidden: {hidden}, heads: 4, ffn_hidden: {4 * hidden}, vocab: 4096}}\n"
                f"seq_len: 128\nmicro_batch: {max(1, args.batch // 16)}\nsteps: {args.steps}\n"
            )
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(src), str(work), os.environ.get("PYTHONPATH", "")]),
            "TRAINPLAN_HOME": str(work / "home"),
            "OMP_NUM_THREADS": str(cores),
        }
        def timed(argv: list[str]) -> tuple[float, float, str]:
            """Wall seconds, CPU seconds (user + system, every descendant) and stdout of a command."""
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            out = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if out.returncode != 0:
                raise SystemExit(out.stderr)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            return wall, cpu, out.stdout.strip().splitlines()[-1]

        def run_bare() -> tuple[float, float, dict]:
            wall, cpu, last = timed([sys.executable, str(work / "bare.py"), str(job), str(cores), str(work / "bare_out")])
            return wall, cpu, json.loads(last)

        def run_trainplan(i: int) -> tuple[float, float, dict]:
            argv = [sys.executable, "-m", "trainplan.cli.main", "run", str(job), "--out", str(work / f"run{i}"), "--json"]
            wall, cpu, last = timed(argv)
            return wall, cpu, json.loads(last)

        rows = []
        for i in range(args.repeat):
            if i % 2 == 0:  # alternate the order inside each pair, so neither side always goes first
                (bare_wall, bare_cpu, bare_out), (tp_wall, tp_cpu, summary) = run_bare(), run_trainplan(i)
            else:
                (tp_wall, tp_cpu, summary), (bare_wall, bare_cpu, bare_out) = run_trainplan(i), run_bare()
            rows.append(
                (bare_wall, bare_out["loop_s"], tp_wall, summary["measured"]["train_s"],
                 bare_out["final_loss"], summary["measured"]["final_loss"], bare_cpu, tp_cpu)
            )

    model = (
        f"MLP width {args.width} depth {args.depth}, batch {args.batch}"
        if args.kind == "torch"
        else f"Llama-style LM, {args.depth} layers, hidden {args.width // 4}, 16 × 128 tokens per step"
        + (" (pretrained checkpoint on a JSONL file)" if args.kind == "finetune" else "")
    )
    print(f"machine: {cores} cores; {args.kind} job: {model}, {args.steps} steps")
    print(
        f"{'':>4} {'bare wall s':>12} {'bare loop s':>12} {'bare cpu s':>11} {'run wall s':>11} {'run loop s':>11} "
        f"{'run cpu s':>10} {'loop +%':>8} {'wall +%':>8} {'cpu +%':>7}"
    )
    for i, (bw, bl, tw, tl, _, _, bc, tc) in enumerate(rows):
        print(
            f"{i:>4} {bw:>12.2f} {bl:>12.2f} {bc:>11.2f} {tw:>11.2f} {tl:>11.2f} {tc:>10.2f} "
            f"{100 * (tl - bl) / bl:>8.2f} {100 * (tw - bw) / tw:>8.2f} {100 * (tc - bc) / tc:>7.2f}"
        )
    loop_pct = statistics.median(100 * (r[3] - r[1]) / r[1] for r in rows)
    wall_pct = statistics.median(100 * (r[2] - r[0]) / r[2] for r in rows)
    wall_s = statistics.median(r[2] - r[0] for r in rows)
    cpu_pct = statistics.median(100 * (r[7] - r[6]) / r[7] for r in rows)
    print(
        f"median of {len(rows)} back-to-back pairs: loop overhead {loop_pct:+.2f} %, "
        f"wall overhead {wall_pct:+.2f} % ({wall_s:+.2f} s), CPU-time overhead {cpu_pct:+.2f} %; "
        f"final loss bare {rows[-1][4]:.4f} vs run {rows[-1][5]:.4f}"
    )
    verdict = "within" if wall_pct <= 3.0 else "ABOVE"
    print(f"{verdict} the 3 % target")
    return 0 if wall_pct <= 3.0 else 2


if __name__ == "__main__":
    sys.exit(main())
