"""The names a package accepts, for everything that makes names before packaging.

PACKAGE_SPEC §1.3: no name may hold a control, bidi, line-separator or byte-order-mark
character or a backslash, or start with a drive letter (``C:``); a tensor (initializer) name
may moreover neither start with ``/`` nor have a ``..`` path component.  The package writer
refuses anything else (``cuvil_edge.ir_serialize._canonical``), and it sits a layer above the
frontend and the passes, so the rule is restated here and ``tests/passes/test_naming.py`` holds
the two to the same table of names.

Exporters name values like paths (torch: ``/fc1/Gemm_output_0``, and the outputs of its
``Constant`` nodes, ``/Constant_output_0``), which is fine for a value but not for the
initializer such a value becomes once it is folded: :func:`fresh_tensor_name` makes a valid,
unused name from any such base.
"""

from __future__ import annotations

import re

#: The characters PACKAGE_SPEC §1.3 forbids in every name.
FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff\\\\]")
DRIVE_LETTER = re.compile("[A-Za-z]:")
#: Longest name the package reads (tensor and graph names alike).
MAX_CHARS = 4096
#: Room left for the ``_<n>`` suffix that makes a stem unique.
_STEM_CHARS = MAX_CHARS - 32


def is_graph_name(name: str) -> bool:
    """Whether the package accepts ``name`` for a graph value or node (``/`` allowed)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_CHARS
        and FORBIDDEN.search(name) is None
        and DRIVE_LETTER.match(name) is None
    )


def is_tensor_name(name: str) -> bool:
    """Whether the package accepts ``name`` for an initializer: a graph name that does not look
    like a path (no leading ``/``, no ``..`` component)."""
    return is_graph_name(name) and not name.startswith("/") and ".." not in name.split("/")


def graph_stem(name: str) -> str:
    """``name`` with the characters no name may hold replaced by ``_`` and a drive-letter start
    escaped, so the result is a valid graph name (``name`` itself when it is one)."""
    if is_graph_name(name):
        return name
    stem = FORBIDDEN.sub("_", name)[:_STEM_CHARS] or "value"
    return "_" + stem if DRIVE_LETTER.match(stem) else stem


def tensor_stem(name: str) -> str:
    """A valid tensor name read off ``name``: its graph stem without empty and ``..`` path parts
    (``/conv/Reshape_const1`` -> ``conv/Reshape_const1``); ``name`` itself when it is valid."""
    if is_tensor_name(name):
        return name
    stem = "/".join(p for p in FORBIDDEN.sub("_", name).split("/") if p not in ("", ".."))[:_STEM_CHARS] or "tensor"
    return "_" + stem if DRIVE_LETTER.match(stem) else stem


def fresh_name(taken: set[str], base: str) -> str:
    """``base`` or ``base_1``, ``base_2`` ... not in ``taken`` (which is updated)."""
    name, suffix = base, 0
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    taken.add(name)
    return name


def fresh_tensor_name(taken: set[str], base: str) -> str:
    """A new initializer name: :func:`tensor_stem` of ``base``, made unique against ``taken``
    (which is updated). Every initializer a pass or the importer creates is named by this."""
    return fresh_name(taken, tensor_stem(base))


def fresh_graph_name(taken: set[str], base: str) -> str:
    """A new value or node name: :func:`graph_stem` of ``base``, unique against ``taken``."""
    return fresh_name(taken, graph_stem(base))


__all__ = [
    "is_graph_name",
    "is_tensor_name",
    "graph_stem",
    "tensor_stem",
    "fresh_name",
    "fresh_tensor_name",
    "fresh_graph_name",
    "FORBIDDEN",
    "DRIVE_LETTER",
    "MAX_CHARS",
]
