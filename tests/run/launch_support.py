"""Helpers for the `trainplan launch` tests: render a launch, run its commands as real processes, clean up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from trainplan.run.targets import LaunchOptions, LaunchPlan, LaunchRequest, Rendered, Target, prepare_launch, write_rendered


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_to(job: Path, target: str, out: Path, *, options: dict[str, Any] | None = None, **request: Any) -> tuple[LaunchPlan, Rendered]:
    """Resolve and render a launch, and write its files into ``out``."""
    req = LaunchRequest(job_path=job, target=Target(target), out=out, checkpoint_minutes=None,
                        options=LaunchOptions(**(options or {})), **request)  # fmt: skip
    plan, rendered = prepare_launch(req)
    write_rendered(rendered, plan.out)
    return plan, rendered


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except Exception:
        return []


class Procs:
    """Processes a test started, each in its own session; every one (and its children) is killed at the end."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, log: Path) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh:
            proc = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, cwd=cwd, stdout=fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def wait_all(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for proc in self.procs:
            try:
                codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{proc.args[:4]} did not finish within {timeout:.0f} s") from None
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            pids = _descendants(proc.pid)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            for pid in pids:  # children that left the process group (Ray's daemons, for one)
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@contextmanager
def processes() -> Iterator[Procs]:
    procs = Procs()
    try:
        yield procs
    finally:
        procs.kill()


def records(out: Path, stage: str) -> list[dict[str, Any]]:
    return [json.loads(f.read_text()) for f in sorted((out / "ranks").glob(f"rank*.{stage}.json"))]


def events(out: Path, name: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [line for line in lines if line.get("event") == name]


def logs(*paths: Path) -> str:
    return "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in paths if p.exists())
