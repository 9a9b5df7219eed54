"""The op catalog: what the op registry supports, as rows and as the markdown of docs/OPS.md.

Everything here is read from the registry (:mod:`cuvil_edge.ir.ops`), never typed by hand, so the
page cannot drift from the code: ``cuvil-edge ops --write docs/OPS.md`` regenerates it and a test
(``tests/ir/test_op_catalog.py``) fails when it differs. What the registry knows of an op, and
therefore all the catalog says: its ONNX schema versions (the oldest is the floor; a model at any
later opset is accepted), the module defining it, the attributes it reads (others are ignored,
:func:`cuvil_edge.ir.ops._util.check_attrs`) and the inputs whose values inference needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cuvil_edge.ir import ops

#: The command that rewrites docs/OPS.md (the test's failure message repeats it).
REGENERATE = "cuvil-edge ops --write docs/OPS.md"

#: Ops the project's passes make (fusions) carry this prefix; an imported model never holds one,
#: since the importer accepts only the ai.onnx domain and onnx.checker knows no such op there.
INTERNAL_PREFIX = "Cuvil"

_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")


@dataclass(frozen=True)
class OpEntry:
    """One supported op, as the registry describes it."""

    op_type: str
    domain: str  # "ai.onnx", or "internal" for the ops passes make
    versions: tuple[int, ...]  # the ONNX schema versions checked, oldest first
    module: str  # the module under cuvil_edge/ir/ops/ that defines it
    attributes: tuple[str, ...]  # the attributes it reads
    notes: str

    @property
    def opsets(self) -> str:
        """The model opsets it runs at: its oldest version and every later one."""
        return f"≥ {self.versions[0]}"


def entry(op_type: str) -> OpEntry:
    """The catalog row of one op.

    Raises:
        UnsupportedOpError: the registry has no such op (the message suggests close names).
    """
    op = ops.get(op_type)
    internal = op_type.startswith(INTERNAL_PREFIX)
    notes = ["made by a pass, never read from a model"] if internal else []
    if op.CONST_INPUTS:
        names = [_ORDINALS[i] if i < len(_ORDINALS) else f"#{i + 1}" for i in op.CONST_INPUTS]
        which = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        plural = "s" if len(names) > 1 else ""
        notes.append(f"shape inference reads the value{plural} of its {which} input{plural}")
    return OpEntry(
        op_type,
        "internal" if internal else "ai.onnx",
        tuple(op.VERSIONS),
        ops.op_modules()[op_type],
        tuple(sorted(op.ATTRS)),
        "; ".join(notes),
    )


def entries() -> list[OpEntry]:
    """Every supported op, grouped by defining module (modules and ops in name order)."""
    return sorted((entry(name) for name in ops.supported_ops()), key=lambda e: (e.module, e.op_type))


def summary(module: str) -> str:
    """The op module's first phrase ("Elementwise unary ops"), to head its group."""
    import importlib

    doc = " ".join((importlib.import_module(f"{ops.__name__}.{module}").__doc__ or "").split())
    first = re.split(r",? one (?:table )?row|,? the op contract| \(the op contract|[.:;](?: |$)", doc, maxsplit=1)[0]
    return first.replace("``", "`")  # reStructuredText literals, as markdown


def markdown() -> str:
    """The whole of docs/OPS.md."""
    rows = entries()
    lines = [
        "# Supported ops",
        "",
        f"<!-- Generated from the op registry (cuvil_edge/ir/ops/) by `{REGENERATE}`; do not edit by hand. -->",
        "",
        f"cuvil-edge imports, optimizes and runs these {len(rows)} ops. Only ONNX's default domain (`ai.onnx`) "
        "is supported: a node from another domain (`com.microsoft`, a custom one) is refused, so re-export "
        "such models with standard ops.",
        "",
        "- **opsets**: the model opsets the op runs at. The oldest ONNX version of the op is its floor; a "
        "model below it is refused (upgrade it with `onnx.version_converter`).",
        "- **ONNX versions**: the opsets at which ONNX changed the op's schema, each checked against the spec.",
        "- **attributes read**: the attributes the op uses; it ignores any other.",
        "",
        "`cuvil-edge ops` prints this table; `cuvil-edge ops Conv` shows one op.",
    ]
    for module in dict.fromkeys(e.module for e in rows):
        group = [e for e in rows if e.module == module]
        lines += [
            "",
            f"## `{module}`: {summary(module)}",
            "",
            "| op | domain | opsets | ONNX versions | attributes read | notes |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {e.op_type} | {e.domain} | {e.opsets} | {', '.join(map(str, e.versions))} | "
            f"{', '.join(e.attributes) or '-'} | {e.notes or '-'} |"
            for e in group
        ]
    return "\n".join(lines) + "\n"
