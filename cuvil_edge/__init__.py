"""cuvil-edge: federated edge deployment of ONNX models, with local builds and DP training.

The Python API (implemented in :mod:`cuvil_edge.api`)::

    compile(model, target="x86-64", precision="fp32", calibration=None) -> Model   # call it on numpy arrays
    plan(federation, model=None) -> list[SitePlan]                                 # `cuvil-edge plan`
    simulate(federation, rounds=None, home=None) -> Simulation                     # `cuvil-edge demo`
    __version__

Every name is resolved on first use, so ``import cuvil_edge`` imports neither onnx, torch, flwr
nor opacus (nor the rest of the package): a device or a notebook pays only for what it calls.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Model", "RoundMetrics", "SiteRound", "Simulation", "compile", "plan", "simulate", "__version__"]

_API = {"Model", "RoundMetrics", "SiteRound", "Simulation", "compile", "plan", "simulate"}


def __getattr__(name: str) -> Any:
    if name in _API:
        from cuvil_edge import api

        return getattr(api, name)
    if name == "__version__":
        globals()["__version__"] = version = _version()
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _version() -> str:
    """The installed distribution's version; in a source tree that is not installed, pyproject's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cuvil-edge")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"
