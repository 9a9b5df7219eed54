"""Attribute defaults are ONNX's: for every op of the registry and every attribute its schema (onnx.defs)
gives a default, at every opset the op lists, leaving the attribute out reads the same as writing the
schema's default. Attribute defaults are typed by hand in each op's ``attrs``; this holds them to the
spec, so a wrong one fails here instead of changing a model's results."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import defs

from cuvil_edge.frontend.onnx_import import _attr
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Node

#: attributes whose ONNX default our reading deliberately differs from, with the reason
DIFFERENT: dict[tuple[str, str], str] = {}

#: attributes without a default that an op's reading needs, set to a valid value on both nodes
REQUIRED = {
    "Cast": {"to": 1},
    "DepthToSpace": {"blocksize": 2},
    "SpaceToDepth": {"blocksize": 2},
    "GRU": {"hidden_size": 4},
    "LSTM": {"hidden_size": 4},
    "RNN": {"hidden_size": 4},
    "GroupNormalization": {"num_groups": 1},
    "LinearAttention": {"q_num_heads": 2, "kv_num_heads": 2},
    "LRN": {"size": 3},
    "TopK": {"k": 1},
    "Upsample": {"scales": (1.0, 1.0)},
}


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, float) or isinstance(b, float):
        return np.float32(a) == np.float32(b) or (np.isnan(a) and np.isnan(b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _cases():
    for name, op in sorted(ops.registry().items()):
        if name.startswith("Cuvil"):
            continue
        for version in op.VERSIONS:
            try:
                schema = defs.get_schema(name, max_inclusive_version=version, domain="")
            except defs.SchemaError:
                continue
            for attr in schema.attributes.values():
                if attr.default_value.type != onnx.AttributeProto.UNDEFINED:
                    yield name, version, attr.name, attr.default_value


CASES = list(_cases())


def test_the_check_covers_the_registry():
    assert len({c[0] for c in CASES}) > 60 and len(CASES) > 150


@pytest.mark.parametrize("op_type, version, name, default", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_an_omitted_attribute_reads_as_onnx_default(op_type, version, name, default):
    op = ops.get(op_type)
    value = _attr(default, f"{op_type} default")
    needed = REQUIRED.get(op_type, {})
    omitted = op.attrs(Node("n", op_type, ("x",), ("y",), dict(needed), version))
    written = op.attrs(Node("n", op_type, ("x",), ("y",), {**needed, name: value}, version))
    if (op_type, name) in DIFFERENT:
        assert not _same(omitted, written)
        return
    assert _same(omitted, written), f"{op_type} opset {version}: omitting {name!r} differs from ONNX's {value!r}"


def test_an_op_without_its_required_attribute_is_refused_with_a_typed_error():
    from cuvil_edge.errors import UnsupportedAttributeError

    for op_type, version in (("LRN", 13), ("TopK", 1), ("Upsample", 7)):
        with pytest.raises(UnsupportedAttributeError, match="required attribute"):
            ops.get(op_type).attrs(Node("n", op_type, ("x",), ("y",), {}, version))


def test_a_wrong_default_would_be_caught():
    """The comparison the test makes tells a reading that ignores ONNX's default from one that keeps it."""
    node = Node("n", "LeakyRelu", ("x",), ("y",), {}, 16)
    default = next(a for a in defs.get_schema("LeakyRelu").attributes.values() if a.name == "alpha").default_value
    assert _same(ops.get("LeakyRelu").attrs(node), {"alpha": _attr(default, "alpha")})
    assert not _same({"alpha": 0.02}, {"alpha": _attr(default, "alpha")})
