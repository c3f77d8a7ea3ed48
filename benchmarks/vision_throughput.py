"""Built-in vision and diffusion models against published single-GPU training throughput (issue 16).

    python benchmarks/vision_throughput.py        # needs the torch and diffusion extras

Each case names a record of tests/data/published_vision.yaml (source, quoted row) and the job trainplan
estimates for it: the built-in model, resolution, per-GPU batch, precision, checkpointing, one GPU of the
catalog. Prints predicted and published images/s per GPU, the error and the MFU the estimate implies.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import yaml

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.planner.core import estimate_option
from trainplan.spec import parse_job
from trainplan.strategies import Strategy

ROOT = Path(__file__).resolve().parents[1]
RECORDS = {r["id"]: r for r in yaml.safe_load((ROOT / "tests/data/published_vision.yaml").read_text(encoding="utf-8"))}

# record id -> (built-in model, resolution, GPU id, trainplan precision, per-GPU batch, published images/s per GPU,
# extra job fields, how the record maps). Single-GPU rows where the source has them; H800 as H100-80GB (same SXM
# compute; NVLink is not used on one GPU).
CASES = [
    ("dle-rn50-a100-amp", "resnet-50", 224, "A100-80GB", "fp16", 256, ("1gpu", "images_per_s_per_gpu"), {}),
    ("dle-rn50-a100-tf32", "resnet-50", 224, "A100-80GB", "fp32", 256, ("1gpu", "images_per_s_per_gpu"), {}),
    ("dle-rn50-v100-16g-amp", "resnet-50", 224, "V100-16GB", "fp16", 256, ("1gpu", "images_per_s_per_gpu"), {}),
    ("dle-rn50-v100-16g-fp32", "resnet-50", 224, "V100-16GB", "fp32", 112, ("1gpu", "images_per_s_per_gpu"), {}),
    ("timm-rn50-rtx3090-amp-nchw", "resnet-50", 224, "RTX3090", "fp16", 512, ("images_per_s_per_gpu",), {"optimizer": "sgd"}),
    ("timm-vitb16-rtx3090-amp", "vit-b-16", 224, "RTX3090", "fp16", 192, ("images_per_s_per_gpu",), {"optimizer": "sgd"}),
    ("timm-vitl16-rtx3090-amp", "vit-l-16", 224, "RTX3090", "fp16", 64, ("images_per_s_per_gpu",), {"optimizer": "sgd"}),
    ("fastdit-xl2-256-a100-amp-gc-preextract", "dit-xl-2", 256, "A100-80GB", "fp16", 128, ("images_per_s_per_gpu",),
     {"activation_checkpointing": "full"}),
    # fast-DiT's train.py (from DiT's) sets torch.backends.cuda.matmul.allow_tf32 = True: knobs.tf32_matmul; its
    # TF32-disabled log is the same run with plain fp32 matmuls
    ("fastdit-xl2-256-a100-tf32-gc", "dit-xl-2", 256, "A100-80GB", "fp32", 128, ("images_per_s_per_gpu",),
     {"activation_checkpointing": "full", "knobs": {"tf32_matmul": True}}),
    ("fastdit-xl2-256-a100-tf32-gc", "dit-xl-2", 256, "A100-80GB", "fp32", 128, ("tf32_disabled_images_per_s_per_gpu",),
     {"activation_checkpointing": "full"}),
    ("opensora-dit-xl2-256-8xh800", "dit-xl-2", 256, "H100-80GB", "bf16", 128, ("images_per_s_per_gpu",), {}),
    ("mosaic-sd2-unet-512-8xa100", "sd15-unet", 512, "A100-80GB", "fp16", 16, ("images_per_s_per_gpu",), {}),
]


def published(record: dict, path: tuple[str, ...]) -> float:
    value = record["measured"]
    for key in path:
        value = value[key]
    return float(value)


def main() -> int:
    cat = get_catalog()
    errors = []
    print("| record | model | GPU | precision | batch | predicted img/s | published | err | MFU | fits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rid, model, res, gpu, precision, batch, path, extra in CASES:
        job = parse_job({"name": rid, "kind": "torch", "model": model, "resolution": res, "micro_batch": batch,
                         "precision": precision, "steps": 100, **extra})  # fmt: skip
        hw = hardware_for_gpu(find_accelerator(gpu, cat), cat, gpus=1)
        est = estimate_option(job, hw, cat, strategy=Strategy.SINGLE)
        pred = batch / est.step_time_s
        pub = published(RECORDS[rid], path)
        err = pred / pub - 1
        errors.append(abs(err))
        mfu = f"{est.mfu:.0%}" if est.mfu else "–"
        shown = rid + (" (its TF32-disabled log)" if path[-1].startswith("tf32_disabled") else "")
        print(f"| {shown} | {model} | {gpu} | {precision} | {batch} | {pred:.1f} | {pub:.1f} | {err:+.0%} | {mfu} | "
              f"{('yes' if est.fits else 'no') + (' (borderline)' if est.borderline else '')} |")
    within = sum(e <= 0.25 for e in errors)
    print(f"\nmedian |err| {statistics.median(errors):.0%}; within 25%: {within}/{len(errors)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
