"""Where the model comes from: a factory path (``"pkg.module:function"``) or a Hugging Face config."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from trainplan.estimate.trace.errors import TraceError, one_line

__all__ = ["build_hf_causal_lm", "load_factory"]


def load_factory(path: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` (the attribute may be dotted: ``mod:Class.build``).

    The current directory is searched too, as ``python -c`` would.  Raises
    :class:`TraceError` naming the path and what went wrong.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TraceError(f"model factory must be 'package.module:function', got {path!r}")
    added = os.getcwd() not in sys.path
    if added:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise TraceError(f"cannot import module {module_name!r} of model factory {path!r}: {exc}") from exc
    except Exception as exc:  # the module itself raised while importing
        raise TraceError(
            f"importing {module_name!r} for model factory {path!r} raised {type(exc).__name__}: {one_line(exc)}"
        ) from exc
    finally:
        if added:
            sys.path.remove(os.getcwd())
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TraceError(f"module {module_name!r} has no attribute {attr!r} (model factory {path!r})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TraceError(f"model factory {path!r} is a {type(obj).__name__}, not a callable")
    return obj  # type: ignore[no-any-return]


def build_hf_causal_lm(config: Mapping[str, Any] | Any) -> nn.Module:
    """A randomly initialised Hugging Face causal LM from a config (a ``config.json`` dict or a ``PretrainedConfig``).

    Called inside the tracer it builds fake tensors (no memory, no weights
    downloaded); called outside it builds a real model.  ``use_cache`` is off.
    """
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
    except ImportError as exc:  # pragma: no cover - transformers is in the torch extra
        raise TraceError("tracing a Hugging Face config needs transformers: pip install 'trainplan[torch]'") from exc
    if isinstance(config, PretrainedConfig):
        cfg = config
    elif isinstance(config, Mapping):
        kwargs = dict(config)
        model_type = kwargs.pop("model_type", None)
        if not model_type:
            raise TraceError("the Hugging Face config has no 'model_type' (e.g. 'llama', 'gpt2')")
        for key in ("architectures", "transformers_version", "torch_dtype", "dtype"):
            kwargs.pop(key, None)
        try:
            cfg = AutoConfig.for_model(model_type, **kwargs)
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"bad Hugging Face config for model_type {model_type!r}: {one_line(exc)}") from exc
    else:
        raise TraceError(f"expected a config dict or PretrainedConfig, got {type(config).__name__}")
    cfg.use_cache = False
    try:
        return AutoModelForCausalLM.from_config(cfg)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise TraceError(f"transformers cannot build a causal LM from this config: {one_line(exc)}") from exc
