"""DESIGN.md §2: coordinator and agent never import each other (what they share lives lower)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cuvil_edge"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("side, other", [("coordinator", "agent"), ("agent", "coordinator")])
def test_coordinator_and_agent_never_import_each_other(side, other):
    offenders = [f"{p.relative_to(PACKAGE)} imports {name}" for p in sorted((PACKAGE / side).rglob("*.py"))
                 for name in _imports(p) if name.startswith(f"cuvil_edge.{other}")]
    assert offenders == []
