"""Device targets: specs, code generation, AST pruning, local build and cache (layer 3).

Public API::

    load_target(name) -> TargetSpec        list_targets() -> list[str]
    build(package, target, *, cache_dir, precision="fp32") -> CompiledModel
"""

from cuvil_edge.device_targets.build import COMPILER_VERSION, BuildInput, CompiledModel, build
from cuvil_edge.device_targets.spec import TargetSpec, list_targets, load_target

__all__ = [
    "COMPILER_VERSION",
    "BuildInput",
    "CompiledModel",
    "TargetSpec",
    "build",
    "list_targets",
    "load_target",
]
