"""The probe on this machine: sane positive figures, a valid saved profile, the CLI, progress."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainplan.cli.main import main
from trainplan.errors import TrainplanError
from trainplan.measure.microbench import bus_bandwidth, matmul_tflops, memory_bandwidth_gb_s, tabular_ns_per_cell
from trainplan.measure.probe import describe_machine, usable_cores
from trainplan.measure.profile import HardwareProfile, load_profile, profile_path, run_probe, save_profile


@pytest.fixture(scope="module")
def quick_profile() -> HardwareProfile:
    """One quick probe for the module (all benchmarks, shortened): about 10 s on 2 cores."""
    calls: list[tuple[str, int, int]] = []
    prof = run_probe(quick=True, progress=lambda label, done, total: calls.append((label, done, total)))
    object.__setattr__(prof, "_calls", calls)
    return prof


def test_description_of_this_machine() -> None:
    d = describe_machine()
    assert d.hardware.cpu_cores == usable_cores() >= 1
    assert d.logical_cpus >= d.hardware.cpu_cores
    assert d.hardware.memory_gib > 0.5
    if not d.hardware.gpus:  # this machine and CI: no GPU, said plainly
        assert d.gpu_note is not None and d.gpu_note.startswith("no GPU:")


def test_probe_figures_are_sane(quick_profile: HardwareProfile) -> None:
    p = quick_profile
    fp32 = p.figure("matmul_fp32")
    assert fp32 is not None and 1e-4 < fp32 < 100, fp32  # TFLOP/s: a laptop core … a big server
    bw = p.figure("memory_bandwidth")
    assert bw is not None and 0.1 < bw < 2000, bw  # GB/s
    ar = p.measurement("allreduce_bus_bandwidth")
    assert ar is not None and ar.value is not None and ar.value > 0, ar.note
    assert ar.method.startswith("gloo all_reduce")
    for m in p.measurements:
        assert m.value is None or (math.isfinite(m.value) and m.value > 0), m
        assert m.value is not None or m.note, f"{m.name}: not measured and no reason given"
        assert m.seconds < 30, m
    tab = [m for m in p.measurements if m.name.startswith("tabular_")]
    assert {m.name for m in tab} == {"tabular_xgboost", "tabular_lightgbm", "tabular_catboost", "tabular_sklearn-hgb"}
    assert p.seconds < 60


def test_progress_is_reported_in_order(quick_profile: HardwareProfile) -> None:
    calls = quick_profile._calls  # type: ignore[attr-defined]
    total = calls[0][2]
    assert [c[1] for c in calls] == list(range(total + 1))
    assert calls[-1] == ("done", total, total)
    assert total == len(quick_profile.measurements)


def test_profile_round_trip_and_validation(quick_profile: HardwareProfile, home: Path) -> None:
    path = save_profile(quick_profile)
    assert path == profile_path() and path.parent == home
    back = load_profile()
    assert back == quick_profile
    data = json.loads(path.read_text())
    data["measurements"][0]["value"] = -1.0
    path.write_text(json.dumps(data))
    with pytest.raises(TrainplanError, match="value must be a positive number"):
        load_profile()
    data["measurements"][0]["value"] = 1.0
    del data["host"]
    path.write_text(json.dumps(data))
    with pytest.raises(TrainplanError, match="missing host"):
        load_profile()
    path.write_text("{not json")
    with pytest.raises(TrainplanError, match="hardware profile is unreadable"):
        load_profile()


def test_probe_cli_json_saves_profile(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "--json", "--quick", "--no-tabular"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["saved_to"] == str(home / "hardware_profile.json")
    names = {m["name"] for m in out["measurements"]}
    assert {"matmul_fp32", "memory_bandwidth", "allreduce_bus_bandwidth"} <= names
    assert not any(n.startswith("tabular_") for n in names)
    assert load_profile() is not None and out["machine"]["cpu_cores"] == usable_cores()


def test_bus_bandwidth_is_nccl_tests_formula() -> None:
    # 2 ranks: bus = alg bandwidth; 8 ranks: × 2·7/8 (nccl-tests doc/PERFORMANCE.md)
    assert bus_bandwidth(1e9, 1.0, 2) == pytest.approx(1e9)
    assert bus_bandwidth(1e9, 0.5, 8) == pytest.approx(2e9 * 1.75)


def test_missing_libraries_give_notes_not_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    m = matmul_tflops("bf16")
    assert m.value is None and "needs torch" in (m.note or "")
    numpy_rate = matmul_tflops("fp32", n=256, budget_s=0.1)  # numpy fallback
    assert numpy_rate.value and numpy_rate.method.startswith("numpy.matmul")
    assert memory_bandwidth_gb_s(device="cuda:0").note == "device memory bandwidth needs torch"
    monkeypatch.setattr("trainplan.measure.microbench._library_installed", lambda lib: False)
    assert "not installed" in (tabular_ns_per_cell("xgboost").note or "")


def test_the_tabular_rate_grows_its_fits_above_the_noise_and_reports_the_spread(monkeypatch) -> None:
    """Issue 20: '2 trees 0.81 s, 8 trees 0.82 s' measured noise. The extra work grows until the extra time is
    above min_extra_s, the pair is repeated, and the spread of the rates is kept."""
    pytest.importorskip("xgboost")
    from trainplan.measure import microbench

    calls: list[int] = []
    noise = iter([0.0, 0.004, -0.003, 0.002, 0.001, -0.002, 0.003, 0.0, -0.001, 0.002] * 4)

    def fake_fit(library, x, y, trees, depth):  # 0.8 s of data preparation + 1 ms per tree + jitter
        calls.append(trees)
        return 0.8 + 0.001 * trees + next(noise)

    monkeypatch.setattr(microbench, "_fit_once", fake_fit)
    m = microbench.tabular_ns_per_cell("xgboost", shape={"rows": 1000}, repeats=3, min_extra_s=0.3)
    # 8 -> 32 -> 128 -> 512 trees: the first size whose extra time (0.51 s) passes 0.3 s; then two more pairs
    assert max(calls) == 512 and calls[-6:] == [2, 512, 2, 512, 2, 512]
    assert "2 vs 512 trees, 3 pairs" in m.method and m.value and m.spread is not None and 0 < m.spread < 0.1
    # never above the cap: a machine too fast to reach the target says the figure is noisy
    calls.clear()
    noise = iter([0.0] * 40)
    capped = microbench.tabular_ns_per_cell("xgboost", shape={"rows": 1000}, repeats=2, min_extra_s=5.0, max_trees=32)
    assert max(calls) == 32 and capped.note and "noisy" in capped.note
