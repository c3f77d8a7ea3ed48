"""Compare the analytic estimator with published, measured training runs.

The records live in ``tests/data/published_llm.yaml`` (throughput and verdicts, each with its source) and
``tests/data/published_stacks.yaml`` (per-GPU memory by training stack) — both in-sample: mechanisms were kept or
dropped by how they moved these records — and ``tests/data/published_heldout.yaml``, a set frozen before the
changes it judges and never used to choose one (issue 22).
This module turns one record into a job and hardware, runs the estimator with
its *default* efficiencies, and reports predicted against measured throughput,
peak memory and the fit / no-fit verdict.  Used by the golden tests and by
``benchmarks/validate_published.py``; nothing here is tuned per record.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from trainplan.catalog import Catalog, get_catalog
from trainplan.errors import TrainplanError
from trainplan.estimate.memory import GIB
from trainplan.estimate.result import Estimate
from trainplan.estimate.stack import KNOB_NAMES
from trainplan.estimate.transformer import estimate_transformer
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.spec import ModelArch, TransformerJob, parse_job
from trainplan.strategies import Strategy

SUPPORTED_PRECISIONS = ("bf16", "fp16", "fp32", "bf16-pure", "fp8")


@dataclass(frozen=True)
class Comparison:
    id: str
    predicted_tokens_per_s_per_gpu: float | None
    measured_tokens_per_s_per_gpu: float | None
    predicted_peak_gib: float
    measured_peak_gib: float | None
    predicted_fits: bool
    measured_fits: bool | None
    reason: str | None
    predicted_borderline: bool = False  # within the estimator's error band of the capacity (Estimate.borderline)

    @property
    def throughput_error(self) -> float | None:
        """(predicted − measured) / measured."""
        if not self.predicted_tokens_per_s_per_gpu or not self.measured_tokens_per_s_per_gpu:
            return None
        return self.predicted_tokens_per_s_per_gpu / self.measured_tokens_per_s_per_gpu - 1.0


def _model(value: Any) -> Any:
    if isinstance(value, dict):
        return ModelArch(**{k: v for k, v in value.items() if k in ModelArch.model_fields and k != "name"})
    return value


# The stack a record's source trains with, when the record does not name it (its id names the source).
STACK_BY_SOURCE = {"llmfoundry": "llm-foundry", "torchtune": "torchtune", "litgpt": "litgpt"}
KNOB_KEYS = KNOB_NAMES  # a record's knobs are the job file's (estimate/stack.py)


def record_stack(rec: dict[str, Any]) -> str:
    """The record's stack: as it states, else the one its source is (llm-foundry's tables are llm-foundry runs)."""
    return str(rec.get("stack") or STACK_BY_SOURCE.get(str(rec["id"]).split("-")[0], "plain"))


# transformers v4.36.0 (December 2023) made PyTorch SDPA the default attention of the models it covers; before it,
# every Hugging Face model computed attention eagerly (the s x s scores kept for backward)
_SDPA_SINCE = (4, 36)
_TRANSFORMERS_VERSION = re.compile(r"transformers[ =v]*([0-9]+)\.([0-9]+)", re.IGNORECASE)
_SDPA_DATE = (2023, 12)
_MONTHS = {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_MONTH_YEAR = re.compile(r"\b(jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?,? (20[0-9][0-9])\b", re.IGNORECASE)
_HUGGING_FACE = re.compile(r"\b(transformers|HF|Hugging Face)\b", re.IGNORECASE)


# a framework line naming the flash-attention kernel the run chose (transformers' attn_implementation
# "flash_attention_2", the kernels hub's "kernels-community/vllm-flash-attn3", Axolotl's "flash_attention: true")
_FLASH_KERNEL = re.compile(r"vllm-flash-attn3|flash_attention_2|flash_attention:? true", re.IGNORECASE)


def record_flash_attention(rec: dict[str, Any]) -> bool | None:
    """The record's attention: as it states; else the flash-attention kernel its framework line names; else eager when it names a transformers release before SDPA (or, naming
    none, a Hugging Face framework dated before that release); else None (the job's default, SDPA)."""
    if rec.get("flash_attention") is not None:
        return bool(rec["flash_attention"])
    if _FLASH_KERNEL.search(str(rec.get("framework", ""))):
        return True
    text = f"{rec.get('framework', '')} {rec.get('notes', '')}"
    versions = [(int(a), int(b)) for a, b in _TRANSFORMERS_VERSION.findall(text)]
    if versions:
        return False if max(versions) < _SDPA_SINCE else None
    # no release named: the date the framework line gives, for a Hugging Face model
    framework = str(rec.get("framework", ""))
    dates = [(int(y), _MONTHS[m[:3].lower()]) for m, y in _MONTH_YEAR.findall(framework)]
    if dates and _HUGGING_FACE.search(framework) and max(dates) < _SDPA_DATE:
        return False
    return None


def framework_knobs(rec: dict[str, Any]) -> dict[str, Any]:
    """What the software a record names does, where the record's stack would say otherwise.

    torchtitan's selective checkpointing (``activation_checkpoint.mode = "selective"``, option ``op``) keeps every
    other matmul's output (``torchtitan/distributed/activation_checkpoint.py``: its policy saves an ``mm`` only on
    alternate calls; read for fb8f227): a record whose ``framework`` is torchtitan is read with that policy unless it
    states another.  Its stack, and so its loss, stay the record's — torchtitan before 0.3.0 computed the loss over
    the whole up-cast logits, which is stack ``plain``'s loss, not the ``torchtitan`` stack's chunked one — but with
    compile on, torchtitan compiles the loss too (its compile components default to model and loss), which stack
    ``plain`` does not assume.

    The Hugging Face Trainer's default ``optim`` is ``adamw_torch_fused`` only with torch 2.8 or later
    (``training_args.py``: ``if is_torch_greater_or_equal_than_2_8: default_optim = "adamw_torch_fused"``, else
    ``adamw_torch``, the foreach AdamW): an ``hf-trainer`` record whose framework names an earlier torch runs foreach,
    unless it states otherwise (the stack's default follows the current release).  Likewise PEFT's fp32 adapters
    (``autocast_adapter_dtype=True``) arrived in PEFT 0.11: a record naming an earlier PEFT has 16-bit adapters.
    """
    knobs: dict[str, Any] = {}
    torch = _stated_version(rec, "torch")
    if record_stack(rec) == "hf-trainer" and torch is not None and torch < (2, 8):
        knobs["fused_optimizer"] = False  # the Trainer's optim is adamw_torch (foreach) before torch 2.8
    peft = _stated_version(rec, "peft")
    if peft is not None and peft < (0, 11) and rec.get("method") in ("lora", "qlora"):
        knobs["lora_fp32_adapters"] = False  # PEFT casts adapters to fp32 from 0.11 (autocast_adapter_dtype, PR #1706)
    if "benchmark_litgpt" in str(rec.get("framework", "")):
        # lightning-thunder's benchmark script trains LitGPT's model but not LitGPT's loop: F.cross_entropy over the
        # whole logits as the model returns them, outside the compiled model (its train loop)
        knobs.update(loss="full", loss_upcast=False)
        if (rec.get("knobs") or {}).get("compile"):
            knobs["compile_loss"] = False
    titan = "torchtitan" in str(rec.get("framework", "")).lower()
    if titan and rec.get("activation_checkpointing") == "selective":
        knobs["selective_recompute"] = "alternate-matmuls"
    if titan and (rec.get("knobs") or {}).get("compile"):
        knobs["compile_loss"] = True  # torchtitan's compile components: ["model", "loss"] by default
    return knobs


def _stated_version(rec: dict[str, Any], package: str) -> tuple[int, int] | None:
    """(major, minor) of a package a record's framework names ("torch 2.4.1", "torch==2.1.0", "PyTorch 2.1",
    "peft 0.10.0"), else None."""
    prefix = "(?:py)?torch" if package == "torch" else re.escape(package)
    found = re.search(rf"(?:^|[^\w.]){prefix}\s*(?:==|=|\s)\s*v?(\d+)\.(\d+)", str(rec.get("framework", "")), re.I)
    return (int(found.group(1)), int(found.group(2))) if found else None


def record_to_job(rec: dict[str, Any]) -> TransformerJob | None:
    """The job a published record describes, or None if trainplan does not model it (fp8, tensor parallel, or what
    the record's ``not_modelled`` names: a compiler or optimizer trainplan has no knob for)."""
    if rec.get("not_modelled"):
        return None
    if rec.get("precision", "bf16") not in SUPPORTED_PRECISIONS:
        return None
    if rec.get("strategy") not in {s.value for s in Strategy} or "seq_len" not in rec:
        return None
    data: dict[str, Any] = {
        "kind": "transformer",
        "name": rec["id"],
        "model": _model(rec["model"]),
        "method": rec.get("method", "full"),
        "seq_len": rec["seq_len"],
        "micro_batch": rec.get("micro_batch", 1),
        "precision": rec.get("precision", "bf16"),
        "optimizer": rec.get("optimizer", "adamw"),
        "activation_checkpointing": rec.get("activation_checkpointing", "none"),
        "steps": 1,
        "stack": record_stack(rec),
    }
    knobs = {k: v for k, v in (rec.get("knobs") or {}).items() if k in KNOB_KEYS}
    knobs = {**framework_knobs(rec), **knobs}
    if knobs:
        data["knobs"] = knobs
    if rec.get("global_batch"):
        data["global_batch"] = rec["global_batch"]
    flash = record_flash_attention(rec)
    if flash is not None:
        data["flash_attention"] = flash
    if rec.get("lora"):
        data["lora"] = rec["lora"]
    try:
        job = parse_job(data)
    except TrainplanError:
        return None
    assert isinstance(job, TransformerJob)
    return job


#: GPU names a frozen record keeps as its source printed them, and the catalog row that part has (the records' own
#: notes identify it: "GPU printed as '1xA6000' (NVIDIA RTX A6000, 48 GB)", "RTX 6000 Ada 48GB (as stated 'RTX
#: A6000ada 48GB'; 47.48 GiB total capacity)"); read only once the row exists (2026-12-07)
PRINTED_GPU_NAMES = {"A6000": "RTXA6000", "RTX6000-Ada-48GB": "RTX6000Ada"}


def _estimated(rec: dict[str, Any], cat: Catalog) -> Estimate | str:
    """The estimate of the run a record describes, or why there is none: its own ``not_modelled``, a job trainplan
    refuses, a GPU without a catalog row, or the estimate's one-line refusal."""
    if rec.get("not_modelled"):
        return str(rec["not_modelled"])
    job = record_to_job(rec)
    if job is None:
        return "trainplan refuses its configuration"
    hw_rec = rec.get("hardware", {})
    printed = hw_rec.get("accelerator", "")
    acc = cat.accelerators.get(PRINTED_GPU_NAMES.get(printed, printed))
    if acc is None:
        return f"no catalog row for {hw_rec.get('accelerator')!r}"
    try:
        hw = hardware_for_gpu(acc, cat, gpus=int(hw_rec.get("gpus_per_node", 1)), nodes=int(hw_rec.get("nodes", 1)))
        return estimate_transformer(job, hw, Strategy(rec["strategy"]), cat)
    except TrainplanError as exc:
        return str(exc)


def why_not_compared(rec: dict[str, Any], catalog: Catalog | None = None) -> str:
    """Why :func:`compare` gives None for ``rec`` (``_estimated``), or "compared"."""
    e = _estimated(rec, catalog or get_catalog())
    return e if isinstance(e, str) else "compared"


def compare(rec: dict[str, Any], catalog: Catalog | None = None) -> Comparison | None:
    """Predicted vs measured for one record; None when the record is outside what trainplan models."""
    e = _estimated(rec, catalog or get_catalog())
    if isinstance(e, str):
        return None
    hw_rec = rec.get("hardware", {})
    gpn = int(hw_rec.get("gpus_per_node", 1))
    nodes = int(hw_rec.get("nodes", 1))
    m = rec.get("measured", {})
    world = gpn * nodes
    tps = m.get("tokens_per_s_per_gpu")
    if tps is None and m.get("tokens_per_s"):
        tps = m["tokens_per_s"] / world
    peak = m.get("peak_memory_gib")
    if peak is None and m.get("peak_memory_gb"):
        peak = m["peak_memory_gb"] * 1e9 / GIB
    if peak is None and m.get("peak_memory_mib"):  # the figure as a source printed it in MiB
        peak = m["peak_memory_mib"] / 1024
    # compare like with like: what the source read (allocated, reserved, or the whole device as nvidia-smi shows)
    kind = rec.get("memory_kind", "unknown")
    predicted = {"allocated": e.memory.allocated, "reserved": e.memory.reserved}.get(kind, e.memory.peak)
    if kind == "nvidia-smi" and rec.get("context_mib"):
        # the device as nvidia-smi shows it: the allocator's pool plus the context the same source measured
        predicted = e.memory.reserved + rec["context_mib"] * 2**20
    return Comparison(
        id=rec["id"],
        predicted_tokens_per_s_per_gpu=e.throughput / world if e.throughput else None,
        measured_tokens_per_s_per_gpu=tps,
        predicted_peak_gib=predicted / GIB,
        measured_peak_gib=peak,
        predicted_fits=e.fits,
        measured_fits=m.get("fits"),
        reason=e.reason,
        predicted_borderline=e.borderline,
    )


@dataclass(frozen=True)
class MemoryErrors:
    """|predicted / measured − 1| of the peak, per stack, for a set of records."""

    by_stack: dict[str, list[float]] = field(default_factory=dict)

    @property
    def all(self) -> list[float]:
        return [e for v in self.by_stack.values() for e in v]

    @property
    def median(self) -> float | None:
        return statistics.median(self.all) if self.all else None

    def percentile(self, p: int) -> float | None:
        """The p-th percentile of |error| (``statistics.quantiles``, inclusive method: linear between order statistics)."""
        v = self.all
        if len(v) < 2:
            return v[0] if v else None
        return statistics.quantiles(v, n=100, method="inclusive")[p - 1]


def memory_errors(records: Iterable[dict[str, Any]], *, heldout: bool | None = None,
                  catalog: Catalog | None = None) -> MemoryErrors:  # fmt: skip
    """Peak-memory errors of the records with a measured peak (``heldout``: only those, or only the others)."""
    by: dict[str, list[float]] = {}
    for rec in records:
        if heldout is not None and bool(rec.get("heldout")) != heldout:
            continue
        c = compare(rec, catalog)
        if c is None or not c.measured_peak_gib:
            continue
        by.setdefault(record_stack(rec), []).append(abs(c.predicted_peak_gib / c.measured_peak_gib - 1.0))
    return MemoryErrors(by)
