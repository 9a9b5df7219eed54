"""DESIGN.md §2: a module imports only from its own layer or lower ones (imports inside functions
included), and coordinator and agent never import each other (what they share lives lower)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cuvil_edge"

#: DESIGN.md §2's table, by the first name under cuvil_edge (private_dir and extras are layer 0
#: beside atomic; the package's own entry points, api and __init__, sit with the CLI on top).
LAYERS = {"errors": 0, "atomic": 0, "private_dir": 0, "extras": 0, "ir": 0, "frontend": 1, "passes": 1, "ir_serialize": 2,
          "device_targets": 3, "privacy": 4, "config": 4.5, "datasets": 4.5, "coordinator": 5, "agent": 5,
          "cli": 6, "api": 6, "__init__": 6, "__main__": 6}


def _imports(path: Path) -> set[str]:
    """Every cuvil_edge module ``path`` imports, ``from cuvil_edge import x`` read as ``cuvil_edge.x``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"cuvil_edge.{a.name}" if _submodule(a.name) else "cuvil_edge.__init__" for a in node.names} \
                if node.module == "cuvil_edge" else {node.module}
    return {n for n in names if n.startswith("cuvil_edge.")}


def _submodule(name: str) -> bool:
    return (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file()


def _layer(module: str) -> float:
    top = module.split(".")[1]
    assert top in LAYERS, f"{module}: cuvil_edge.{top} has no layer; add it to LAYERS as DESIGN.md §2 places it"
    return LAYERS[top]


def _module(path: Path) -> str:
    return ".".join(("cuvil_edge", *path.relative_to(PACKAGE).with_suffix("").parts))


def test_every_module_imports_only_its_own_layer_or_lower():
    offenders = [f"{_module(p)} (layer {_layer(_module(p)):g}) imports {name} (layer {_layer(name):g})"
                 for p in sorted(PACKAGE.rglob("*.py")) for name in sorted(_imports(p))
                 if _layer(name) > _layer(_module(p))]
    assert offenders == []


@pytest.mark.parametrize("side, other", [("coordinator", "agent"), ("agent", "coordinator")])
def test_coordinator_and_agent_never_import_each_other(side, other):
    offenders = [f"{p.relative_to(PACKAGE)} imports {name}" for p in sorted((PACKAGE / side).rglob("*.py"))
                 for name in _imports(p) if name.startswith(f"cuvil_edge.{other}")]
    assert offenders == []


def test_the_layer_check_sees_a_violation(tmp_path):
    """The rule above can fail: an IR module importing the coordinator is named."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from cuvil_edge.coordinator import plan\n")
    assert _imports(bad) == {"cuvil_edge.coordinator"} and _layer("cuvil_edge.coordinator") > _layer("cuvil_edge.ir")
