"""docs/ARCHITECTURE.md is where a new engineer starts reading ("where to start reading"): every
file it names, by path or by bare name, must be a file of the project, so the map does not point
at a module that moved or went."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
#: a file named in code style: `dims.py`, `ir/ops/_contract.py`, `docs/PRIVACY.md`
NAMED = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.(?:py|md|c|yaml|toml))`")


def project_files() -> list[str]:
    found = [p.name for p in ROOT.iterdir() if p.is_file()]
    for folder in ("cuvil_edge", "docs", "configs", "tests", "bench", ".ci"):
        found += [p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts]
    return found


def missing(text: str, files: list[str]) -> list[str]:
    """The files ``text`` names that are not among ``files`` (those outside the repository, such as
    ``../shared/DESIGN.md``, left out)."""
    named = {n for n in NAMED.findall(text) if not n.startswith("../")}
    return sorted(n for n in named if not any(f == n or f.endswith("/" + n) for f in files))


def test_every_file_the_architecture_doc_names_is_in_the_project():
    text = DOC.read_text(encoding="utf-8")
    assert len(set(NAMED.findall(text))) > 40  # the map names the modules it describes
    assert missing(text, project_files()) == [], "docs/ARCHITECTURE.md names files that are not in the project"


def test_the_check_finds_a_named_file_that_is_not_there():
    files = project_files()
    text = "`ir/dim_render.py` (the text), `dims_gone.py`, `passes/fold_batchnorm.py`, `../shared/DESIGN.md`"
    assert missing(text, files) == ["dims_gone.py"]
