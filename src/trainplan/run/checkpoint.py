"""Checkpoint directories: written atomically, found again after a crash.

Layout under ``<run>/checkpoints``::

    step_00000040/            one committed checkpoint
        model.pt  optim.pt    full state dicts (torch engines; rank 0 writes)
        deepspeed/            DeepSpeed's own checkpoint (DeepSpeed strategies)
        trainer_rank0.pt …    per-rank trainer state: step, RNG states, clocks
        MANIFEST.json         written last: step, world size, strategy, SHA-256 and size of every file
    step_00000050.partial/    being written; ignored and removed if found
    latest.json               {"step": 40, "dir": "step_00000040", ...}

Protocol (every rank calls :meth:`CheckpointStore.begin` … :meth:`commit`):
rank 0 clears a stale ``.partial``; all ranks write their files into it (each
file itself via temporary file + ``os.replace``); after a barrier rank 0
hashes every file into ``MANIFEST.json``, renames the folder to its final name
and then replaces ``latest.json``.  A crash at any point leaves ``latest.json``
naming a complete checkpoint.

Resuming verifies before anything is loaded (:meth:`CheckpointStore.newest_good`):
checkpoints are tried newest first — the one ``latest.json`` names, then every
``step_*`` folder — and one whose manifest is missing, or whose files are
missing, resized or have another SHA-256, is skipped with the reason (flipped
bytes, a truncated file, a lost rank file, a damaged or deleted ``latest.json``
all fall back to the previous good checkpoint instead of failing or starting
over).  DeepSpeed's own checkpoint folder is covered by the same manifest.

Files trainplan writes are loaded with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from trainplan.files import fsync_path, save_atomic, update_digest, write_json_atomic

LATEST = "latest.json"
MANIFEST = "MANIFEST.json"


def step_dirname(step: int) -> str:
    return f"step_{step:08d}"


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint."""

    step: int
    path: Path
    world_size: int
    strategy: str


def save_tensor_file(obj: Any, path: Path) -> None:
    """``torch.save`` through a temporary file and ``os.replace``."""
    save_atomic(path, lambda tmp: torch.save(obj, tmp))


def load_tensor_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` onto the CPU."""
    return torch.load(path, map_location="cpu", weights_only=True)


def rng_state() -> dict[str, Any]:
    """This process's random-number state: Python's, torch CPU, and every CUDA device."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointStore:
    """The checkpoints of one run, seen from one rank.

    ``barrier`` synchronises the ranks (``torch.distributed.barrier`` or a
    no-op for one process).
    """

    def __init__(self, root: Path, *, rank: int, barrier: Callable[[], None], keep: int = 2) -> None:
        self.root = Path(root)
        self.rank = rank
        self.barrier = barrier
        self.keep = max(1, keep)

    # ------------------------------------------------------------------ reading
    def newest_good(self) -> tuple[CheckpointRef | None, list[str]]:
        """The newest checkpoint whose files match its manifest, and why each newer one was skipped."""
        skipped: list[str] = []
        seen: set[str] = set()
        candidates: list[Path] = []
        try:
            named = self.latest()
        except RuntimeError as exc:
            named = None
            skipped.append(str(exc))
        if named is not None:
            candidates.append(named.path)
        candidates += sorted((p for p in self.root.glob("step_*") if p.is_dir() and not p.name.endswith(".partial")),
                             reverse=True)  # fmt: skip
        for folder in candidates:
            if folder.name in seen:
                continue
            seen.add(folder.name)
            ref, why = verify(folder)
            if ref is not None:
                return ref, skipped
            skipped.append(f"{folder.name}: {why}")
        return None, skipped

    def latest(self) -> CheckpointRef | None:
        """The last committed checkpoint, if any."""
        pointer = self.root / LATEST
        try:
            data = json.loads(pointer.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise RuntimeError(f"checkpoint pointer {pointer} is unreadable: {exc}") from exc
        path = self.root / data["dir"]
        if not path.is_dir():
            raise RuntimeError(f"{pointer} names {path}, which is missing")
        return CheckpointRef(
            step=int(data["step"]),
            path=path,
            world_size=int(data["world_size"]),
            strategy=str(data["strategy"]),
        )

    # ------------------------------------------------------------------ writing
    def begin(self, step: int) -> Path:
        """Start checkpoint ``step``; returns the folder every rank writes into."""
        partial = self.root / (step_dirname(step) + ".partial")
        if self.rank == 0:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir(parents=True)
        self.barrier()
        return partial

    def commit(self, step: int, *, world_size: int, strategy: str) -> CheckpointRef:
        """Publish checkpoint ``step`` once every rank has written its part."""
        self.barrier()
        final = self.root / step_dirname(step)
        if self.rank == 0:
            partial = self.root / (step_dirname(step) + ".partial")
            write_manifest(partial, step=step, world_size=world_size, strategy=strategy)
            if final.exists():  # left by a run that crashed before updating the pointer
                shutil.rmtree(final)
            for sub in [partial, *(p for p in partial.rglob("*") if p.is_dir())]:
                fsync_path(sub)  # the folder entries of every file written into it
            partial.rename(final)
            fsync_path(self.root)
            write_json_atomic(
                self.root / LATEST,
                {"step": step, "dir": final.name, "world_size": world_size, "strategy": strategy},
            )
            self._prune(keep_name=final.name)
        self.barrier()
        return CheckpointRef(step=step, path=final, world_size=world_size, strategy=strategy)

    def _prune(self, keep_name: str) -> None:
        done = sorted(p for p in self.root.glob("step_*") if p.is_dir() and not p.name.endswith(".partial"))
        for old in done[: -self.keep]:
            if old.name != keep_name:
                shutil.rmtree(old, ignore_errors=True)
        for stale in self.root.glob("step_*.partial"):
            shutil.rmtree(stale, ignore_errors=True)


# --------------------------------------------------------------------------- integrity


def _sha256(path: Path) -> str:
    return update_digest(hashlib.sha256(), path).hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: Path, *, step: int, world_size: int, strategy: str) -> None:
    """``MANIFEST.json``: what the checkpoint is and the SHA-256 and size of every file in it (written last)."""
    files = {p.relative_to(folder).as_posix(): {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in _files(folder)}
    write_json_atomic(folder / MANIFEST, {"step": step, "world_size": world_size, "strategy": strategy, "files": files})


def verify(folder: Path) -> tuple[CheckpointRef | None, str]:
    """(the checkpoint, "") when every file matches ``folder``'s manifest, else (None, why not)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        ref = CheckpointRef(step=int(manifest["step"]), path=folder, world_size=int(manifest["world_size"]),
                            strategy=str(manifest["strategy"]))  # fmt: skip
    except FileNotFoundError:
        return None, "no manifest (written last: the checkpoint is incomplete)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"unreadable manifest ({exc})"
    present = {p.relative_to(folder).as_posix() for p in _files(folder)}
    for name, want in sorted(files.items()):
        path = folder / name
        if name not in present:
            return None, f"{name} is missing"
        size = path.stat().st_size
        if size != want.get("bytes"):
            return None, f"{name} has {size} bytes, the manifest says {want.get('bytes')}"
        if _sha256(path) != want.get("sha256"):
            return None, f"{name} does not match its SHA-256 (damaged)"
    return ref, ""


def manifest_ref(folder: Path) -> CheckpointRef:
    """The checkpoint ``folder``'s manifest says it is (no hashing: for ranks told which one rank 0 verified)."""
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    return CheckpointRef(step=int(manifest["step"]), path=folder, world_size=int(manifest["world_size"]),
                         strategy=str(manifest["strategy"]))  # fmt: skip
