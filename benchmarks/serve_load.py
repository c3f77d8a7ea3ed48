"""Load on the planning page: 200 concurrent estimate requests against `trainplan serve` on 127.0.0.1.

    python benchmarks/serve_load.py [--requests 200] [--concurrency 200]

Starts `trainplan serve` on a free loopback port (its own process), sends a bounded number of POST
/api/estimate requests — each a different form (micro-batch × sequence length × precision × GPU count),
so no answer comes from the server's cache — at most --concurrency at a time, then the same requests again
(answered from the cache), and stops the server.  Prints errors and latency percentiles per round.
Traffic goes to 127.0.0.1 only; every request has a time limit and the loop ends by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

LIMIT_S = 300.0  # per request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def forms(n: int) -> list[dict[str, str]]:
    grid = itertools.product(("1", "2", "4", "8", "16"), ("256", "512", "1024", "2048"), ("bf16", "fp16"), ("1", "2", "4", "8", "16"))
    return [{"micro_batch": mb, "seq_len": sl, "precision": pr, "gpus": g, "gpu": "A100-80GB"}
            for mb, sl, pr, g in itertools.islice(grid, n)]  # fmt: skip


async def round_trip(base: str, batch: list[dict[str, str]], concurrency: int) -> tuple[list[float], list[str], float]:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=LIMIT_S, limits=limits) as client:

        async def one(form: dict[str, str]) -> tuple[float, str | None]:
            async with gate:
                t0 = time.perf_counter()
                try:
                    r = await client.post("/api/estimate", json=form)
                    bad = None if r.status_code == 200 and "detail" in r.json() else f"HTTP {r.status_code}: {r.text[:120]}"
                except httpx.HTTPError as exc:
                    bad = f"{type(exc).__name__}: {exc}"
                return time.perf_counter() - t0, bad

        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(f) for f in batch))
        wall = time.perf_counter() - t0
    return [t for t, _ in results], [e for _, e in results if e], wall


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=200)
    args = ap.parse_args()
    port = free_port()
    exe = Path(sys.executable).with_name("trainplan")
    server = subprocess.Popen([str(exe), "serve", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=dict(os.environ))  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/api/choices", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("server did not start:", server.stderr.read().decode() if server.stderr else "")
                return 1
            time.sleep(0.2)
        batch = forms(args.requests)
        print(f"{len(batch)} requests, {args.concurrency} at a time, to {base} (2-core machine: nproc={os.cpu_count()})")
        failed = 0
        for label in ("distinct forms (no cache)", "same forms again (cached)"):
            times, errors, wall = asyncio.run(round_trip(base, batch, args.concurrency))
            failed += len(errors)
            print(f"{label}: {len(errors)} errors; latency p50 {pct(times, 50):.2f} s, p95 {pct(times, 95):.2f} s, "
                  f"max {max(times):.2f} s; {len(times) / wall:.1f} requests/s over {wall:.1f} s")
            for e in errors[:3]:
                print("  ", e)
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
