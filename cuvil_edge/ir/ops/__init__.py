"""Op registry: the ops of this package, found by name.

New ops are :class:`~cuvil_edge.ir.ops._contract.OpDef` definitions (one kernel function shared
by the interpreter and the code generator; families as table rows in modules that list ``OPS``,
e.g. ``unary.py``); see ``_contract.py``. Older op modules define (see ``tanh.py``):

``OP_TYPE``   the ONNX op name.
``VERSIONS``  the opsets at which ONNX changed the op's schema, oldest first (what was
              checked against the spec). The oldest is the floor: a model below it is
              refused. ``node.version`` is the model's default-domain opset, unmapped;
              ``infer``/``kernel`` branch on it (``node.version >= 18``) where behaviour
              differs between these versions.
``infer(node, inputs) -> list[TensorType]``
              output types from input types (``None`` for absent optional inputs);
              raises :class:`~cuvil_edge.errors.ShapeInferenceError`.
``ATTRS``     (optional) attribute name -> kind (``INT``, ``INTS``, ``FLOAT``, ``FLOATS``,
              ``STR``, ``TENSOR`` from ``_util``) for every attribute the module reads;
              :func:`cuvil_edge.ir.infer.build_graph` checks the kinds (``_util.check_attrs``)
              before calling ``infer``, so ``int(node.attr(...))`` never meets a list or a string.
``CONST_INPUTS`` (optional) indices of inputs whose *values* ``infer`` needs
              (Reshape's shape).  When present and non-empty, ``infer`` is
              called as ``infer(node, inputs, consts={index: array})`` with the
              listed inputs that are initializers (absent ones are missing from
              the dict; infer raises if it cannot do without them).  See
              :func:`cuvil_edge.ir.infer.const_inputs`.
``kernel(node, *arrays) -> list[np.ndarray]``
              the numpy reference used by the interpreter.
``flops(node, inputs, outputs) -> int``
              floating-point operations (a multiply-add counts 2) for static types.
``TEMPLATE``  numpy source of the kernel function(s) the code generator pastes
              into a compiled module; may branch on ``TARGET_*`` capability
              constants, which the AST pruner folds per target.
``emit(node, args, outs) -> str``
              the source line(s) that call the template at this node.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from types import ModuleType

from cuvil_edge.errors import UnsupportedOpError

_REQUIRED = ("OP_TYPE", "VERSIONS", "infer", "kernel", "flops", "TEMPLATE", "emit")


@lru_cache(maxsize=1)
def registry() -> dict[str, ModuleType]:
    """All ops of this package, keyed by ONNX op type: op modules, and the
    :class:`~cuvil_edge.ir.ops._contract.OpDef` rows of modules that declare ``OPS``."""
    found: dict[str, ModuleType] = {}

    def add(op_type: str, op, where: str) -> None:
        if op_type in found:
            raise ImportError(f"op {op_type} is defined twice ({where})")
        found[op_type] = op

    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "OPS"):
            for op in module.OPS:
                add(op.OP_TYPE, op, module.__name__)
            continue
        missing = [attr for attr in _REQUIRED if not hasattr(module, attr)]
        if missing:
            raise ImportError(f"op module {module.__name__} lacks {', '.join(missing)}")
        add(module.OP_TYPE, module, module.__name__)
    return found


def supported_ops() -> list[str]:
    return sorted(registry())


def get(op_type: str, where: str = "", opset: int | None = None) -> ModuleType:
    """The module implementing ``op_type``.

    Raises:
        UnsupportedOpError: no module implements the op, or not at ``opset``.
    """
    module = registry().get(op_type)
    loc = f" at {where}" if where else ""
    if module is None:
        raise UnsupportedOpError(
            f"unsupported op {op_type!r}{loc}; supported ops: {', '.join(supported_ops())}. "
            "Re-export the model using only these ops, or add an op module under cuvil_edge/ir/ops/."
        )
    if opset is not None and opset < min(module.VERSIONS):
        raise UnsupportedOpError(
            f"op {op_type!r}{loc} at opset {opset} is older than the oldest supported version "
            f"{min(module.VERSIONS)}; upgrade the model with onnx.version_converter"
        )
    return module
