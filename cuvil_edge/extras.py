"""Optional dependencies: which extra of pyproject.toml brings them, checked before they are used.

The base install is a device that verifies, builds, evaluates and runs `agent infer` with numpy
alone; torch, onnx, Flower, scipy and the rest come with the extra of the role that needs them.
Code that needs one imports it inside the function (never at module level, so the device's
entry points stay importable: tests/test_install_imports.py) and calls :func:`require` first,
so a missing package is one line naming the extra instead of a traceback from deep inside.
"""

from __future__ import annotations

from importlib.util import find_spec

from cuvil_edge.errors import MissingDependencyError


def missing(modules: tuple[str, ...]) -> tuple[str, ...]:
    """The top-level ``modules`` that are not installed (looked up, not imported)."""
    return tuple(m for m in modules if find_spec(m) is None)


def require(modules: tuple[str, ...], what: str, extra: str) -> None:
    """Check that every top-level module in ``modules`` is installed.

    Raises:
        MissingDependencyError: one is not; the message is ``what`` and ``pip install
            'cuvil-edge[extra]'``.
    """
    absent = missing(modules)
    if absent:
        raise MissingDependencyError(what, extra, absent)
