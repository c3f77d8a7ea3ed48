"""What a failed trace raises: a :class:`TraceError` with one line the user can act on.

:func:`stage` wraps one stage of the trace and turns whatever the user's model
(or PyTorch under it) raised into that line, naming the stage and, for the
fake-tensor failures a user can do something about, the cause.
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def stage(message: str) -> Iterator[None]:
    """Turn exceptions of one stage of the trace into :class:`TraceError` (``message: cause``)."""
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
    except Exception as exc:
        raise TraceError(f"{message}: {type(exc).__name__}: {one_line(exc)}") from exc
