"""A wheel of the trainplan installed here, so a fresh node installs the same code the plan was made with.

trainplan is not on the package index; a rendered launch carries its own wheel
instead.  It is built from the installed package itself (editable or not): the
package's files, and the installed distribution's own ``METADATA`` (its
requirements and extras) and ``entry_points.txt``, laid out as the wheel format
says (PEP 427: ``{name}-{version}.dist-info/`` with ``WHEEL`` and a ``RECORD`` of
SHA-256 digests, urlsafe base64 without padding; PEP 376 / the binary
distribution format spec).  Pure Python, tagged ``py3-none-any``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import trainplan

_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo")
_FIXED_TIME = (2026, 1, 1, 0, 0, 0)  # reproducible archives: the same code gives the same bytes


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _package_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not _SKIP_DIRS & set(path.relative_to(root).parts) and path.suffix not in _SKIP_SUFFIXES:
            files.append(path)
    return files


@lru_cache(maxsize=1)
def installed_wheel() -> tuple[str, bytes]:
    """(file name, bytes) of a wheel of the installed trainplan."""
    dist = metadata.distribution("trainplan")
    version = dist.version
    meta = dist.read_text("METADATA") or f"Metadata-Version: 2.1\nName: trainplan\nVersion: {version}\n"
    entry_points = dist.read_text("entry_points.txt")
    info = f"trainplan-{version}.dist-info"
    root = Path(trainplan.__file__).resolve().parent
    entries: list[tuple[str, bytes]] = [
        (f"trainplan/{p.relative_to(root).as_posix()}", p.read_bytes()) for p in _package_files(root)
    ]
    entries.append((f"{info}/METADATA", meta.encode()))
    entries.append((f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: trainplan\nRoot-Is-Purelib: true\nTag: py3-none-any\n"))
    if entry_points:
        entries.append((f"{info}/entry_points.txt", entry_points.encode()))
    record = "".join(f"{name},{_digest(data)},{len(data)}\n" for name, data in entries) + f"{info}/RECORD,,\n"
    entries.append((f"{info}/RECORD", record.encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            item = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    return f"trainplan-{version}-py3-none-any.whl", buffer.getvalue()
