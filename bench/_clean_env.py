"""One-thread benchmarks run without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: this machine sets them,
and they make OpenBLAS pick kernels that halve sgemm speed. They must be gone before numpy loads, so
a benchmark calls :func:`reexec_without_openblas_env` before its other imports; the values it
removed are recorded for the results (:func:`removed`)."""

from __future__ import annotations

import json
import os
import sys

STRIPPED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_RECORD = "CUVIL_BENCH_REMOVED_ENV"


def reexec_without_openblas_env(script: str) -> None:
    """Re-execute ``script`` (with the same arguments) without the variables, if any is set."""
    if any(k in os.environ for k in STRIPPED):
        env = {k: v for k, v in os.environ.items() if k not in STRIPPED}
        env[_RECORD] = json.dumps({k: os.environ[k] for k in STRIPPED if k in os.environ})
        os.execve(sys.executable, [sys.executable, os.path.abspath(script), *sys.argv[1:]], env)


def removed() -> dict[str, str]:
    """The variables the re-execution removed (empty when none was set)."""
    return json.loads(os.environ.get(_RECORD, "{}"))
