"""Compare the traced and the analytic counts for every transformer preset a Hugging Face class maps to.

For each preset: parameters (trace = sum(p.numel()) of the built model vs architecture.param_counts), forward
FLOPs per token at seq 512 (trace = FlopCounterMode formulas vs PaLM App. B), and the single-device peak of a
bf16 AdamW step (micro-batch 1) from the trace vs the analytic DDP-free single-GPU estimate.

    python benchmarks/trace_vs_analytic.py [--seq 512] [--max-params 8e10]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from trainplan.catalog import get_catalog, resolve_model
from trainplan.errors import TrainplanError
from trainplan.estimate import architecture as arch_mod
from trainplan.estimate.compute import training_step_flops
from trainplan.estimate.memory import GIB
from trainplan.estimate.torchjob import hf_config_for
from trainplan.estimate.trace import build_hf_causal_lm, trace_training_step
from trainplan.spec import Checkpointing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--max-params", type=float, default=8e10)
    args = ap.parse_args()
    print(f"{'preset':16} {'params trace':>15} {'analytic':>15} {'Δ':>6} {'fwd GFLOP/tok trace':>20} {'analytic':>9} {'Δ':>6} {'s':>5}")
    for name in sorted(get_catalog().models):
        arch = resolve_model(name)
        counts = arch_mod.param_counts(arch)
        if counts.total > args.max_params:
            continue
        try:
            cfg = hf_config_for(arch)
        except TrainplanError:
            print(f"{name:16} (no Hugging Face class mapped: encoder / encoder-decoder / ALiBi; analytic only)")
            continue
        seq = min(args.seq, arch.max_seq_len or args.seq)

        def batch(mb: int, v: int = arch.vocab):
            return [torch.randint(0, v, (mb, seq))]

        def loss(out, inputs, v: int = arch.vocab):
            return F.cross_entropy(out.logits.float().reshape(-1, v), inputs[0].reshape(-1))

        t0 = time.perf_counter()
        r = trace_training_step(lambda: build_hf_causal_lm(cfg), batch, micro_batch=1, loss=loss)
        dt = time.perf_counter() - t0
        f = training_step_flops(
            tokens=seq, matmul_params=counts.matmul_per_token, trainable_matmul_params=counts.matmul_per_token,
            adapter_params=0, layers=arch.layers, seq_len=seq, attn_dim=arch_mod.attention_inner_dim(arch),
            checkpointing=Checkpointing.NONE, lm_head_params=arch.vocab * arch.hidden,
        )  # fmt: skip
        fa = f.model / 3 / seq / 1e9
        ft = r.flops_forward / seq / 1e9
        print(f"{name:16} {r.params:15,d} {counts.total:15,d} {r.params / counts.total - 1:+6.1%} {ft:20.2f} {fa:9.2f} {ft / fa - 1:+6.1%} {dt:5.1f}")
    print(f"(peak of a single-device bf16 AdamW step is in the trace; e.g. run `trainplan estimate --trace`; 1 GiB = {GIB} B)")


if __name__ == "__main__":
    main()
