"""The built-in catalog: accelerators, instances, clouds, model presets, assumptions.

Use :func:`get_catalog` (loaded once per process) and the lookups below, which
raise :class:`~trainplan.errors.CatalogError` with close matches on a miss.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainplan.catalog.loader import (
    DATA_DIR,
    Accelerator,
    Catalog,
    CatalogIssue,
    CloudTerms,
    Instance,
    load_catalog,
)
from trainplan.errors import CatalogError, SpecError

__all__ = [
    "DATA_DIR",
    "Accelerator",
    "Catalog",
    "CatalogIssue",
    "CloudTerms",
    "Instance",
    "find_accelerator",
    "find_instance",
    "get_catalog",
    "load_catalog",
    "resolve_model",
]


@lru_cache(maxsize=1)
def get_catalog() -> Catalog:
    """The built-in catalog, loaded and validated once."""
    return load_catalog(DATA_DIR)


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name.lower())


def _close(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=4, cutoff=0.5)
    return f"; close matches: {', '.join(close)}" if close else f"; known: {', '.join(sorted(choices))}"


def find_accelerator(name: str, catalog: Catalog | None = None, *, field: str = "--gpu") -> Accelerator:
    """Case-insensitive lookup of a canonical accelerator ID.

    An ambiguous prefix (``A100``) is an error that lists the choices.
    """
    cat = catalog or get_catalog()
    by_norm = {_norm(k): v for k, v in cat.accelerators.items()}
    hit = by_norm.get(_norm(name))
    if hit is not None:
        return hit
    prefixed = sorted(k for k in cat.accelerators if _norm(k).startswith(_norm(name)))
    if len(prefixed) == 1:
        return cat.accelerators[prefixed[0]]
    if len(prefixed) > 1:
        raise CatalogError(f"{name!r} is ambiguous; choose one of {', '.join(prefixed)}", field=field)
    raise CatalogError(f"unknown accelerator {name!r}{_close(name, list(cat.accelerators))}", field=field)


def find_instance(name: str, catalog: Catalog | None = None, *, field: str = "--instance") -> Instance:
    cat = catalog or get_catalog()
    hits = [i for i in cat.instances if i.name.lower() == name.lower()]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise CatalogError(
            f"{name!r} is in several clouds ({', '.join(i.cloud for i in hits)}); write CLOUD:NAME", field=field
        )
    if ":" in name:
        cloud, _, bare = name.partition(":")
        hits = [i for i in cat.instances if i.cloud == cloud.lower() and i.name.lower() == bare.lower()]
        if hits:
            return hits[0]
    raise CatalogError(f"unknown instance {name!r}{_close(name, [i.name for i in cat.instances])}", field=field)


# ----------------------------------------------------------------------------- models


def _arch_from_hf_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """Map a Hugging Face ``config.json`` onto trainplan's architecture fields.

    Key names follow the transformers configuration classes (LlamaConfig,
    MistralConfig, GPT2Config, OPTConfig, BertConfig, T5Config).
    """
    mt = str(cfg.get("model_type", "")).lower()

    def first(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        return default

    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head", "num_heads")
    layers = first("num_hidden_layers", "n_layer", "num_layers")
    if hidden is None or heads is None or layers is None:
        raise ValueError("config.json lacks hidden size, attention heads or layer count")
    out: dict[str, Any] = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": first("num_key_value_heads", default=heads),
        "vocab": first("vocab_size"),
        "tied_embeddings": bool(first("tie_word_embeddings", default=mt in ("gpt2", "t5", "opt", "bert"))),
        "max_seq_len": first("max_position_embeddings", "n_positions", "n_ctx"),
        "name": first("_name_or_path", default=mt or None) or None,
    }
    if cfg.get("head_dim") is not None and cfg["head_dim"] * heads != hidden:
        out["head_dim"] = cfg["head_dim"]
    if mt in ("llama", "mistral", "qwen2", "gemma"):
        out.update(mlp="swiglu", ffn_hidden=cfg["intermediate_size"], position="rope", norm="rmsnorm", bias=False)
    elif mt == "gpt2":
        out.update(mlp="gelu", ffn_hidden=first("n_inner", default=4 * hidden), position="learned",
                   norm="layernorm", bias=True)  # fmt: skip
    elif mt == "opt":
        out.update(mlp="gelu", ffn_hidden=cfg["ffn_dim"], position="learned", norm="layernorm", bias=True,
                   extra_embedding_params=2 * hidden)  # fmt: skip
    elif mt == "bert":
        out.update(arch="encoder", mlp="gelu", ffn_hidden=cfg["intermediate_size"], position="learned",
                   norm="layernorm", bias=True)  # fmt: skip
    elif mt == "t5":
        d_kv = cfg.get("d_kv", hidden // heads)
        out.update(arch="encoder-decoder", mlp="swiglu" if "gated" in str(cfg.get("feed_forward_proj", "")) else "gelu",
                   ffn_hidden=cfg["d_ff"], position="relative", norm="rmsnorm", bias=False,
                   decoder_layers=cfg.get("num_decoder_layers") or layers)  # fmt: skip
        if d_kv * heads != hidden:
            out["head_dim"] = d_kv
    else:
        ffn = first("intermediate_size", "ffn_dim", "n_inner", "d_ff")
        if ffn is None:
            raise ValueError(f"unsupported model_type {mt!r}; give the architecture as a mapping")
        out.update(ffn_hidden=ffn, mlp="swiglu" if cfg.get("hidden_act") == "silu" else "gelu")
    return out


def resolve_model(model: Any, *, source: str | None = None):  # -> ModelArch
    """A preset name, a path to a Hugging Face ``config.json``, or a ModelArch → ModelArch."""
    from trainplan.spec import ModelArch

    if isinstance(model, ModelArch):
        return model
    name = str(model)
    presets = get_catalog().models
    key = name.lower()
    if key in presets:
        entry = {k: v for k, v in presets[key].items() if k in ModelArch.model_fields}
        return ModelArch(**entry, name=key)
    path = Path(name)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise SpecError(f"config file not found: {name}", field="model", source=source)
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
            return ModelArch(**_arch_from_hf_config(cfg))
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            msg = str(exc).splitlines()[0]
            raise SpecError(f"cannot read {name} as a Hugging Face config: {msg}", field="model", source=source) from None
    raise SpecError(f"unknown model preset {name!r}{_close(key, list(presets))}", field="model", source=source)
