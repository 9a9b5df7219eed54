"""Op registry: the ops of this package, found by name.

Every op is an :class:`~cuvil_edge.ir.ops._contract.OpDef` (see ``_contract.py``): one kernel
function shared by the interpreter and the code generator, ``attrs(node)`` computed once for both,
``infer``, ``flops`` and, for contractions, ``macs``. Modules list their ops in ``OPS``: families
as table rows (``unary.py``, ``binary.py``, ``reduce.py``, ``conv.py``, ``pooling.py``, ...);
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
:func:`cuvil_edge.ir.shape_values.consts_for`.

docs/OPS.md is this registry rendered (:mod:`cuvil_edge.ir.op_catalog`): a new op, or a change to
an op's ``VERSIONS``, ``ATTRS`` or ``CONST_INPUTS``, means running ``cuvil-edge ops --write
docs/OPS.md`` (a test compares). Errors point there rather than listing every op.
"""

from __future__ import annotations

import difflib
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


#: The domains the registry's ops belong to: ONNX's default one, under both of its names.
DEFAULT_DOMAINS = ("", "ai.onnx")

#: Where a person finds every supported op and its opsets (rendered from this registry by
#: :mod:`cuvil_edge.ir.op_catalog`); an error points there instead of listing every name.
SEE_ALSO = "see docs/OPS.md or run `cuvil-edge ops`"


@lru_cache(maxsize=1)
def op_modules() -> dict[str, str]:
    """The module of this package that defines each op (``"unary"``, ``"conv"``...)."""
    registry()  # refuses a broken module first, with registry's message
    return {
        op.OP_TYPE: info.name
        for info in pkgutil.iter_modules(__path__)
        if not info.name.startswith("_")
        for op in importlib.import_module(f"{__name__}.{info.name}").OPS
    }


def get(op_type: str, where: str = "", opset: int | None = None, domain: str = "") -> OpDef:
    """The definition of ``op_type`` (in ``domain``, for a model of default-domain ``opset``).

    Raises:
        UnsupportedOpError: the domain is not ONNX's default one, no module implements the op, or
            not at ``opset``; the message names the op and what is known of it (:func:`unsupported`).
    """
    module = registry().get(op_type)
    if domain not in DEFAULT_DOMAINS or module is None or (opset is not None and opset < min(module.VERSIONS)):
        raise UnsupportedOpError(unsupported(op_type, where, opset, domain))
    return module


def unsupported(op_type: str, where: str = "", opset: int | None = None, domain: str = "") -> str:
    """Why ``op_type`` cannot be used: a custom domain, an unknown name (with close names) or an
    opset below the op's oldest version (with the versions it has). Short: it points to
    docs/OPS.md rather than listing every op."""
    loc = f" at {where}" if where else ""
    known = registry().get(op_type)
    if domain not in DEFAULT_DOMAINS:
        same = f" (ai.onnx has {op_type!r} from opset {min(known.VERSIONS)}: re-export with it)" if known else ""
        return (
            f"op {op_type!r}{loc} is from domain {domain!r}; cuvil-edge supports only the default ONNX domain"
            f"{same}. Supported ops: {SEE_ALSO}"
        )
    if known is None:
        close = similar(op_type)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        asked = f", ai.onnx opset {opset}" if opset is not None else ""
        return (
            f"unsupported op {op_type!r}{loc}{asked}: cuvil-edge has no op of that name{hint}. Supported ops: "
            f"{SEE_ALSO}; re-export the model without it, or add it under cuvil_edge/ir/ops/"
        )
    versions = ", ".join(map(str, known.VERSIONS))
    return (
        f"op {op_type!r}{loc} needs opset {min(known.VERSIONS)} or later (cuvil-edge has its ONNX versions "
        f"{versions}), the model has opset {opset}; upgrade it with onnx.version_converter "
        f"(`cuvil-edge ops {op_type}`, docs/OPS.md)"
    )


def similar(op_type: str, limit: int = 3) -> list[str]:
    """Supported op names close to ``op_type``: the same name in other case (``GeLU``), or else
    difflib's closest and names one is a prefix of the other (``LayerNorm``, ``Convolution``)."""
    asked = op_type.lower()
    lowered = {name.lower(): name for name in registry()}
    if asked in lowered:
        return [lowered[asked]]
    close = difflib.get_close_matches(asked, list(lowered), n=limit, cutoff=0.75)
    prefixed = (n for n in lowered if min(len(n), len(asked)) >= 4 and (n.startswith(asked) or asked.startswith(n)))
    close += sorted(prefixed, key=len)
    return [lowered[n] for n in dict.fromkeys(close)][:limit]
