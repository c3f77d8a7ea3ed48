"""``evolve``: a changed copy of a frozen dataclass without re-running its constructor.

:func:`dataclasses.replace` builds the copy through ``__init__`` (about 15 µs for ``Hardware`` or ``Estimate``), and a
plan makes thousands of them (a layout's hardware, the data-parallel group's links, an option with its energy). For a
dataclass without ``__post_init__``, ``__slots__`` or cached properties — nothing in the constructor to re-run and
nothing derived to invalidate — a copy of the instance dictionary with the changes is the same object.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def evolve(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` for a plain frozen dataclass (checked: no ``__post_init__``, fields only)."""
    cls = type(obj)
    fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
    unknown = changes.keys() - fields.keys()
    if unknown or hasattr(cls, "__post_init__"):
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]  # its own error, or its own checks
    new = object.__new__(cls)
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new
