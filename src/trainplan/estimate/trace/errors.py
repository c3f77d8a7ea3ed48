"""What a failed trace raises: a :class:`TraceError` with one line the user can act on.

:func:`stage` wraps one stage of the trace and turns whatever the user's model
(or PyTorch under it) raised into that line, naming the stage and, for the
fake-tensor failures a user can do something about, the cause.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    UnsupportedOperatorException,
)

from trainplan.errors import TrainplanError

__all__ = ["TraceError", "enum_setting", "one_line", "stage"]


class TraceError(TrainplanError):
    """Tracing the model failed for a reason the user can fix; the message is one line."""


def one_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type name when it has none."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def enum_setting(cls: type[Any], value: Any, field: str) -> Any:
    """``value`` (a member or its string) as a member of the enum ``cls``; :class:`TraceError` naming ``field`` else."""
    try:
        return cls(getattr(value, "value", value))
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise TraceError(f"{field} must be one of {allowed}, got {value!r}") from None


#: torch's fake-tensor mode logs the traceback of an operator that fails on fake tensors (``log.exception`` in
#: ``FakeTensorMode._dispatch_impl``) before raising it; the raise is what :func:`stage` turns into one line, so the
#: logged traceback is kept off the user's terminal while a stage runs
_FAKE_TENSOR_LOG = logging.getLogger("torch._subclasses.fake_tensor")


@contextlib.contextmanager
def stage(message: str) -> Iterator[None]:
    """Turn exceptions of one stage of the trace into :class:`TraceError` (``message: cause``)."""
    level = _FAKE_TENSOR_LOG.level
    _FAKE_TENSOR_LOG.setLevel(logging.CRITICAL)
    try:
        yield
    except TraceError:
        raise
    except (DataDependentOutputException, DynamicOutputShapeException) as exc:
        raise TraceError(
            f"{message}: the model has data-dependent control flow or output shapes "
            f"(e.g. `if x.sum() > 0:`, `.item()`, `nonzero()`), which cannot be traced without real data "
            f"({one_line(exc)})"
        ) from exc
    except UnsupportedOperatorException as exc:
        raise TraceError(
            f"{message}: operator {one_line(exc)} has no fake-tensor implementation (a custom kernel?)"
        ) from exc
    except RuntimeError as exc:
        if "Expected inputs of BF16 type" in str(exc):
            # torch's grouped GEMM (what transformers 5 runs a mixture-of-experts layer with) takes bf16 operands
            # only on CUDA (_grouped_mm_cuda, mirrored by its meta function); autocast does not cast it and
            # transformers casts the input to the fp32 weight, so the real step fails the same way.
            raise TraceError(
                f"{message}: the model's grouped-GEMM experts need bf16 weights (torch's grouped_mm takes bf16 only "
                "on CUDA and autocast does not cast it), so fp32 weights (fp32, or mixed precision over fp32 masters) do not run; "
                "use precision: bf16-pure, or kind: transformer for the analytic MoE estimate"
            ) from exc
        raise TraceError(f"{message}: {type(exc).__name__}: {one_line(exc)}") from exc
    except Exception as exc:
        raise TraceError(f"{message}: {type(exc).__name__}: {one_line(exc)}") from exc
    finally:
        _FAKE_TENSOR_LOG.setLevel(level)
