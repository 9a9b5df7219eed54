"""`cuvil-edge ops [OP]`: the ops cuvil-edge supports and their opsets (ir.op_catalog); with
--markdown or --write, docs/OPS.md itself."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def ops_cmd(
    op: str | None = typer.Argument(None, metavar="[OP]", help="one op to show (e.g. Conv)"),
    markdown: bool = typer.Option(False, "--markdown", help="print docs/OPS.md's markdown"),
    write: Path | None = typer.Option(
        None, "--write", help="write the markdown to this file (docs/OPS.md; a test checks it matches the registry)"
    ),
) -> None:
    """List every supported op with its opsets, or show one op (its versions, attributes, notes)."""
    from cuvil_edge.atomic import atomic_write
    from cuvil_edge.ir import op_catalog

    if write is not None or markdown:
        text = op_catalog.markdown()
        if write is not None:
            atomic_write(write, text.encode("utf-8"), mode=0o644)
            console.print(f"wrote {write} ({len(op_catalog.entries())} ops)")
        if markdown:
            print(text, end="")  # plain: the output is a file's content, never Rich markup
        return
    if op is not None:
        e = op_catalog.entry(op)  # an unknown op: UnsupportedOpError suggests close names
        for key, value in (
            ("op", e.op_type),
            ("domain", e.domain),
            ("opsets", e.opsets),
            ("ONNX versions", ", ".join(map(str, e.versions))),
            ("defined in", f"cuvil_edge/ir/ops/{e.module}.py"),
            ("attributes read", ", ".join(e.attributes) or "-"),
            ("notes", e.notes or "-"),
        ):
            console.print(f"{key:<16} {value}", markup=False, highlight=False)
        return
    table = Table(title="supported ops (docs/OPS.md; `cuvil-edge ops OP` for one)")
    table.add_column("op", no_wrap=True)
    for name in ("domain", "opsets", "ONNX versions", "module", "notes"):
        table.add_column(name)
    rows = op_catalog.entries()
    for e in rows:
        table.add_row(e.op_type, e.domain, e.opsets, ", ".join(map(str, e.versions)), e.module, e.notes or "-")
    console.print(table)
    console.print(f"{len(rows)} ops; only the default ONNX domain (ai.onnx) is supported")
