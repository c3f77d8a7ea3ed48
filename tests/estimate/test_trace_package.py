"""The shape of the trace package: its public names, one module per concern, and what those modules may import.

The import rule keeps the tracer a library of the estimate layer: no module of
``trainplan.estimate.trace`` may import the planner, the runner, the CLI or the
CLI's libraries (typer, rich).  The check parses each module with ``ast`` (lazy
imports inside functions included), so it needs no torch.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

PACKAGE = "trainplan.estimate.trace"
PUBLIC = {"MemoryBreakdown", "TraceError", "TraceResult", "build_hf_causal_lm", "load_factory", "trace_training_step"}
FORBIDDEN = ("trainplan.planner", "trainplan.run", "trainplan.cli", "typer", "rich")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "trace.md"


def package_dir() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations, f"{PACKAGE} is not a package"
    return Path(next(iter(spec.submodule_search_locations)))


def module_files() -> list[Path]:
    return sorted(package_dir().glob("*.py"))


def module_name(path: Path) -> str:
    return PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, made absolute.

    ``from a import b`` yields ``a`` and ``a.b`` (``b`` may be a submodule).
    """
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def forbidden_imports(source: str, module: str, *, is_package: bool = False) -> list[str]:
    return sorted(
        name
        for name in imported_modules(source, module, is_package=is_package)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    )


@pytest.mark.parametrize("path", module_files(), ids=lambda p: p.name)
def test_no_module_imports_the_planner_runner_or_cli(path: Path) -> None:
    bad = forbidden_imports(path.read_text(), module_name(path), is_package=path.stem == "__init__")
    assert not bad, f"{path.name} imports {', '.join(bad)}"


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("import typer", ["typer"]),
        ("from rich.console import Console", ["rich.console", "rich.console.Console"]),
        ("from trainplan import planner", ["trainplan.planner"]),
        ("import trainplan.cli.main", ["trainplan.cli.main"]),
        ("def f():\n    from trainplan.run.api import run_job", ["trainplan.run.api", "trainplan.run.api.run_job"]),
        ("from ...run import api", ["trainplan.run", "trainplan.run.api"]),
        ("from trainplan.estimate.trace.memory import Phase", []),
        ("from . import memory", []),
        ("from trainplan.spec import Precision\nimport torch\nimport richer", []),
    ],
)
def test_the_import_check_flags_each_form(source: str, flagged: list[str]) -> None:
    assert forbidden_imports(source, f"{PACKAGE}.step") == flagged


def test_the_old_modules_are_gone() -> None:
    for old in ("trace_setup", "trace_memory"):
        assert importlib.util.find_spec(f"trainplan.estimate.{old}") is None
    assert not (package_dir().parent / "trace.py").exists()


def test_public_names() -> None:
    pytest.importorskip("torch")
    trace = importlib.import_module(PACKAGE)
    from trainplan.errors import TrainplanError

    assert set(trace.__all__) == PUBLIC
    assert all(callable(getattr(trace, name)) for name in PUBLIC)
    assert issubclass(trace.TraceError, TrainplanError)


def test_no_module_level_mutable_containers() -> None:
    """Module-level tables are read-only constants (mappingproxy, frozenset, tuple), never caches filled at run time."""
    pytest.importorskip("torch")
    mutable = []
    for path in module_files():
        module = importlib.import_module(module_name(path))
        for name, value in vars(module).items():
            if not name.startswith("__") and isinstance(value, (dict, list, set, bytearray)):
                mutable.append(f"{path.name}: {name} ({type(value).__name__})")
    assert not mutable, mutable


def test_docs_name_every_module() -> None:
    text = DOCS.read_text()
    section = text[text.index("## Where things live") :]
    section = section[: section.index("\n## ", 1)]
    missing = [p.name for p in module_files() if p.stem != "__init__" and f"`{p.name}`" not in section]
    assert not missing, f"docs/trace.md 'Where things live' does not name {missing}"
