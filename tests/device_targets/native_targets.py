"""What the native-kernel tests share: whether a C compiler is here, and x86-64 with and without
native kernels (everything else equal), so one build can be compared with the other."""

from __future__ import annotations

import pytest

from cuvil_edge.device_targets import load_target
from cuvil_edge.ir.ops import _native

HAS_COMPILER = _native._compiler() is not None
needs_compiler = pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler on PATH: only the numpy path exists")
NATIVE = load_target("x86-64")
NUMPY = NATIVE.model_copy(update={"native_kernels": False})


class Package:
    """Stands in for a verified package (build() reads only these two)."""

    def __init__(self, graph, payload_digest: str = "cd" * 32):
        self.graph, self.payload_digest = graph, payload_digest
