"""A LoRA job's frozen block under PEFT, byte by byte: trainplan's count against what autograd saves.

One block past the first adapted one (a 5-block model less a 4-block one), bf16 base, PEFT adapters in fp32 (its
default since 0.11) and in bf16, on CPU with saved-tensor hooks (``benchmarks/lora_saved_bytes.py`` prints the same).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("peft")
pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import lora_saved_bytes as bench  # noqa: E402

PER = bench.SEQ * bench.BATCH  # tokens; both sides are bytes of one block


@pytest.mark.parametrize("targets", bench.TARGETS, ids="+".join)
def test_peft_fp32_adapters_keep_what_trainplan_counts(targets: list[str]) -> None:
    """Each adapted layer keeps its own fp32 copy of its input and its fp32 lora_A output; the 16-bit input only
    where a bf16 reader still needs it; a frozen SwiGLU keeps 3e·f."""
    assert bench.predicted(targets) == pytest.approx(bench.measured(targets, fp32_adapters=True))


@pytest.mark.parametrize("targets", [t for t in bench.TARGETS if "o_proj" not in t], ids="+".join)
def test_bf16_adapters_share_their_input(targets: list[str]) -> None:
    """With 16-bit adapters (PEFT before 0.11, or autocast_adapter_dtype=False) lora_A reads the shared input.  The
    output projection is left out here: on CPU the SDPA kernel's output and o_proj's contiguous copy share one storage,
    where CUDA's flash kernel returns (B, H, S, D) and the copy is a tensor of its own (trainplan counts the copy)."""
    assert bench.predicted(targets, fp32_adapters=False) == pytest.approx(bench.measured(targets, fp32_adapters=False))


def test_the_fp32_copies_are_the_difference() -> None:
    # q alone: the fp32 copy (4·h) and fp32 lora_A output (4·r) replace the shared bf16 input (2·h) and 2·r
    h, r = bench.CONFIG["hidden_size"], bench.RANK
    assert bench.predicted(["q_proj"]) - bench.predicted(["q_proj"], fp32_adapters=False) == PER * (2 * h + 2 * r)
