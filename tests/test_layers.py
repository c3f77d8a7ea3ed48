"""The layer rules of the package, enforced: data flows one way (PRODUCT.md, "Architecture sketch").

job spec/catalog → estimate → measure → planner → run → cli/report: a module imports
only from its own layer or the layers below.  Imports inside functions count too
(hiding an import in a function does not change the dependency).  The library
(everything below the presentation layer) imports neither typer nor rich.
"""

from __future__ import annotations

import ast
from pathlib import Path

import trainplan

ROOT = Path(trainplan.__file__).parent

# Lower number = lower layer.  Every module of the package must fall under one prefix.
LAYERS: dict[str, int] = {
    "trainplan.errors": 0,
    "trainplan.files": 0,
    "trainplan.frozen": 0,  # evolve(): a changed copy of a frozen dataclass
    "trainplan.model": 0,
    "trainplan.hfconfig": 0,
    "trainplan.strategies": 0,
    "trainplan.catalog": 1,
    "trainplan.spec": 2,
    "trainplan.zoo": 1,
    "trainplan.examples": 2,
    "trainplan.estimate": 3,
    "trainplan.measure": 4,
    "trainplan.planner": 5,
    "trainplan.run": 6,
    "trainplan.runtime": 6,  # the user-facing re-export of trainplan.run.runtime
    "trainplan.cli": 7,
    "trainplan.report": 7,
    "trainplan.serve": 7,
}
PRESENTATION = 7
UI_LIBRARIES = ("typer", "rich", "click")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int | None:
    best = None
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return best[1] if best else None


def _imports(path: Path, module: str) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((name, node.lineno))
            # `from trainplan import runtime` imports the submodule
            found += [(f"{name}.{a.name}", node.lineno) for a in node.names if name == "trainplan"]
    return found


def _modules() -> list[tuple[Path, str]]:
    return [(p, _module_name(p)) for p in sorted(ROOT.rglob("*.py"))]


def test_every_module_has_a_layer() -> None:
    missing = [m for _, m in _modules() if m != "trainplan" and _layer(m) is None]
    assert not missing, f"add these modules to LAYERS: {missing}"


def test_no_import_runs_up_the_layers() -> None:
    violations = []
    for path, module in _modules():
        if module == "trainplan":  # the package facade re-exports the public API from every layer
            continue
        own = _layer(module)
        for name, line in _imports(path, module):
            if not name.startswith("trainplan.") or name == "trainplan":
                continue
            target = _layer(name)
            if target is not None and own is not None and target > own:
                violations.append(f"{path.relative_to(ROOT)}:{line} ({module}, layer {own}) imports {name} (layer {target})")
    assert not violations, "\n".join(violations)


def test_the_library_imports_no_ui_toolkit() -> None:
    violations = []
    for path, module in _modules():
        if _layer(module) == PRESENTATION:
            continue
        for name, line in _imports(path, module):
            if name.split(".")[0] in UI_LIBRARIES:
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not violations, "\n".join(violations)


def test_the_rule_checker_sees_a_violation(tmp_path: Path) -> None:
    """The checker itself can fail: an upward import hidden in a function is found."""
    probe = tmp_path / "compose.py"
    probe.write_text("def f():\n    from trainplan.planner.core import plan_job\n    from ..run import api\n")
    names = [n for n, _ in _imports(probe, "trainplan.estimate.compose")]
    assert names == ["trainplan.planner.core", "trainplan.run"]
    assert _layer("trainplan.planner.core") > _layer("trainplan.estimate.compose")
    assert _layer("trainplan.run.api") > _layer("trainplan.planner.core")
