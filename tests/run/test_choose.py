"""Choosing the option this machine runs, with fake hardware and a fake planner."""

from __future__ import annotations

import pytest
from conftest import TABULAR_JOB, TORCH_JOB

from trainplan.errors import SpecError
from trainplan.measure.probe import Accelerator, GpuInfo, Hardware
from trainplan.run.choose import choose_option
from trainplan.run.predict import Prediction
from trainplan.spec import parse_job
from trainplan.strategies import Strategy

CPU = Hardware(cpu_model="Test CPU", cpu_cores=8, memory_gib=32.0)
GPUS = Hardware(
    cpu_model="Test CPU", cpu_cores=32, memory_gib=256.0,
    gpus=tuple(GpuInfo("NVIDIA A100-SXM4-80GB", 80.0) for _ in range(4)), accelerator=Accelerator.CUDA,
)
MPS = Hardware(cpu_model="Apple M2", cpu_cores=8, memory_gib=16.0, accelerator=Accelerator.MPS)

JOB = parse_job(TORCH_JOB)


def planner(table: dict[str, tuple[float | None, float | None]]):
    """A predictor from {strategy: (peak_gib, train_s)}; unknown strategies get no figures."""
    calls: list[tuple[str, int, str]] = []

    def predict(job, strategy, devices, device_kind):
        calls.append((strategy, devices, device_kind))
        peak, train = table.get(strategy, (None, None))
        return Prediction(peak_gib=peak, train_s=train)

    predict.calls = calls  # type: ignore[attr-defined]
    return predict


def test_fastest_option_that_fits_wins() -> None:
    fake = planner({"ddp": (120.0, 10.0), "zero2": (60.0, 12.0), "zero3": (30.0, 15.0), "fsdp": (30.0, 14.0)})
    option = choose_option(JOB, GPUS, predictor=fake)
    assert option.strategy is Strategy.ZERO2  # ddp is faster but needs 120 GiB of an 80 GiB GPU
    assert option.devices == 4 and option.accelerator is Accelerator.CUDA and option.threads_per_process == 8
    assert {c[2] for c in fake.calls} == {"A100-80GB"}


def test_no_strategy_fits_is_an_error() -> None:
    with pytest.raises(SpecError, match="no strategy fits.*81.0 GiB"):
        choose_option(JOB, GPUS, predictor=planner({s.value: (81.0, 1.0) for s in Strategy}))


def test_defaults_without_predictions() -> None:
    assert choose_option(JOB, GPUS, predictor=planner({})).strategy is Strategy.DDP
    cpu = choose_option(JOB, CPU, predictor=planner({}))
    assert (cpu.strategy, cpu.devices, cpu.threads_per_process) == (Strategy.SINGLE, 1, 8)
    assert choose_option(JOB, MPS, predictor=planner({})).strategy is Strategy.SINGLE


def test_named_strategy_on_cpu_defaults_to_two_processes() -> None:
    option = choose_option(JOB, CPU, strategy="fsdp", predictor=planner({}))
    assert (option.devices, option.threads_per_process) == (2, 4)
    assert choose_option(JOB, CPU, strategy="ZERO2", devices=4, predictor=planner({})).strategy is Strategy.ZERO2


@pytest.mark.parametrize(
    "hw,strategy,devices,field,words",
    [
        (CPU, "warp-speed", None, "--strategy", "must be one of single, ddp"),
        (CPU, None, 9, "--devices", "this machine has 8 cores"),
        (GPUS, None, 5, "--devices", "this machine has 4 GPUs"),
        (CPU, None, 0, "--devices", "must be >= 1"),
        (CPU, "single", 2, "--strategy", "single runs one process"),
        (CPU, "ddp", 1, "--devices", "ddp needs --devices 2"),
        (MPS, "ddp", None, "--strategy", "does not run on Apple MPS"),
    ],
)
def test_impossible_requests_name_the_option(hw, strategy, devices, field, words) -> None:
    with pytest.raises(SpecError) as err:
        choose_option(JOB, hw, strategy=strategy, devices=devices, predictor=planner({}))
    assert err.value.field == field and words in str(err.value)


def test_tabular_jobs_split_cores_between_parallel_fits() -> None:
    job = parse_job({**TABULAR_JOB, "cv_folds": 5})
    option = choose_option(job, CPU, predictor=planner({}))
    assert (option.devices, option.threads_per_process) == (5, 1)
    capped = choose_option(job, CPU, devices=2, predictor=planner({}))
    assert (capped.devices, capped.threads_per_process) == (2, 4)
