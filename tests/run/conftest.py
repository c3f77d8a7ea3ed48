"""Shared fixtures for the `trainplan run` tests.

Real runs start real processes.  Workers import the tiny model factories below
from a session folder put on ``PYTHONPATH``; each test gets its own
``TRAINPLAN_HOME``.  Runs that several tests compare against (one per
strategy) are trained once per session by :func:`baseline`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

import trainplan
from trainplan.run.api import RunRequest, RunSummary, execute

SRC = Path(trainplan.__file__).resolve().parents[1]

MODELS = '''
"""Tiny models and data sets for the trainplan run tests."""
import time

import torch


def mlp(width=16, dropout=0.1):
    """A small classifier with dropout (so resuming must restore the RNG)."""
    return torch.nn.Sequential(
        torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Dropout(dropout), torch.nn.Linear(width, 4)
    )


class _Slow(torch.nn.Module):
    def __init__(self, delay):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)
        self.delay = delay

    def forward(self, x):
        time.sleep(self.delay)
        return self.lin(x)


def slow(delay=0.05):
    """A model whose step takes at least ``delay`` seconds (for signal tests)."""
    return _Slow(delay)


class _Pairs(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def pairs():
    return _Pairs(40)


def not_a_model():
    return 42
'''

SCRIPT_OK = '''
"""A user script driven by trainplan.runtime."""
import torch
import trainplan.runtime

ctx = trainplan.runtime.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
model, opt = ctx.wrap(model, torch.optim.SGD(model.parameters(), lr=0.05))
start = ctx.resume()
for step in range(start, ctx.total_steps):
    for micro in range(ctx.grad_accum):
        g = torch.Generator().manual_seed(1000 * step + 10 * micro + ctx.rank)
        x = torch.randn(4, 8, generator=g)
        loss = (model(x.to(ctx.device)) - x.sum(1, keepdim=True).to(ctx.device)).pow(2).mean()
        ctx.backward(loss)
        ctx.step()
    if ctx.end_of_step(step + 1, loss=loss.item(), samples=ctx.global_batch):
        break
ctx.finish(workload={"samples_per_step": ctx.global_batch})
'''

SCRIPT_CRASH = '''
import sys
print("loading data")
raise ValueError("bad value in column 3")
'''

CLI_SHIM = '''
"""`trainplan run` for subprocess tests: run_command in a Typer app, errors handled as the CLI main does."""
import sys

import typer

from trainplan.cli.run import run_command
from trainplan.errors import TrainplanError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command("run")(run_command)


@app.callback()
def _root() -> None:
    pass


try:
    code = app(args=sys.argv[1:], standalone_mode=False)
except TrainplanError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
sys.exit(code or 0)
'''

TORCH_JOB: dict[str, Any] = {
    "kind": "torch",
    "name": "tiny",
    "model": "tp_run_models:mlp",
    "model_args": {"width": 32},
    "inputs": [{"shape": [8]}],
    "loss": "cross_entropy",
    "micro_batch": 4,
    "steps": 12,
    "seed": 1,
    "precision": "fp32",
}

TABULAR_JOB: dict[str, Any] = {
    "kind": "tabular",
    "name": "tab",
    "library": "xgboost",
    "data": "synthetic",
    "rows": 600,
    "features": 8,
    "trees": 15,
    "max_depth": 3,
    "cv_folds": 3,
    "seed": 0,
}

FAULT_VARS = ("TRAINPLAN_FAULT_SIGKILL_AT_STEP", "TRAINPLAN_FAULT_RANK")


@pytest.fixture(scope="session")
def support_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder with the test model module, scripts and the CLI shim; importable here and in workers."""
    d = tmp_path_factory.mktemp("run_support")
    (d / "tp_run_models.py").write_text(MODELS)
    (d / "script_ok.py").write_text(SCRIPT_OK)
    (d / "script_crash.py").write_text(SCRIPT_CRASH)
    (d / "cli_shim.py").write_text(CLI_SHIM)
    sys.path.insert(0, str(d))
    return d


