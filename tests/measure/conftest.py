"""Fixtures of the probe tests: a private TRAINPLAN_HOME for each test, a fake two-GPU machine (gpu_fakes.py)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from gpu_fakes import TWO_A100_NVLINK, fake_nvml, fake_torch


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test gets its own TRAINPLAN_HOME: no test reads or writes the user's profile."""
    h = tmp_path / "home"
    monkeypatch.setenv("TRAINPLAN_HOME", str(h))
    return h


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Two A100-80GB with 12 NVLinks between them, seen by NVML and torch."""
    nv = fake_nvml(TWO_A100_NVLINK)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setitem(sys.modules, "torch", fake_torch([(g["name"], g["memory_gib"]) for g in TWO_A100_NVLINK]))
    return nv
