"""Every test runs with its own empty TRAINPLAN_HOME, so a developer's saved calibrations or hardware profile
(`trainplan probe`) never change what a test sees; tests that need a store create one in it."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _isolated_trainplan_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path_factory.mktemp("trainplan_home")))
    monkeypatch.delenv("TRAINPLAN_CATALOG", raising=False)  # no user catalog unless a test makes one
