"""The built-in catalog: accelerators, instances, clouds, model presets, assumptions.

Use :func:`get_catalog` (loaded once per process) and the lookups below, which
raise :class:`~trainplan.errors.CatalogError` with close matches on a miss.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from trainplan.catalog.loader import (
    DATA_DIR,
    Accelerator,
    Catalog,
    CatalogIssue,
    CloudTerms,
    Instance,
    apply_overlay,
    load_catalog,
)
from trainplan.errors import CatalogError, SpecError
from trainplan.files import trainplan_home
from trainplan.hfconfig import arch_from_hf_config
from trainplan.model import ModelArch

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
    "CATALOG_ENV",
    "user_catalog_dir",
    "resolve_model",
]


CATALOG_ENV = "TRAINPLAN_CATALOG"


def user_catalog_dir() -> Path | None:
    """The user's catalog directory: ``$TRAINPLAN_CATALOG`` (set by ``--catalog DIR``), else
    ``$TRAINPLAN_HOME/catalog`` when it exists; None when there is none."""
    env = os.environ.get(CATALOG_ENV)
    if env:
        return Path(env).expanduser()
    default = trainplan_home() / "catalog"
    return default if default.is_dir() else None


@lru_cache(maxsize=1)
def builtin_catalog() -> Catalog:
    """The catalog shipped with trainplan, loaded and validated once."""
    return load_catalog(DATA_DIR)


@lru_cache(maxsize=8)
def _with_overlay(directory: str, stamp: tuple[tuple[str, int, int], ...]) -> Catalog:
    return apply_overlay(builtin_catalog(), directory)


def get_catalog() -> Catalog:
    """The built-in catalog with the user's own rows (:func:`user_catalog_dir`) added or overriding."""
    d = user_catalog_dir()
    if d is None:
        return builtin_catalog()
    # re-read when a file of the directory changes (its name, size and modification time)
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(d.glob("*.csv"))) if d.is_dir() else ()
    return _with_overlay(str(d), stamp)


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


def checkpoint_dir(model: object) -> Path | None:
    """The job's ``model:`` as a checkpoint directory, or None (a preset, a config.json, an inline model)."""
    if not isinstance(model, str):
        return None
    path = Path(model).expanduser()
    return path if path.is_dir() else None


def resolve_model(model: str | ModelArch, catalog: Catalog | None = None, *, source: str | None = None) -> ModelArch:
    """A preset name (from ``catalog``, the built-in one by default), a path to a Hugging Face ``config.json``
    or to a checkpoint directory holding one, or a :class:`ModelArch` → :class:`ModelArch`."""
    if isinstance(model, ModelArch):
        return model
    name = str(model)
    presets = (catalog or get_catalog()).models
    key = name.lower()
    if key in presets:
        if "hf_config" in presets[key]:  # a published config.json, read like a user's
            return arch_from_hf_config(presets[key]["hf_config"]).model_copy(update={"name": key})
        entry = {k: v for k, v in presets[key].items() if k in ModelArch.model_fields}
        return ModelArch(**entry, name=key)
    path = Path(name).expanduser()
    if path.is_dir():  # a checkpoint directory as save_pretrained writes it: its config.json is the architecture
        if not (path / "config.json").is_file():
            raise SpecError(f"{name} is a directory without config.json (a checkpoint directory as save_pretrained "
                            "writes it: config.json, *.safetensors, tokenizer files)", field="model", source=source)
        path = path / "config.json"
        name = str(path)
    if path.suffix == ".json" or path.is_file():
        if not path.is_file():
            raise SpecError(f"config file not found: {name}", field="model", source=source)
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
            return arch_from_hf_config(cfg)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            msg = f"{where + ': ' if where else ''}{err['msg'].removeprefix('Value error, ')}"
            raise SpecError(f"cannot read {name} as a Hugging Face config: {msg}", field="model", source=source) from None
        except (ValueError, KeyError, TypeError) as exc:
            msg = str(exc).splitlines()[0]
            raise SpecError(f"cannot read {name} as a Hugging Face config: {msg}", field="model", source=source) from None
    raise SpecError(f"unknown model preset {name!r}{_close(key, list(presets))}", field="model", source=source)
