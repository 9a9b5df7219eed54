"""Element types the IR knows, by name, with their numpy and ONNX equivalents.

The IR names dtypes by numpy's canonical names ("float32", "int64" ...).  The
ONNX enum numbers live here as plain data so that only ``frontend`` has to
import ``onnx``.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import UnsupportedAttributeError

#: IR dtype name -> ONNX TensorProto.DataType number.
ONNX_CODE: dict[str, int] = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
}
FROM_ONNX_CODE: dict[int, str] = {code: name for name, code in ONNX_CODE.items()}

SUPPORTED: frozenset[str] = frozenset(ONNX_CODE)
FLOATS: frozenset[str] = frozenset({"float16", "float32", "float64"})


def check(name: str, where: str = "") -> str:
    """Return ``name`` if the IR supports it.

    Raises:
        UnsupportedAttributeError: the dtype is not one of :data:`SUPPORTED`.
    """
    if name not in SUPPORTED:
        loc = f" in {where}" if where else ""
        raise UnsupportedAttributeError(
            f"unsupported dtype {name!r}{loc}; supported dtypes: {', '.join(sorted(SUPPORTED))}"
        )
    return name


def to_numpy(name: str) -> np.dtype:
    """The numpy dtype for an IR dtype name."""
    return np.dtype(check(name))


def from_numpy(dtype: np.dtype) -> str:
    """The IR dtype name for a numpy dtype.

    Raises:
        UnsupportedAttributeError: numpy dtype has no IR equivalent.
    """
    return check(np.dtype(dtype).name)


def itemsize(name: str) -> int:
    """Bytes per element."""
    return to_numpy(name).itemsize
