"""docs/OPS.md is the op registry rendered (ir.op_catalog), and an unsupported op's error names the
op, what is known of it, and points there instead of listing every op."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuvil_edge.errors import UnsupportedOpError
from cuvil_edge.ir import op_catalog, ops

OPS_MD = Path(__file__).resolve().parents[2] / "docs" / "OPS.md"


def _doc_rows() -> dict[str, list[str]]:
    """op -> its cells, from every table of docs/OPS.md."""
    rows = [line.split("|")[1:-1] for line in OPS_MD.read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and not line.startswith("| op |")]
    return {cells[0].strip(): [c.strip() for c in cells] for cells in rows}


def test_ops_md_is_the_registry_rendered():
    # prepare
    expected = op_catalog.markdown()
    # act
    text = OPS_MD.read_text(encoding="utf-8") if OPS_MD.exists() else ""
    # assert
    assert text == expected, f"docs/OPS.md differs from the op registry: run `{op_catalog.REGENERATE}`"


def test_ops_md_has_one_row_per_supported_op_with_its_versions():
    rows = _doc_rows()
    assert sorted(rows) == ops.supported_ops()
    for name, cells in rows.items():
        op = ops.get(name)
        assert cells[2] == f"≥ {min(op.VERSIONS)}" and cells[3] == ", ".join(map(str, op.VERSIONS)), name
        assert cells[1] == ("internal" if name.startswith("Cuvil") else "ai.onnx"), name


def test_each_row_names_the_module_that_defines_the_op():
    # prepare
    from cuvil_edge.ir.ops import conv, movement
    # act
    conv_row, reshape = op_catalog.entry("Conv"), op_catalog.entry("Reshape")
    # assert
    assert conv_row.module == "conv" and any(o.OP_TYPE == "Conv" for o in conv.OPS)
    assert reshape.module == "movement" and any(o.OP_TYPE == "Reshape" for o in movement.OPS)
    assert "second input" in reshape.notes  # its shape input: CONST_INPUTS (1,)


# (id, op, opset, domain, fragments the message must hold)
MESSAGES = [
    ("unknown", "FancyOp", 13, "", ["'FancyOp'", "no op of that name", "opset 13"]),
    ("misspelt", "GeLU", 20, "", ["'GeLU'", "did you mean 'Gelu'"]),
    ("abbreviated", "LayerNorm", 17, "", ["did you mean 'LayerNormalization'"]),
    ("too-old-opset", "HardSwish", 13, "", ["'HardSwish'", "needs opset 14 or later", "14, 22", "opset 13",
                                            "onnx.version_converter", "cuvil-edge ops HardSwish"]),
    ("custom-domain-known-name", "Gelu", 20, "com.microsoft", ["'Gelu'", "'com.microsoft'", "ai.onnx has 'Gelu' "
                                                                "from opset 20"]),
    ("custom-domain-unknown-name", "MatMulNBits", 17, "com.microsoft", ["'MatMulNBits'", "'com.microsoft'",
                                                                         "only the default ONNX domain"]),
]


@pytest.mark.parametrize("id,op,opset,domain,fragments", MESSAGES, ids=[m[0] for m in MESSAGES])
def test_an_unsupported_op_error_names_the_op_and_points_to_the_op_list(id, op, opset, domain, fragments):
    # act
    with pytest.raises(UnsupportedOpError) as info:
        ops.get(op, "node 'n'", opset, domain)
    # assert
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert "node 'n'" in message and "docs/OPS.md" in message and "cuvil-edge ops" in message
    assert len(message) < 300, message  # not the list of every op
    assert "Xor" not in message


def test_a_known_op_at_a_supported_opset_is_returned():
    assert ops.get("HardSwish", opset=14, domain="ai.onnx").OP_TYPE == "HardSwish"


@pytest.mark.parametrize("asked, close", [("GeLU", ["Gelu"]), ("relu", ["Relu"]), ("Softmaxx", ["Softmax"]),
                                          ("Convolution", ["Conv"]), ("FancyOp", [])])
def test_close_names(asked, close):
    assert ops.similar(asked)[:len(close) or None] == close
