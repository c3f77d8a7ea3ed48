"""Models (issue 16): counts against transformers and the published figures, MoE FLOPs, speed of reading and planning.

    python benchmarks/models.py            # needs the torch extra (transformers) for the cross-check column

Prints, for every preset read from a published config.json: trainplan's count, transformers' count built on the
meta device, the published total and (MoE) active count; the training FLOPs per token against 6 × active + the
attention term; the time to read and cross-check a config (cold and cached, in-process); and `trainplan plan`
of a MoE job over the whole catalog, start to exit.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from trainplan.catalog import get_catalog, resolve_model
from trainplan.estimate.architecture import param_counts
from trainplan.estimate.hf_check import _count, read_hf_config, transformers_param_count
from trainplan.estimate.transformer import attention_flops_width, transformer_profile
from trainplan.spec import parse_job

ROOT = Path(__file__).resolve().parents[1]


def counts_table() -> None:
    cat = get_catalog()
    print("| preset | trainplan | transformers | published total | diff | active (matmul) | + embedding | published active |")
    print("|---|---|---|---|---|---|---|---|")
    for name, entry in cat.models.items():
        if "hf_config" not in entry:
            continue
        arch = resolve_model(name)
        c = param_counts(arch)
        ours = c.total - c.mtp
        ref = transformers_param_count(entry["hf_config"])
        no_mtp = param_counts(arch.model_copy(update={"mtp_layers": 0}))
        active = entry.get("active_params")
        print(f"| {name} | {ours:,} | {ref:,} | {entry['params'] / 1e9:.2f}B | {100 * (ours / entry['params'] - 1):+.1f}% "
              f"| {no_mtp.matmul_per_token / 1e9:.2f}B | {(no_mtp.matmul_per_token + no_mtp.embedding) / 1e9:.2f}B "
              f"| {active / 1e9:.1f}B |" if active else
              f"| {name} | {ours:,} | {ref:,} | {entry['params'] / 1e9:.2f}B | {100 * (ours / entry['params'] - 1):+.1f}% "
              f"| {no_mtp.matmul_per_token / 1e9:.2f}B | – | – |")  # fmt: skip


def flops_table() -> None:
    print("\n| preset (seq 4096, full, bf16) | model FLOPs / token | 6·active + 12·L·s·w | ratio | dense reading 6·(all) |")
    print("|---|---|---|---|---|")
    for name in ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "olmoe-1b-7b"):
        job = parse_job({"name": "f", "kind": "transformer", "model": name, "seq_len": 4096, "micro_batch": 1,
                         "tokens": 1e9, "flash_attention": "false"})  # fmt: skip
        prof = transformer_profile(job)
        arch = resolve_model(name)
        c = param_counts(arch)
        per_token = prof.flops.model / 4096
        expected = 6 * c.matmul_per_token + 12 * (arch.blocks + arch.mtp_layers) * 4096 * attention_flops_width(arch, 4096)
        dense = 6 * (c.block_linear + arch.vocab * arch.hidden)
        print(f"| {name} | {per_token:.4g} | {expected:.4g} | {per_token / expected:.4f} | {dense:.4g} |")


def published_flops_table() -> None:
    """FLOPs per token that stacks publishing both tokens/s/GPU and TFLOP/s/GPU assign (tests/test_published_moe.py)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_published_moe import _cases  # the same records and selection as the test

    print("\n| record | preset | published GFLOP/token | ours, causal (6·active + 6·L·s·w) | err | with MTP | ours, full attention |")
    print("|---|---|---|---|---|---|---|")
    for rid, preset, seq, published, mtp in _cases():
        arch = resolve_model(preset)
        plain = arch.model_copy(update={"mtp_layers": 0})
        row = []
        for a in ((arch if mtp else plain), arch):
            c = param_counts(a)
            row.append(6 * c.matmul_per_token + 6 * (a.blocks + a.mtp_layers) * seq * attention_flops_width(a, seq))
        c = param_counts(arch if mtp else plain)
        a = arch if mtp else plain
        full = 6 * c.matmul_per_token + 12 * (a.blocks + a.mtp_layers) * seq * attention_flops_width(a, seq)
        print(f"| {rid} | {preset} | {published / 1e9:.2f} | {row[0] / 1e9:.2f} | {100 * (row[0] / published - 1):+.1f}% "
              f"| {'yes' if mtp else 'no'} | {full / 1e9:.2f} |")


def speed() -> None:
    cat = get_catalog()
    t = time.perf_counter()
    _count('{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, '
           '"num_attention_heads": 4, "vocab_size": 100}')
    print(f"(first build in a process, a tiny Llama: {time.perf_counter() - t:.2f} s — importing transformers and its "
          "auto classes; the count store in $TRAINPLAN_HOME spares it on the next plan)")
    print("\n| config | read + cross-check, cold (transformers imported) | cached |")
    print("|---|---|---|")

    for name in ("mixtral-8x7b", "deepseek-v3", "qwen3-235b-a22b", "gpt-oss-120b"):
        cfg = cat.models[name]["hf_config"]
        _count.cache_clear()
        t = time.perf_counter()
        from trainplan.estimate.hf_check import _count as count  # the in-process build, bypassing the disk store

        count(__import__("json").dumps({k: v for k, v in cfg.items()}, sort_keys=True, default=str))
        cold = time.perf_counter() - t
        t = time.perf_counter()
        read_hf_config(cfg)
        cached = time.perf_counter() - t
        print(f"| {name} | {1000 * cold:.0f} ms | {1000 * cached:.1f} ms |")
    import json
    import tempfile

    job = ROOT / "src/trainplan/examples/mixtral-lora.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.json"
        cfg.write_text(json.dumps(cat.models["mixtral-8x7b"]["hf_config"]))
        from_file = Path(tmp) / "job.yaml"
        from_file.write_text(job.read_text().replace("model: mixtral-8x7b", f"model: {cfg}"))
        for label, path in (("the preset", job), ("its config.json (cross-checked; count store warm)", from_file)):
            runs = []
            for _ in range(4):
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "trainplan.cli.main", "plan", str(path)], check=True,
                               capture_output=True)  # fmt: skip
                runs.append(time.perf_counter() - t)
            runs = runs[1:]  # the first fills the count store
            print(f"`trainplan plan` of mixtral-lora.yaml with {label}: start to exit median "
                  f"{statistics.median(runs):.2f} s of 3 ({', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    counts_table()
    flops_table()
    published_flops_table()
    speed()
