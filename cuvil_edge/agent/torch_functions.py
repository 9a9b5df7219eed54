"""Torch functions for the IR ops that carry no trained weight (used by :mod:`torch_model`).

Each op declares its lowering on its OpDef, the ``torch`` facet ``fn(torch, node, *tensors)``
(most in :mod:`cuvil_edge.ir.ops._torch`, which takes torch as a parameter because the ir layer
imports none of it); this module passes torch in. The node's attributes are read per call; the
initializers a function reads are constants.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node
from cuvil_edge.ir.ops import _torch


def activation(node: Node) -> Callable[[torch.Tensor], torch.Tensor]:
    """The torch function of a fused ``activation`` attribute (refused where it has none)."""
    return _torch.activation(torch, node)


def check(node: Node) -> None:
    """Refuse, when the module is built, what a function could otherwise only refuse mid-training:
    a fused activation without a torch form (any op with an ``activation`` attribute, so checked
    for every node), then what the op's ``torch_check`` facet refuses.

    Raises:
        UnsupportedAttributeError: an activation, Pad mode, dilated AveragePool or blocked
            quantization without a lowering.
        UnsupportedOpError: MaxPool's Indices output is used.
    """
    _torch.check_activation(node)
    declared = ops.registry().get(node.op_type)
    if declared is not None and declared.torch_check is not None:
        declared.torch_check(node)


def lowering(op_type: str) -> Callable[..., Any] | None:
    """``fn(node, *tensors)`` computing ``op_type`` in torch: the torch facet its OpDef declares
    (read at each call, so an op registered later is covered)."""
    declared = ops.registry().get(op_type)
    if declared is None or declared.torch is None:
        return None
    facet = declared.torch
    return lambda node, *xs: facet(torch, node, *xs)


def lowered_ops() -> set[str]:
    """Every op type with a torch lowering."""
    return {name for name, op in ops.registry().items() if op.torch is not None}


def trainable_ops() -> set[str]:
    """Every op type that trains as a torch layer (its ``trainable`` facet)."""
    return {name for name, op in ops.registry().items() if op.trainable is not None}
