"""The planning page's form → a job, validated by the job-spec code; and the answer the page shows.

Framework-free (the web app in :mod:`trainplan.serve.app` only moves JSON): :func:`job_from_form` builds the
job mapping a user would write in a job file and passes it through :func:`trainplan.parse_job`, so a bad
value gets exactly the one-line :class:`~trainplan.errors.SpecError` the CLI prints; :func:`answer` gives
the memory breakdown on the chosen GPUs and the ranked catalog options.
"""

from __future__ import annotations

import json
import math
import threading
from collections import OrderedDict
from typing import Any, Mapping

import yaml

from trainplan.catalog import find_accelerator, get_catalog
from trainplan.errors import SpecError, TrainplanError
from trainplan.estimate.hardware import hardware_for_gpu
from trainplan.estimate.hf_check import read_hf_config
from trainplan.planner.calibrated import efficiency_lookup
from trainplan.planner.core import estimate_option, plan_job
from trainplan.planner.this_machine import is_this_machine
from trainplan.spec import Job, Method, Precision, TransformerJob, parse_job
from trainplan.strategies import Strategy

AUTO = "auto"
TOP_OPTIONS = 15
DEFAULTS: dict[str, Any] = {
    "name": "web-job",
    "preset": "llama-7b",
    "hf_config": "",
    "method": "full",
    "precision": "bf16",
    "micro_batch": 4,
    "seq_len": 512,
    "tokens": "7.8e7",
    "strategy": AUTO,
    "gpu": "A100-80GB",
    "gpus": 8,
}
FORM_FIELDS = tuple(DEFAULTS) + ("global_batch",)


def choices() -> dict[str, list[str]]:
    """What the form's selects offer (the catalog's presets and GPUs, the spec's enums)."""
    cat = get_catalog()
    return {
        "preset": sorted(cat.models),
        "method": [m.value for m in Method],
        "precision": [p.value for p in Precision],
        "strategy": [AUTO] + [s.value for s in Strategy],
        "gpu": sorted(a.id for a in cat.accelerators.values() if a.kind in ("gpu", "tpu")),
    }


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def _number(v: Any, field: str) -> Any:
    """Form inputs arrive as text: '4' → 4, '7.8e7' → 7.8e7, '' → None; anything else goes to the spec as it is."""
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return None
        for conv in (int, float):
            try:
                v = conv(s)
                break
            except ValueError:
                continue
    if isinstance(v, float) and not math.isfinite(v):
        raise SpecError(f"must be a finite number, got {v}", field=field)
    return v


def _model(form: Mapping[str, Any]) -> Any:
    """The preset name, or the pasted Hugging Face config.json read as an architecture mapping."""
    text = form.get("hf_config")
    if _blank(text):
        preset = form.get("preset") or DEFAULTS["preset"]
        if not isinstance(preset, str) or preset.lower() not in get_catalog().models:
            # never a path: resolve_model would read a file on the server (and the answer tell whether it exists)
            import difflib

            close = difflib.get_close_matches(str(preset).lower(), list(get_catalog().models), n=3)
            hint = f" (close: {', '.join(close)})" if close else ""
            raise SpecError(f"unknown preset{hint}; choose one from the list or paste a config.json", field="preset")
        return preset
    try:
        cfg = json.loads(str(text))
    except json.JSONDecodeError as exc:
        raise SpecError(f"pasted config.json is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", field="model") from None
    if not isinstance(cfg, dict):
        raise SpecError("pasted config.json must be a JSON object", field="model")
    try:
        arch = read_hf_config(cfg)
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"cannot read the pasted config.json: {str(exc).splitlines()[0]}", field="model") from None
    return arch.model_dump(mode="json", exclude_none=True, exclude_defaults=True)


