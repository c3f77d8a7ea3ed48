"""Schema checks for tests/data/published_stacks.yaml (measured per-GPU memory by training stack, issue 8).

Data only: nothing here runs the estimator. Each record must say which stack ran it, how its memory was measured,
which stack knobs the source states, and carry a measured peak (or a reported out-of-memory).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "published_stacks.yaml"
MODELS = ROOT / "src" / "trainplan" / "catalog" / "data" / "models.yaml"

STACKS = {"hf-trainer", "torchtune", "litgpt", "llm-foundry", "accelerate", "lightning", "deepspeed", "plain"}
MEMORY_KINDS = {"allocated", "reserved", "nvidia-smi", "unknown"}
KNOB_TYPES: dict[str, type | tuple[type, ...]] = {
    "loss": str,
    "loss_chunks": int,
    "compile": bool,
    "optimizer_in_backward": bool,
    "activation_offloading": bool,
    "fused_optimizer": bool,
    "optimizer_8bit": bool,
    "paged_optimizer": bool,
    "quantization": str,
    "fsdp_frozen_weights": str,
    "deepspeed_buckets": dict,
    "frozen_weights_fp32": bool,
    "loss_upcast": bool,
    "qlora_fp32_params": bool,
    "tf32_matmul": bool,
    "fused_kernels": str,
    "lora_fp32_adapters": bool,
}
KNOB_VALUES = {
    "loss": {"full", "chunked", "fused"},
    "quantization": {"nf4", "int8", "none"},
    "fsdp_frozen_weights": {"sharded", "replicated"},
}
# Stacks with no published per-GPU memory table that could be found and read (see docs/validation-sources.md, section 5).
NO_PUBLISHED_TABLE = {
    "llm-foundry": (
        "scripts/train/benchmarking/README.md gives throughput/MFU only (already in published_llm.yaml); "
        "scripts/train/README.md gives a rule of thumb (cluster memory > 12 GB x billions of params), not a measurement"
    ),
}
REQUIRED = ("id", "source", "stack", "memory_kind", "model", "method", "hardware", "strategy", "measured", "notes")
PRECISIONS = {"fp32", "fp16", "bf16", "bf16-pure", "fp8"}
METHODS = {"full", "lora", "qlora"}
STRATEGIES = {"single", "ddp", "zero1", "zero2", "zero3", "zero2-offload", "zero3-offload", "fsdp", "fsdp-grad-op", "fsdp-offload",
              "megatron-tp"}
CHECKPOINTING = {"none", "selective", "full"}
LORA_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "all-linear"}
URL = re.compile(r"https?://\S+")
PINNED_GITHUB = re.compile(r"https://github\.com/[^/\s]+/[^/\s]+/blob/[0-9a-f]{40}/")


@pytest.fixture(scope="module")
def records() -> list[dict]:
    data = yaml.safe_load(DATA.read_text())
    assert isinstance(data, list) and data
    return data


@pytest.fixture(scope="module")
def presets() -> set[str]:
    return set(yaml.safe_load(MODELS.read_text()))


def test_ids_unique(records: list[dict]) -> None:
    counts = Counter(r.get("id") for r in records)
    assert all(isinstance(i, str) and i for i in counts), "every record needs a non-empty id"
    assert [i for i, n in counts.items() if n > 1] == []


def test_required_keys(records: list[dict]) -> None:
    for r in records:
        missing = [k for k in REQUIRED if k not in r]
        assert not missing, f"{r.get('id')}: missing {missing}"


def test_source_has_url(records: list[dict]) -> None:
    for r in records:
        urls = URL.findall(r["source"])
        assert urls, f"{r['id']}: source has no URL"
        github = [u for u in urls if u.startswith("https://github.com/")]
        assert all(PINNED_GITHUB.match(u) for u in github), f"{r['id']}: GitHub URL not pinned to a commit: {github}"


def test_stack_and_memory_kind(records: list[dict]) -> None:
    for r in records:
        assert r["stack"] in STACKS, f"{r['id']}: stack {r['stack']!r}"
        assert r["memory_kind"] in MEMORY_KINDS, f"{r['id']}: memory_kind {r['memory_kind']!r}"


def test_knobs(records: list[dict]) -> None:
    for r in records:
        knobs = r.get("knobs", {})
        assert isinstance(knobs, dict), f"{r['id']}: knobs must be a mapping"
        for key, value in knobs.items():
            assert key in KNOB_TYPES, f"{r['id']}: unknown knob {key!r}"
            assert isinstance(value, KNOB_TYPES[key]), f"{r['id']}: knob {key}={value!r}"
            if key in KNOB_VALUES:
                assert value in KNOB_VALUES[key], f"{r['id']}: knob {key}={value!r}"


def test_measured_peak(records: list[dict]) -> None:
    for r in records:
        m = r["measured"]
        peaks = [m[k] for k in ("peak_memory_gib", "peak_memory_gb") if k in m]
        oom = m.get("fits") is False
        assert peaks or oom, f"{r['id']}: no measured peak and no reported OOM"
        for p in peaks:
            assert isinstance(p, (int, float)) and 0 < p < 200, f"{r['id']}: peak {p!r}"
        if "peak_memory_mib" in m:
            assert m["peak_memory_gib"] == pytest.approx(m["peak_memory_mib"] / 1024, abs=1e-3), r["id"]
        assert m.get("fits") in (True, False), f"{r['id']}: measured.fits must be stated"


def test_job_fields_use_published_llm_values(records: list[dict], presets: set[str]) -> None:
    for r in records:
        model = r["model"]
        if isinstance(model, str):
            assert model in presets, f"{r['id']}: unknown preset {model!r}"
        else:
            assert {"layers", "hidden", "heads", "ffn_hidden", "vocab", "name"} <= set(model), f"{r['id']}: inline model incomplete"
        assert r["method"] in METHODS, r["id"]
        assert r["strategy"] in STRATEGIES, r["id"]
        assert r.get("precision", "bf16") in PRECISIONS, r["id"]
        assert r.get("activation_checkpointing", "none") in CHECKPOINTING, r["id"]
        hw = r["hardware"]
        assert isinstance(hw.get("accelerator"), str) and hw.get("gpus_per_node", 1) >= 1 and hw.get("nodes", 1) >= 1, r["id"]
        if r["method"] == "full":
            assert "lora" not in r, f"{r['id']}: lora block on a full fine-tune"
        if "lora" in r:
            assert set(r["lora"]["targets"]) <= LORA_TARGETS, r["id"]
            assert r["lora"]["rank"] > 0, r["id"]
        for key in ("seq_len", "micro_batch", "global_batch"):
            if key in r:
                assert isinstance(r[key], int) and r[key] > 0, f"{r['id']}: {key}"


def test_every_stack_covered(records: list[dict]) -> None:
    have = Counter(r["stack"] for r in records)
    for stack in STACKS:
        if stack in NO_PUBLISHED_TABLE:
            assert have[stack] == 0, f"{stack} has records but is listed in NO_PUBLISHED_TABLE"
            assert NO_PUBLISHED_TABLE[stack]
        else:
            assert have[stack] >= 1, f"no record for stack {stack}"


def test_heldout(records: list[dict]) -> None:
    held = [r for r in records if "heldout" in r]
    assert all(r["heldout"] is True for r in held), "heldout is either true or absent"
    share = len(held) / len(records)
    assert 0.15 <= share <= 0.35, f"heldout share {share:.0%}"
    stacks_with_records = {r["stack"] for r in records}
    assert {r["stack"] for r in held} == stacks_with_records, "every stack with records keeps at least one back"
