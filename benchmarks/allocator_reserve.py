"""How much PyTorch's caching allocator reserves beyond the allocated peak, simulated over traced training steps.

Each configuration is traced on the fake device (estimate/trace/), its allocation and free events are replayed
through the caching-allocator rules (estimate/allocator.py), default and with expandable_segments, and the
reserve beyond the allocated peak is printed.  The median is the source of ``allocator_fragmentation`` in
catalog/data/assumptions.yaml (the analytic path's reserve, which has no allocation sequence of its own).

    python benchmarks/allocator_reserve.py
"""

from __future__ import annotations

import statistics
import time

from trainplan.estimate.torchjob import trace_transformer_job
from trainplan.spec import parse_job

GRID = [
    (model, seq, mb, ckpt, method)
    for model in ("gpt2", "tinyllama-1.1b", "llama-2-7b")
    for seq, mb in ((512, 8), (1024, 2), (2048, 1))
    for ckpt, method in (("none", "full"), ("full", "full"), ("none", "lora"))
    if not (model == "gpt2" and method == "lora")  # GPT-2 names its projections c_attn/c_proj, not q/v_proj
]


def main() -> None:
    rows = []
    print(f"{'model':16} {'seq':>5} {'mb':>3} {'ckpt':5} {'method':6} {'reserve':>8} {'expandable':>10} {'s':>5}")
    for model, seq, mb, ckpt, method in GRID:
        job = parse_job({"kind": "transformer", "model": model, "seq_len": seq, "micro_batch": mb, "steps": 1,
                         "activation_checkpointing": ckpt, "method": method})  # fmt: skip
        t = time.perf_counter()
        mem = trace_transformer_job(job).memory
        peak = mem.single_device_peak or 1.0
        default, expandable = mem.reserve_bytes / peak, mem.expandable_reserve_bytes / peak
        rows.append((default, expandable))
        print(f"{model:16} {seq:5d} {mb:3d} {ckpt:5} {method:6} {default:8.1%} "
              f"{expandable:10.1%} {time.perf_counter() - t:5.1f}")  # fmt: skip
    default = [r for r, _ in rows]
    expandable = [e for _, e in rows]
    print(f"median reserve beyond allocated: {statistics.median(default):.1%} (range {min(default):.1%}–{max(default):.1%}); "
          f"with expandable_segments {statistics.median(expandable):.1%} (range {min(expandable):.1%}–{max(expandable):.1%}); "
          f"n={len(rows)}")


if __name__ == "__main__":
    main()