def job_mapping(form: Mapping[str, Any]) -> dict[str, Any]:
    """The job file (as a mapping) the form describes; unknown form fields are errors, like in a job file."""
    unknown = sorted(set(form) - set(FORM_FIELDS))
    if unknown:
        raise SpecError(f"unknown field; allowed: {', '.join(FORM_FIELDS)}", field=unknown[0])
    f = {**DEFAULTS, **form}  # a field left out takes its default; one left blank is an error of the spec
    job: dict[str, Any] = {
        "name": str(f["name"]),
        "kind": "transformer",
        "model": _model(f),
        "task": "finetune",
        "method": f["method"],
        "precision": f["precision"],
        "micro_batch": _number(f["micro_batch"], "micro_batch"),
        "seq_len": _number(f["seq_len"], "seq_len"),
        "tokens": _number(f["tokens"], "tokens"),
    }
    if not _blank(form.get("global_batch")):
        job["global_batch"] = _number(form["global_batch"], "global_batch")
    return job


def job_from_form(form: Mapping[str, Any]) -> tuple[dict[str, Any], Job]:
    """(the job mapping, the validated job); :class:`SpecError` with one line naming the field otherwise."""
    mapping = job_mapping(form)
    return mapping, parse_job(mapping, catalog=get_catalog())


def job_yaml(mapping: Mapping[str, Any]) -> str:
    """The job file text for the export button (loads back with :func:`trainplan.load_job`)."""
    return "# exported by trainplan serve\n" + yaml.safe_dump(dict(mapping), sort_keys=False)


def _gpus(form: Mapping[str, Any]) -> int:
    n = _number(form.get("gpus", DEFAULTS["gpus"]), "gpus")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise SpecError(f"must be a whole number from 1 to 64, got {n!r}", field="gpus")
    return n


def _strategy(form: Mapping[str, Any]) -> Strategy | None:
    value = str(form.get("strategy") or AUTO)
    return None if value == AUTO else Strategy.parse(value, field="strategy")


def _row(e: Any, rank: int, pareto: bool) -> dict[str, Any]:
    d = e.to_dict()
    m = d["memory"]
    devices = f"{d['count'] * d['nodes']}×{d['accelerator']}" if d["accelerator"] else f"{d['vcpus']} vCPU"
    return {"rank": rank, "option": e.hardware.label, "devices": devices, "strategy": e.setup,
            "peak_gib": m["peak_gib"], "capacity_gib": m["capacity_gib"], "hours": d["hours"], "cost_usd": d["cost_usd"],
            "pareto": pareto, "this_machine": is_this_machine(e.hardware)}  # fmt: skip


class _Cache:
    """A small thread-safe LRU of answers by job and choices (a form re-sends the same values often)."""

    def __init__(self, size: int = 1024) -> None:
        self._data: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._size = size

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key: str, value: dict[str, Any]) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)


_CACHE = _Cache()


def answer(form: Mapping[str, Any], *, top: int = TOP_OPTIONS, cache: bool = True) -> dict[str, Any]:
    """What the page shows for ``form``: the job, its estimate on the chosen GPUs, the ranked options.

    Raises :class:`TrainplanError` (one line, naming the field) on a bad value.
    """
    mapping, job = job_from_form(form)
    assert isinstance(job, TransformerJob)
    catalog = get_catalog()
    gpus = _gpus(form)
    strategy = _strategy(form)
    acc = find_accelerator(str(form.get("gpu") or DEFAULTS["gpu"]), catalog, field="gpu")
    key = json.dumps([mapping, acc.id, gpus, strategy.value if strategy else AUTO, top], sort_keys=True, default=str)
    hit = _CACHE.get(key) if cache else None
    if hit is not None:
        return hit
    try:
        hw = hardware_for_gpu(acc, catalog, gpus=gpus)
        detail = estimate_option(job, hw, catalog, strategy=strategy)
    except TrainplanError:
        raise
    except ValueError as exc:  # e.g. a layout the strategy cannot take
        raise SpecError(str(exc).splitlines()[0], field="strategy") from None
    plan = plan_job(job, catalog, efficiency_for=efficiency_lookup(job), hints=False)  # the page shows no fit hints
    out = {
        "job": mapping,
        "job_yaml": job_yaml(mapping),
        "detail": dict(detail.to_dict(), option=hw.label, verdict=detail.memory_verdict()),
        "options": [_row(e, i + 1, i in plan.pareto) for i, e in enumerate(plan.options[:top])],
        "fit": len(plan.options),
        "rejected": len(plan.rejected),
        "warnings": list(plan.warnings),
    }
    if cache:
        _CACHE.put(key, out)
    return out
