"""Every frozen held-out set's first look, recomputed: the peak-memory errors out of sample (issue 22).

A held-out set of published runs is out of sample only for the code that existed when it was frozen; every change
made after its first look may have been chosen by it. This script takes, for each tests/data/published_heldout*.yaml,
the commit that added it (``git log --diff-filter=A``; HEAD for a set being frozen), extracts ``src/`` as it was
there into a temporary directory, and predicts the set's records with that code in a fresh interpreter. The pooled errors are the estimator's
out-of-sample error as far as this project can measure it; the memory error band
(``memory_error_band_analytic`` in src/trainplan/catalog/data/assumptions.yaml) is their 80th percentile.

    python benchmarks/first_looks.py [--write tests/data/first_looks.json]

Needs git and the repository's history (a shallow clone cannot run it); the recorded file is what the tests read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"

# Run by the interpreter of each set's commit: its own compare() on the frozen records, one JSON line per record.
_PREDICT = """
import json, sys, yaml
from trainplan.estimate.published import compare
for rec in yaml.safe_load(open(sys.argv[1])):
    try:
        c = compare(rec)
    except Exception as exc:  # that version could not read the record: not modelled at the first look
        c, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = None if c is not None else "not compared"
    out = {"id": rec["id"], "why_not": why}
    if c is not None:
        out.update(predicted_peak_gib=c.predicted_peak_gib, measured_peak_gib=c.measured_peak_gib,
                   predicted_fits=c.predicted_fits, measured_fits=c.measured_fits,
                   predicted_borderline=getattr(c, "predicted_borderline", None))
    print(json.dumps(out))
"""


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True).stdout


def held_out_sets() -> list[Path]:
    """The frozen sets in the order they were frozen."""
    return sorted(DATA.glob("published_heldout*.yaml"), key=lambda p: int(p.stem.removeprefix("published_heldout") or 1))


def first_look(path: Path) -> dict:
    """Predict one frozen set with the code of the commit that froze it.

    ``commit`` in the result names that code: the last commit at or before the freeze that changed ``src/``. A set
    not committed yet (being frozen) is predicted by HEAD's code, which must then be what the working tree holds, so
    that the set, its first look and the band computed from it land in one commit."""
    rel = str(path.relative_to(ROOT))
    frozen_in = _git("log", "--diff-filter=A", "--format=%H", "-1", "--", rel).decode().strip()
    if frozen_in:
        frozen = _git("show", f"{frozen_in}:{rel}")
        if frozen != path.read_bytes():
            raise SystemExit(f"{rel}: differs from the version its commit {frozen_in[:7]} froze")
    else:
        if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src"], cwd=ROOT).returncode:
            raise SystemExit(f"{rel}: not committed yet, and src/ differs from HEAD: commit the code first")
        frozen = path.read_bytes()
    commit = _git("log", "-1", "--format=%H", frozen_in or "HEAD", "--", "src").decode().strip()
    if not commit:
        raise SystemExit(f"{rel}: no history of src/ (a shallow clone?)")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=BytesIO(_git("archive", commit, "src")), mode="r:") as tar:
            tar.extractall(tmp, filter="data")
        (Path(tmp) / "records.yaml").write_bytes(frozen)
        env = dict(os.environ, PYTHONPATH=str(Path(tmp) / "src"), PYTHONWARNINGS="ignore")
        run = subprocess.run([sys.executable, "-c", _PREDICT, str(Path(tmp) / "records.yaml")], env=env,
                             capture_output=True, text=True, check=True, cwd=tmp)  # fmt: skip
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    return {"set": path.name, "commit": commit, "sha256": hashlib.sha256(frozen).hexdigest(), "records": rows}


def signed_errors(looks: list[dict]) -> list[float]:
    """predicted / measured − 1 of every record with a measured peak that its first look modelled."""
    return [r["predicted_peak_gib"] / r["measured_peak_gib"] - 1 for s in looks for r in s["records"]
            if r.get("measured_peak_gib") and r.get("predicted_peak_gib") is not None]  # fmt: skip


def percentile(values: list[float], pct: int) -> float:
    """Linear interpolation between the order statistics, as ``MemoryErrors.percentile`` takes it
    (``statistics.quantiles``, inclusive method)."""
    return statistics.quantiles(values, n=100, method="inclusive")[pct - 1]


def ooms_said_to_fit(look: dict) -> list[dict]:
    """The set's published out-of-memory runs that its first look called "fits" (not borderline)."""
    return [r for r in look["records"] if r.get("measured_fits") is False and r["predicted_fits"]
            and not r.get("predicted_borderline")]  # fmt: skip


def above_estimate(looks: list[dict]) -> list[float]:
    """measured / predicted − 1 of every modelled peak: how far above its estimate each run went."""
    return [-e / (1 + e) for e in signed_errors(looks)]


def leave_one_set_out(looks: list[dict]) -> list[tuple[str, int, float, float, int, int]]:
    """Is the band honest out of sample? For each set: the band (80th / 20th percentiles of measured / predicted − 1)
    built from the other sets' first looks, and how many of this set's runs it covers — from above (the run peaked
    at most band above its estimate: a "fits" verdict outside the band held) and on both sides.
    Rows: (set, peaks, above, below, covered from above, covered on both sides)."""
    rows = []
    for i, s in enumerate(looks):
        others = above_estimate([x for j, x in enumerate(looks) if j != i])
        mine = above_estimate([s])
        if not mine or not others:
            continue
        hi, lo = percentile(others, 80), percentile(others, 20)
        rows.append((s["set"], len(mine), hi, lo, sum(x <= hi for x in mine), sum(lo <= x <= hi for x in mine)))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path, help="record the first looks in this JSON file")
    args = ap.parse_args()
    looks = [first_look(p) for p in held_out_sets()]
    print(f"{'set':28} {'commit':8} {'peaks':>5} {'median |err|':>12} {'OOM':>4} {'OOM said fits':>13}")
    for s in looks:
        errs = signed_errors([s])
        ooms = sum(r.get("measured_fits") is False for r in s["records"])
        med = f"{statistics.median(abs(e) for e in errs):.1%}" if errs else "-"
        print(f"{s['set']:28} {s['commit'][:7]:8} {len(errs):5d} {med:>12} {ooms:4d} {len(ooms_said_to_fit(s)):13d}")
    errs = signed_errors(looks)
    under = above_estimate(looks)
    print(f"\npooled first looks: {len(errs)} measured peaks from {len(looks)} sets")
    print(f"  |error| median {statistics.median(abs(e) for e in errs):.1%}, "
          f"80th percentile {percentile([abs(e) for e in errs], 80):.1%}, 90th {percentile([abs(e) for e in errs], 90):.1%}")
    print(f"  under-estimates (measured above predicted): {sum(u > 0 for u in under)} of {len(under)}; "
          f"measured/predicted − 1 at the 80th percentile {percentile(under, 80):+.1%}")
    rows = leave_one_set_out(looks)
    peaks = sum(r[1] for r in rows)
    print(f"\nleave one set out (each set judged by the band built from the others' first looks):")
    for name, n, hi, lo, up, both in rows:
        print(f"  {name:28} {n:3d} peaks, band {lo:+.1%} … {hi:+.1%}: {up}/{n} at most the band above, {both}/{n} inside")
    print(f"  pooled: {sum(r[4] for r in rows)}/{peaks} = {sum(r[4] for r in rows) / peaks:.1%} at most the band above "
          f"(80% intended), {sum(r[5] for r in rows) / peaks:.1%} inside both sides (60% intended)")
    if args.write:
        args.write.write_text(json.dumps(looks, indent=1) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
