"""Op registry: the ops of this package, found by name.

Every op is an :class:`~cuvil_edge.ir.ops._contract.OpDef` (see ``_contract.py``): one kernel
function shared by the interpreter and the code generator, ``attrs(node)`` computed once for both,
``infer``, ``flops`` and, for contractions, ``macs``. Modules list their ops in ``OPS``: families
as table rows (``unary.py``, ``binary.py``, ``reduce.py``, ``window.py``, ``pooling.py``, ...);
modules whose name starts with ``_`` hold shared helpers and register nothing.

``VERSIONS`` are the opsets at which ONNX changed an op's schema, oldest first (what was checked
against the spec). The oldest is the floor: a model below it is refused (:func:`get`). A node's
``version`` is the model's default-domain opset, unmapped; ``infer`` and ``attrs`` branch on it
(``node.version >= 18``) where behaviour differs between those versions, and dtype tables
(``_elementwise.allowed``) are keyed by it.

``ATTRS`` (attribute name -> kind) lists every attribute an op reads;
:func:`cuvil_edge.ir.infer.build_graph` checks the kinds (``_util.check_attrs``) before ``infer``,
so ``int(node.attr(...))`` never meets a list or a string. ``CONST_INPUTS`` lists inputs whose
*values* ``infer`` needs (Reshape's shape): ``infer(node, inputs, consts={index: array})``, see
:func:`cuvil_edge.ir.infer.const_inputs`.
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache

from cuvil_edge.errors import UnsupportedOpError
from cuvil_edge.ir.ops._contract import OpDef

@lru_cache(maxsize=1)
def registry() -> dict[str, OpDef]:
    """All ops of this package, keyed by ONNX op type (the ``OPS`` of every public module).

    Raises:
        ImportError: a public module lists no ``OPS``, lists something that is not an OpDef, or
            two rows define the same op.
    """
    found: dict[str, OpDef] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        rows = getattr(module, "OPS", None)
        if not rows or not all(isinstance(op, OpDef) for op in rows):
            raise ImportError(f"op module {module.__name__} must list its ops as OpDef rows in OPS")
        for op in rows:
            if op.OP_TYPE in found:
                raise ImportError(f"op {op.OP_TYPE} is defined twice ({module.__name__})")
            found[op.OP_TYPE] = op
    return found


def supported_ops() -> list[str]:
    return sorted(registry())


def get(op_type: str, where: str = "", opset: int | None = None) -> OpDef:
    """The definition of ``op_type``.

    Raises:
        UnsupportedOpError: no module implements the op, or not at ``opset``.
    """
    module = registry().get(op_type)
    loc = f" at {where}" if where else ""
    if module is None:
        raise UnsupportedOpError(
            f"unsupported op {op_type!r}{loc}; supported ops: {', '.join(supported_ops())}. "
            "Re-export the model using only these ops, or add an op definition under cuvil_edge/ir/ops/ (see _contract.py)."
        )
    if opset is not None and opset < min(module.VERSIONS):
        raise UnsupportedOpError(
            f"op {op_type!r}{loc} at opset {opset} is older than the oldest supported version "
            f"{min(module.VERSIONS)}; upgrade the model with onnx.version_converter"
        )
    return module
