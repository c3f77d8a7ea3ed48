"""The public API is frozen: changing ``trainplan.__all__`` must be a deliberate edit of this file
(after httpx's tests/test_exported_members.py)."""

from __future__ import annotations

import enum
import importlib
import inspect
import subprocess
import sys

import trainplan

PUBLIC_API = [
    "CatalogError",
    "Estimate",
    "Hardware",
    "InfeasibleError",
    "Job",
    "Layout",
    "ModelArch",
    "Objective",
    "Plan",
    "RejectKind",
    "Rejection",
    "SpecError",
    "StepProfile",
    "Strategy",
    "TabularJob",
    "TorchJob",
    "TrainplanError",
    "TransformerJob",
    "ZeroStage",
    "__version__",
    "estimate_option",
    "find_accelerator",
    "find_instance",
    "get_catalog",
    "load_catalog",
    "load_job",
    "parse_job",
    "plan_job",
    "resolve_model",
]


def test_all_is_frozen() -> None:
    assert sorted(trainplan.__all__) == PUBLIC_API
    assert len(set(trainplan.__all__)) == len(trainplan.__all__)


def test_every_exported_name_is_importable() -> None:
    module = importlib.import_module("trainplan")
    for name in PUBLIC_API:
        assert hasattr(module, name), name
        assert getattr(module, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from trainplan import *", namespace)
    assert set(PUBLIC_API) - {"__version__"} <= set(namespace)


def test_exported_objects_are_trainplan_objects() -> None:
    for name in PUBLIC_API:
        obj = getattr(trainplan, name)
        if name in ("__version__", "Job"):  # a string; an Annotated union
            continue
        assert obj.__module__.startswith("trainplan."), (name, obj.__module__)


def test_error_hierarchy() -> None:
    for cls in (trainplan.SpecError, trainplan.CatalogError, trainplan.InfeasibleError):
        assert issubclass(cls, trainplan.TrainplanError)
        assert cls("x").exit_code == 2


def test_enums_are_string_valued_for_json() -> None:
    assert issubclass(trainplan.Strategy, str) and trainplan.Strategy("zero2") is trainplan.Strategy.ZERO2
    assert issubclass(trainplan.Objective, str) and {o.value for o in trainplan.Objective} == {"cost", "time", "co2"}
    assert issubclass(trainplan.ZeroStage, enum.IntEnum)
    assert trainplan.ZeroStage.STAGE_3 > trainplan.ZeroStage.STAGE_2 > trainplan.ZeroStage.STAGE_1


def test_entry_point_signatures() -> None:
    """The documented calls keep working: load_job(path), parse_job(data), plan_job(job, catalog, objective=...)."""
    assert list(inspect.signature(trainplan.load_job).parameters) == ["path"]
    assert list(inspect.signature(trainplan.parse_job).parameters)[:1] == ["data"]
    params = inspect.signature(trainplan.plan_job).parameters
    assert list(params)[:2] == ["job", "catalog"]
    assert params["objective"].kind is inspect.Parameter.KEYWORD_ONLY


def test_version_is_a_string() -> None:
    assert isinstance(trainplan.__version__, str)
    assert trainplan.__version__.count(".") >= 1


def test_documented_quick_start() -> None:
    """The usage in trainplan/__init__.py's docstring."""
    from pathlib import Path

    job = trainplan.load_job(Path(trainplan.__file__).parent / "examples" / "llama7b-sft.yaml")
    plan = trainplan.plan_job(job)
    best = plan.best.to_dict()
    assert best["fits"] is True and best["cost_usd"] > 0


def test_importing_the_core_and_the_cli_does_not_import_torch() -> None:
    """The core is light (pydantic, typer, rich, PyYAML): planning never needs torch installed."""
    code = "import sys, trainplan, trainplan.cli.main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
