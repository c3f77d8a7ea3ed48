"""Atomic file writes: a temporary file in the same folder, fsynced, then ``os.replace``, then the folder fsynced.

A reader (or a resumed run after a crash, even a power loss) sees either the old
file or the new one, never half of one: the data reaches the disk before the
rename, and the rename before the call returns (rename(2) is atomic, but only
durable once the directory is synced; ext4 and XFS docs, "data=ordered").
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        # mkstemp makes the file 0600: give it the mode of the file it replaces, else what the umask allows (0644)
        os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        fsync_path(Path(tmp))
        os.replace(tmp, path)
        fsync_path(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's data to the disk (best effort where the file system cannot)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):  # some file systems refuse fsync on a directory
            os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (fsynced before the rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_atomic(path: Path, save: Callable[[Path], None]) -> None:
    """Call ``save(tmp)`` (e.g. ``lambda p: torch.save(obj, p)``), then move ``tmp`` to ``path``."""
    with atomic_path(path) as tmp:
        save(tmp)


def update_digest(digest: Any, path: Path) -> Any:
    """Feed the bytes of ``path`` to ``digest`` (a hashlib object) in 1 MiB blocks; returns ``digest``."""
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest


def trainplan_home() -> Path:
    """``$TRAINPLAN_HOME``, else ``~/.cache/trainplan``."""
    env = os.environ.get("TRAINPLAN_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trainplan"
