"""Graph -> graph rewrites: the pass framework (:mod:`._infra`) and one module per pass.

:func:`optimize` runs the default pipeline to a fixed point.
"""

from __future__ import annotations

from cuvil_edge.ir.graph import Graph
from cuvil_edge.passes._infra import OptimizeReport, Pass, PassManager, PassReport, PassResult
from cuvil_edge.passes.cse import CommonSubexpressionElimination
from cuvil_edge.passes.dead_code import DeadCodeElimination
from cuvil_edge.passes.fold_batchnorm import FoldBatchNorm
from cuvil_edge.passes.fold_constants import ConstantFolding
from cuvil_edge.passes.fuse_activation import FuseActivation
from cuvil_edge.passes.fuse_bias import FuseBias
from cuvil_edge.passes.fuse_conv_add import FuseConvAdd, split_conv_add
from cuvil_edge.passes.fuse_dw_pw import FuseDepthwisePointwise, split_dw_pw
from cuvil_edge.passes.fuse_gelu import FuseGelu
from cuvil_edge.passes.fuse_swish import FuseSwish
from cuvil_edge.passes.remove_identity import RemoveIdentity


def default_passes() -> list[Pass]:
    """The default pipeline, in order: clean up, fold, fuse, clean up."""
    return [
        RemoveIdentity(),
        ConstantFolding(),
        DeadCodeElimination(),
        CommonSubexpressionElimination(),
        FoldBatchNorm(),
        FuseBias(),
        FuseGelu(),
        FuseSwish(),
        FuseActivation(),
        FuseDepthwisePointwise(),
        FuseConvAdd(),
        DeadCodeElimination(),
    ]


def split_fused_blocks(graph: Graph) -> Graph:
    """``graph`` with the multi-node fusions (CuvilDwPw, CuvilConvAdd) written out again as the
    convolutions, Adds and activations they were made of: training lowers one torch layer per
    convolution and int8 quantizes convolutions one by one, and neither has a fused block's form.

    Raises:
        ModelError: the rewritten graph does not type-check.
    """
    return split_conv_add(split_dw_pw(graph))


def optimize(graph: Graph, passes: list[Pass] | None = None, max_iterations: int = 8) -> tuple[Graph, OptimizeReport]:
    """Run ``passes`` (default: :func:`default_passes`) to a fixed point.

    Raises:
        PassError: a pass failed (it is named) or no fixed point was reached.
    """
    return PassManager(default_passes() if passes is None else passes, max_iterations).run(graph)


__all__ = [
    "optimize",
    "split_fused_blocks",
    "default_passes",
    "Pass",
    "PassResult",
    "PassManager",
    "PassReport",
    "OptimizeReport",
    "CommonSubexpressionElimination",
    "DeadCodeElimination",
    "FoldBatchNorm",
    "ConstantFolding",
    "FuseActivation",
    "FuseConvAdd",
    "FuseBias",
    "FuseDepthwisePointwise",
    "FuseGelu",
    "FuseSwish",
    "RemoveIdentity",
]
