"""Full checkpointing on a share of the blocks (knobs.checkpoint_fraction) against the published runs that use it.

The fourteenth frozen held-out set (tests/data/published_heldout14.yaml) holds IDRIS runs of FSDP_sAC.py with
``--sac 1/2`` and ``--sac 3/4``: activation checkpointing on that share of the decoder blocks. Its first look left them
out ("not modelled": trainplan had no such knob). The knob was added afterwards, for what torchtitan and Megatron-Core
offer, without these records' measured values; this script predicts them once with it. The set file stays as it was
frozen: each such row is read with ``activation_checkpointing: full`` and ``knobs.checkpoint_fraction`` set to its ratio
(FSDP_sAC.py's help: "for a given ac ratio p, we should essentially apply ac on every 1/p blocks"; which blocks a ratio of
3/4 wraps is in its utils.py, not published — trainplan takes ⌊L·p⌋ of them, evenly spread). No change may be chosen by
what this prints.

    python benchmarks/partial_checkpointing.py
"""

from __future__ import annotations

import copy
import statistics
from fractions import Fraction
from pathlib import Path

import yaml

from trainplan.estimate.published import compare

SET = Path(__file__).resolve().parents[1] / "tests" / "data" / "published_heldout14.yaml"


def with_share(rec: dict) -> dict | None:
    """The record with its checkpointed share as trainplan's knob; None when it checkpoints no share of the blocks."""
    ratio = str((rec.get("knobs_as_collected") or {}).get("sac_ratio", ""))
    if "/" not in ratio:
        return None
    out = copy.deepcopy(rec)
    out.pop("not_modelled", None)
    out["activation_checkpointing"] = "full"
    out["knobs"] = {**(out.get("knobs") or {}), "checkpoint_fraction": float(Fraction(ratio))}
    return out


def main() -> None:
    errors = []
    print(f"{'record':72} {'share':>5} {'predicted':>9} {'measured':>8} {'err':>7}")
    for rec in yaml.safe_load(SET.read_text()):
        shared = with_share(rec)
        if shared is None:
            continue
        c = compare(shared)
        if c is None or not c.measured_peak_gib:
            print(f"{rec['id']:72} not compared")
            continue
        err = c.predicted_peak_gib / c.measured_peak_gib - 1
        errors.append(err)
        share = shared["knobs"]["checkpoint_fraction"]
        print(f"{rec['id']:72} {share:5.2f} {c.predicted_peak_gib:9.1f} {c.measured_peak_gib:8.1f} {err:+7.1%}")
    if errors:
        print(f"\n{len(errors)} runs: median |err| {statistics.median(abs(e) for e in errors):.1%}, "
              f"median {statistics.median(errors):+.1%}, worst {max(errors, key=abs):+.1%}")


if __name__ == "__main__":
    main()
