"""Cross-check of trainplan's parameter count against transformers building the same config on the meta device.

transformers is the reference for what a ``config.json`` builds (``accelerate estimate-memory`` counts the same
way: ``init_empty_weights`` then ``sum(p.numel())``).  The build allocates nothing (meta tensors), takes
0.02-1 s, and is cached per config; it runs only where transformers is installed, and reading a config never
depends on it.  DeepSeek-V3's multi-token-prediction modules are not built by transformers (its
``_keys_to_ignore_on_load_unexpected`` drops them) and are left out of the comparison.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import json
import logging
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainplan.estimate.architecture import param_counts
from trainplan.files import trainplan_home, write_json_atomic
from trainplan.hfconfig import ConfigRefused, arch_from_hf_config, buildable
from trainplan.model import ModelArch


class CountMismatch(ValueError):
    """trainplan's count differs from transformers': the architecture is not understood exactly."""


def transformers_available() -> bool:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@lru_cache(maxsize=256)
def _count(cfg_json: str) -> int | None:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads(cfg_json)
    mt = cfg.pop("model_type")
    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        # transformers' own warnings about the config (e.g. a token id outside the vocabulary) stay out of the
        # user's terminal: what matters is whether it builds, and a config it cannot build is refused in one line
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), torch.device("meta"):
            warnings.simplefilter("ignore")
            logging.disable(logging.WARNING)
            try:
                config = AutoConfig.for_model(mt, **cfg)
            except (ValueError, KeyError):
                return None  # this transformers release does not know the family
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - the reference library refuses the config: so must trainplan, in one line
        # e.g. a pad_token_id left at the family's default beyond a smaller vocab_size (torch's Embedding asserts)
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigRefused(f"{mt} config: transformers {transformers.__version__} cannot build this model "
                            f"({type(exc).__name__}: {first})") from None
    finally:
        logging.disable(logging.NOTSET)
        transformers.logging.set_verbosity(previous)
    return sum(p.numel() for p in model.parameters())


CACHE_NAME = "hf_param_counts.json"


def _transformers_version() -> str | None:
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def transformers_param_count(cfg: dict[str, Any]) -> int | None:
    """Parameters of the causal LM transformers builds from ``cfg`` on the meta device; None where transformers
    (or this family in the installed release) is missing.

    Counts are kept in ``$TRAINPLAN_HOME/hf_param_counts.json`` keyed by the config and the transformers
    version, so a later ``plan`` of the same config does not import transformers (about 2 s) again.
    """
    version = _transformers_version()
    if version is None:
        return None
    keep = {k: v for k, v in buildable(cfg).items() if k not in ("architectures", "auto_map", "quantization_config",
                                                                 "_name_or_path", "transformers_version")}  # fmt: skip
    key = hashlib.sha256(f"{version}\n{json.dumps(keep, sort_keys=True, default=str)}".encode()).hexdigest()
    store = trainplan_home() / CACHE_NAME
    try:
        cached = json.loads(store.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(key), int):
        return cached[key]
    if not transformers_available():
        return None
    n = _count(json.dumps(keep, sort_keys=True, default=str))
    if n is not None and isinstance(cached, dict):
        with contextlib.suppress(OSError):
            store.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(store, {**cached, key: n})
    return n


def cross_check(arch: ModelArch, cfg: dict[str, Any]) -> int | None:
    """Compare ``arch``'s count (read from ``cfg``) with transformers'; raise :class:`CountMismatch` on a
    difference, return transformers' count (None when it could not be built here)."""
    reference = transformers_param_count(cfg)
    if reference is None:
        return None
    counts = param_counts(arch)
    ours = counts.total - counts.mtp
    if ours != reference:
        raise CountMismatch(
            f"{arch.hf_model_type} config: trainplan counts {ours:,} parameters, transformers builds {reference:,} "
            f"({ours - reference:+,}); refusing to plan a model it does not read exactly"
        )
    return reference


def read_hf_config(cfg: dict[str, Any]) -> ModelArch:
    """``cfg`` read by trainplan and, where transformers is installed, checked against the model transformers
    builds from it: a mismatch raises :class:`CountMismatch`, never a plan."""
    arch = arch_from_hf_config(cfg)
    if arch.hf_model_type:
        cross_check(arch, cfg)
    return arch


def check_model_file(model: object) -> None:
    """Cross-check a job's ``model:`` when it names a ``config.json`` or a checkpoint directory (presets are
    checked by the tests)."""
    if not isinstance(model, str):
        return
    path = Path(model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    elif not model.endswith(".json"):
        return
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # resolve_model has already reported an unreadable file
    if isinstance(cfg, dict):
        read_hf_config(cfg)
