"""The package layout: one import namespace, and imports that go one way.

The import graph is read from the source (every module's ``import`` statements), not from a
list kept by hand: operators ← sinks ← flows ← examples.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DIRS = {"operators": "respflow.operators", "sinks": "respflow.sinks", "flows": "respflow.flows", "examples": "examples"}
LAYERS = {"respflow.operators": 0, "respflow.sinks": 1, "respflow.flows": 2, "examples": 3}


def _modules() -> list[tuple[str, str, Path]]:
    """``(layer package, dotted package of the file, path)`` for every source file."""
    out = []
    for directory, package in DIRS.items():
        for path in sorted((ROOT / directory).rglob("*.py")):
            parts = path.relative_to(ROOT / directory).parent.parts
            out.append((package, ".".join([package, *parts]), path))
    return out


def _imports(source: str, dotted_package: str) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``source``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = dotted_package.split(".")
                base = base[: len(base) - (node.level - 1)]
                found.append((node.lineno, ".".join([*base, *([node.module] if node.module else [])])))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def _layer(module: str) -> int | None:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def violations(source: str, package: str, dotted_package: str) -> list[str]:
    out = []
    for line, module in _imports(source, dotted_package):
        top = module.split(".")[0]
        if top in ("operators", "sinks", "flows"):
            out.append(f"line {line}: imports {module!r}; the import name is respflow.{top}")
        layer = _layer(module)
        if layer is not None and layer > LAYERS[package]:
            out.append(f"line {line}: {package} must not import {module} (operators ← sinks ← flows ← examples)")
    return out


def test_the_source_tree_is_read() -> None:
    modules = _modules()
    assert len(modules) > 30
    assert any(p.name == "_relay.py" for _, _, p in modules)
    # the relay imports the operators: edges are found
    relay = next(p for _, _, p in modules if p.name == "_relay.py")
    assert any(m.startswith("respflow.operators") for _, m in _imports(relay.read_text(), "respflow.sinks"))


@pytest.mark.parametrize(("package", "dotted", "path"), _modules(), ids=lambda v: str(v).rsplit("/", 2)[-1] if isinstance(v, Path) else "")
def test_imports_go_one_way(package: str, dotted: str, path: Path) -> None:
    assert violations(path.read_text(), package, dotted) == []


def test_the_checker_sees_violations() -> None:
    assert violations("from respflow.flows import Graph\n", "respflow.operators", "respflow.operators")
    assert violations("from ...flows import x\n", "respflow.sinks", "respflow.sinks.store")
    assert not violations("from ..flows import x\n", "respflow.sinks", "respflow.sinks.store")  # respflow.sinks.flows
    assert violations("import flows\n", "respflow.flows", "respflow.flows")
    assert not violations("from respflow.operators import Frame\n", "respflow.sinks", "respflow.sinks")
