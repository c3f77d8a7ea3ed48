"""How fast `trainplan run` prepares a fine-tune's data: read, format, tokenize, pack or pad (issue 17).

    python benchmarks/tokenize_throughput.py [--records 20000]

Uses the byte-level BPE tokenizer of tests/run/pretrained_support.py (384 entries, trained here; a real
checkpoint's 32k–150k vocabulary gives fewer tokens per character, so tokens/s here is a lower bound on
characters handled) and the three styles of data it writes. Prints records/s and tokens/s of
`trainplan.run.workloads.textdata.prepare` for each style, best of 3, on this machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "run"))

from pretrained_support import make_checkpoint, write_data  # noqa: E402

from trainplan.run.workloads import textdata  # noqa: E402
from trainplan.spec import DataFormat  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = make_checkpoint(Path(tmp) / "ckpt", steps=1)
        files = write_data(Path(tmp) / "data", n=args.records)
        print(f"machine: {len(os.sched_getaffinity(0))} cores; {args.records} records per file, seq_len {args.seq_len}")
        print(f"{'style':>12} {'MB':>6} {'rows':>8} {'tokens':>10} {'s':>7} {'records/s':>10} {'tokens/s':>10}")
        for style in ("text", "instruction", "chat", "plain"):
            best = None
            for _ in range(3):
                t0 = time.perf_counter()
                prepared = textdata.prepare(ckpt, files[style], DataFormat(), args.seq_len, seed=0)
                took = time.perf_counter() - t0
                best = took if best is None else min(best, took)
            stats = prepared.stats
            mb = files[style].stat().st_size / 1e6
            print(f"{style:>12} {mb:>6.1f} {stats.rows:>8} {stats.tokens:>10} {best:>7.2f} "
                  f"{stats.examples / best:>10.0f} {stats.tokens / best:>10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