@pytest.fixture(scope="session")
def extensions_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty TORCH_EXTENSIONS_DIR: a DeepSpeed run that compiled an op would leave it there."""
    return tmp_path_factory.mktemp("torch_extensions")


def child_pythonpath(support: Path) -> str:
    parts = [str(SRC), str(support), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in parts if p)


@pytest.fixture(autouse=True)
def run_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, support_dir: Path, extensions_dir: Path) -> None:
    """Isolated calibration store, importable test models, no fault injection."""
    monkeypatch.setenv("TRAINPLAN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(extensions_dir))
    monkeypatch.setenv("PYTHONPATH", child_pythonpath(support_dir))
    for var in FAULT_VARS:
        monkeypatch.delenv(var, raising=False)


def write_job(path: Path, base: dict[str, Any], **changes: Any) -> Path:
    """Write a job file: ``base`` updated with ``changes`` (None removes a field)."""
    data = {**base, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(job: Path, out: Path, **options: Any) -> RunSummary:
    """``trainplan run`` in this process (the workers are real child processes)."""
    return execute(RunRequest(job_path=job, out=out, checkpoint_minutes=None, **options), progress=None)


def refused(tmp_path: Path, spec: dict[str, Any], **options: Any) -> Any:
    """``trainplan run`` of ``spec`` with ``options`` is refused before anything runs: one line (the SpecError it
    returns), and the existing output directory it was pointed at keeps exactly what it held."""
    from trainplan.errors import SpecError

    out = tmp_path / "existing"
    out.mkdir(exist_ok=True)
    (out / "keep.txt").write_text("mine")
    with pytest.raises(SpecError) as err:
        execute(RunRequest(job_path=write_job(tmp_path / "bad.yaml", spec), out=out, overwrite=True, **options))
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"] and "\n" not in str(err.value)
    return err.value


def step_losses(out: Path) -> list[float]:
    """The loss of each step a run logged (``metrics.jsonl``)."""
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def assert_same_training(out: Path, reference: Path, steps: int) -> list[float]:
    """Two runs of the same job and batches agree: every step's loss (fp32 on CPU, sums reordered across ranks:
    relative 1e-5) and every tensor of the saved ``model.pt``, under the same names.  Returns the losses."""
    import pytest

    a, b = step_losses(out), step_losses(reference)
    assert len(a) == len(b) == steps
    assert a == pytest.approx(b, rel=1e-5)
    saved, ref = load_state(out / "model.pt"), load_state(reference / "model.pt")
    assert saved.keys() == ref.keys()
    import torch

    assert all(torch.allclose(saved[k], ref[k], rtol=1e-4, atol=1e-6) for k in saved)
    return a


def rank_records(out: Path, stage: str) -> list[dict[str, Any]]:
    """The ``ranks/rank<r>.<stage>.json`` records of a run, by rank."""
    files = sorted((out / "ranks").glob(f"rank*.{stage}.json"))
    return [json.loads(f.read_text()) for f in files]


def load_state(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_weights(a: Path, b: Path, *, atol: float = 1e-6) -> None:
    import torch

    sa, sb = load_state(a), load_state(b)
    assert sa.keys() == sb.keys()
    for key in sa:
        torch.testing.assert_close(sa[key], sb[key], atol=atol, rtol=1e-5, msg=f"{key} differs")


@pytest.fixture(scope="session")
def baseline(
    tmp_path_factory: pytest.TempPathFactory, support_dir: Path, extensions_dir: Path
) -> Callable[[str], tuple[RunSummary, Path]]:
    """``baseline(strategy)``: an uninterrupted run of TORCH_JOB (12 steps, checkpoint every 4), once per session."""
    cache: dict[str, tuple[RunSummary, Path]] = {}
    root = tmp_path_factory.mktemp("baselines")

    def get(strategy: str) -> tuple[RunSummary, Path]:
        if strategy not in cache:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("TRAINPLAN_HOME", str(root / "home"))
                mp.setenv("TORCH_EXTENSIONS_DIR", str(extensions_dir))
                mp.setenv("PYTHONPATH", child_pythonpath(support_dir))
                for var in FAULT_VARS:
                    mp.delenv(var, raising=False)
                job = write_job(root / "job.yaml", TORCH_JOB)
                out = root / strategy
                devices = 1 if strategy == "single" else 2
                summary = run(job, out, strategy=strategy, devices=devices, checkpoint_every=4)
            cache[strategy] = (summary, out)
        return cache[strategy]

    return get


@pytest.fixture
def torch_job(tmp_path: Path) -> Path:
    return write_job(tmp_path / "job.yaml", TORCH_JOB)


@pytest.fixture
def cli(support_dir: Path) -> list[str]:
    """The argv prefix that runs ``trainplan run`` in a subprocess."""
    return [sys.executable, str(support_dir / "cli_shim.py"), "run"]
