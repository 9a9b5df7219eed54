"""tests/conformance/COUNTS.md lists every architecture export the tests run, so the table of
what is known to work cannot quietly fall behind the tests."""

from __future__ import annotations

import re
from pathlib import Path

import test_architectures
import test_dynamo_exports
import test_exports
import test_site_path
import test_symbolic_shapes
import test_transformers_exports

COUNTS = Path(__file__).resolve().parents[1] / "conformance" / "COUNTS.md"


def _rows() -> dict[str, set[str]]:
    """file -> the model names its rows list."""
    section = COUNTS.read_text(encoding="utf-8").split("## Architecture exports", 1)[1]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0].endswith(".py"):
            names = {re.sub(r"\s*\(.*\)$", "", n.strip()) for n in cells[1].split(",")}
            rows.setdefault(cells[0], set()).update(names)
    return rows


def test_every_architecture_export_is_in_the_table():
    rows = _rows()
    expected = {
        "test_exports.py": set(test_exports.EXPORTS),
        "test_architectures.py": set(test_architectures.ARCHITECTURES),
        "test_symbolic_shapes.py": set(test_symbolic_shapes.CASES),
        "test_dynamo_exports.py": set(test_dynamo_exports.CASES),
        "test_site_path.py": set(test_site_path.SMALL),
        "test_transformers_exports.py": set(test_transformers_exports.CASES),
    }
    missing = {f: sorted(names - rows.get(f, set())) for f, names in expected.items() if names - rows.get(f, set())}
    assert not missing, f"COUNTS.md lacks {missing}"
