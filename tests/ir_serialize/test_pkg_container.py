"""IR container: round trip, zero copy, and one named test per malformed payload."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from conftest import build_payload, flip, mlp_graph, mutate_header, split_payload

from cuvil_edge.errors import PackageFormatError, PackageSizeError, PayloadDigestError
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir_serialize import container
from cuvil_edge.ir_serialize.container import ALIGN, _decode_payload, encode_payload


@pytest.fixture
def payload(graph):
    return encode_payload(graph)


# --- round trip -----------------------------------------------------------------
def test_round_trip_same_structure_and_initializers(graph, payload):
    decoded = _decode_payload(payload)
    assert decoded.to_dict() == graph.to_dict()
    for name, array in graph.initializers.items():
        assert decoded.initializers[name].dtype == array.dtype
        np.testing.assert_array_equal(decoded.initializers[name], array)


def test_initializers_are_read_only_views_into_the_buffer(payload):
    whole = np.frombuffer(payload, dtype=np.uint8)
    for array in _decode_payload(payload).initializers.values():
        assert np.shares_memory(array, whole)
        assert not array.flags.writeable


def test_writable_buffer_still_gives_read_only_views(payload):
    buf = bytearray(payload)
    decoded = _decode_payload(buf)
    assert all(not a.flags.writeable for a in decoded.initializers.values())
    assert np.shares_memory(decoded.initializers["w1"], np.frombuffer(buf, dtype=np.uint8))


def test_layout_prelude_alignment_and_table_order(payload):
    magic, version, reserved, header_len = container.PRELUDE.unpack_from(payload, 0)
    header, _ = split_payload(payload)
    data_start = container.align(container.PRELUDE.size + header_len)
    rows = __import__("json").loads(header)["tensors"]
    assert (magic, version, reserved) == (b"CUVLIRC\0", 1, 0)
    assert [r["name"] for r in rows] == sorted(r["name"] for r in rows)
    for r in rows:
        assert (data_start + r["offset"]) % ALIGN == 0
        region = payload[data_start + r["offset"]:data_start + r["offset"] + r["length"]]
        assert hashlib.sha256(region).hexdigest() == r["sha256"]
    assert len(payload) % ALIGN == 0


def test_encoding_is_deterministic(graph):
    assert encode_payload(graph) == encode_payload(mlp_graph())


def test_scalar_empty_and_big_endian_tensors_round_trip():
    inits = {
        "w": np.arange(6, dtype=">f8").reshape(2, 3),  # big-endian input is stored little-endian
        "c": np.zeros((0,), dtype=np.float64),
        "s": np.array(2.5, dtype=np.float64),
    }
    g = build_graph("g", [Value("x", TensorType("float64", (1, 2)))], ["y"],
                    [Node("n", "Gemm", ("x", "w"), ("y",))], inits, 13)
    decoded = _decode_payload(encode_payload(g))
    np.testing.assert_array_equal(decoded.initializers["w"], inits["w"])
    assert decoded.initializers["c"].shape == (0,) and decoded.initializers["s"].shape == ()
    assert decoded.initializers["s"] == 2.5


# --- malformed payloads: one named test per attack --------------------------------
def _second_row(doc):
    return doc["tensors"][1]


def test_bad_magic_rejected(payload):
    with pytest.raises(PackageFormatError, match="magic"):
        _decode_payload(b"NOTCUVL\0" + payload[8:])


def test_unknown_container_version_rejected(payload):
    with pytest.raises(PackageFormatError, match="version 2"):
        _decode_payload(payload[:8] + (2).to_bytes(4, "little") + payload[12:])


def test_header_length_past_buffer_rejected(payload):
    with pytest.raises(PackageSizeError, match="only"):
        _decode_payload(payload[:16] + (len(payload)).to_bytes(8, "little") + payload[24:])


def test_header_length_over_cap_rejected(payload):
    with pytest.raises(PackageSizeError, match="cap"):
        _decode_payload(payload[:16] + (2**64 - 1).to_bytes(8, "little") + payload[24:])


def test_truncated_payload_rejected(payload):
    with pytest.raises(PackageSizeError):
        _decode_payload(payload[:-70])


def test_trailing_bytes_after_last_region_rejected(payload):
    with pytest.raises(PackageFormatError, match="trailing"):
        _decode_payload(payload + bytes(64))


def test_trailing_garbage_in_header_json_rejected(payload):
    header, data = split_payload(payload)
    with pytest.raises(PackageFormatError, match="not valid JSON"):
        _decode_payload(build_payload(header + b"xx", data))


def test_duplicate_json_keys_in_header_rejected(payload):
    header, data = split_payload(payload)
    dup = header.replace(b'{"format":1,', b'{"format":1,"format":1,', 1)
    with pytest.raises(PackageFormatError, match="twice"):
        _decode_payload(build_payload(dup, data))


def test_nan_in_header_rejected(payload):
    header, data = split_payload(payload)
    with pytest.raises(PackageFormatError, match="NaN"):
        _decode_payload(build_payload(header.replace(b'"alpha":1.0', b'"alpha":NaN'), data))


def test_non_canonical_header_rejected(payload):
    header, data = split_payload(payload)
    with pytest.raises(PackageFormatError, match="canonical"):
        _decode_payload(build_payload(b" " + header, data))


def test_unknown_header_field_rejected(payload):
    with pytest.raises(PackageFormatError, match="unknown field"):
        _decode_payload(mutate_header(payload, lambda d: d.update(extra=1)))


def test_unknown_tensor_field_rejected(payload):
    with pytest.raises(PackageFormatError, match="unknown field"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(align=64)))


def test_missing_tensor_field_rejected(payload):
    with pytest.raises(PackageFormatError, match="lacks"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).pop("sha256")))


def test_misaligned_tensor_offset_rejected(payload):
    with pytest.raises(PackageFormatError, match="not a multiple of 64"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(offset=_second_row(d)["offset"] + 8)))


def test_overlapping_regions_rejected(payload):
    with pytest.raises(PackageFormatError, match="overlaps"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(offset=0)))


def test_gap_between_regions_rejected(payload):
    with pytest.raises(PackageFormatError, match="gap"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(offset=_second_row(d)["offset"] + 64)))


def test_shape_length_mismatch_rejected(payload):
    with pytest.raises(PackageFormatError, match="needs"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(shape=[4, 4])))


def test_huge_shape_rejected_without_overflow(payload):
    with pytest.raises(PackageFormatError):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(shape=[2**31 - 1] * 8)))


def test_negative_dim_rejected(payload):
    with pytest.raises(PackageFormatError, match="outside"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(shape=[-3, -4])))


def test_unknown_dtype_rejected(payload):
    with pytest.raises(PackageFormatError, match="dtype"):
        _decode_payload(mutate_header(payload, lambda d: _second_row(d).update(dtype="object")))


def test_tensor_byte_flip_rejected_by_region_digest(payload):
    with pytest.raises(PayloadDigestError, match="sha256"):
        _decode_payload(flip(payload, len(payload) - ALIGN))


def test_nonzero_padding_rejected(payload):
    header, data = split_payload(payload)
    start = container.PRELUDE.size + len(header)
    # the fixture's header must leave padding to flip, or this test would prove nothing
    assert container.align(start) != start, "the header ends aligned: give the fixture graph another name length"
    with pytest.raises(PackageFormatError, match="padding"):
        _decode_payload(flip(payload, start))


def test_graph_declaring_wrong_output_type_rejected(payload):
    def lie(doc):
        doc["graph"]["outputs"][0]["dtype"] = "float64"
    with pytest.raises(PackageFormatError, match="differs"):
        _decode_payload(mutate_header(payload, lie))


def test_graph_with_unknown_op_rejected(payload):
    def unknown(doc):
        doc["graph"]["nodes"][1]["op"] = "Exec"
    with pytest.raises(PackageFormatError, match="IR checks"):
        _decode_payload(mutate_header(payload, unknown))


def test_initializer_list_disagreeing_with_table_rejected(payload):
    with pytest.raises(PackageFormatError, match="initializers"):
        _decode_payload(mutate_header(payload, lambda d: d["graph"]["initializers"].pop()))


def test_nested_attribute_rejected(payload):
    def nested(doc):
        doc["graph"]["nodes"][0]["attrs"]["alpha"] = [[1.0]]
    with pytest.raises(PackageFormatError, match="flat list"):
        _decode_payload(mutate_header(payload, nested))


def test_invalid_bool_tensor_bytes_rejected():
    g = build_graph("g", [Value("x", TensorType("float32", (1, 2)))], ["y"],
                    [Node("n", "Relu", ("x",), ("y",))], {"mask": np.array([True, False])}, 13)
    payload = encode_payload(g)
    header, data = split_payload(payload)
    bad = bytearray(data)
    bad[0] = 7
    doc = __import__("json").loads(header)
    doc["tensors"][0]["sha256"] = hashlib.sha256(bytes(bad[:2])).hexdigest()
    new_header = __import__("json").dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(PackageFormatError, match="bool"):
        _decode_payload(build_payload(new_header, bytes(bad)))


def test_duplicate_tensor_name_rejected(payload):
    def dup(doc):
        doc["tensors"][1]["name"] = doc["tensors"][0]["name"]
    with pytest.raises(PackageFormatError, match="without duplicates"):
        _decode_payload(mutate_header(payload, dup))


def test_unsorted_tensor_table_rejected(payload):
    def swap(doc):
        t = doc["tensors"]
        t[0]["name"], t[1]["name"] = t[1]["name"], t[0]["name"]
    with pytest.raises(PackageFormatError, match="sorted"):
        _decode_payload(mutate_header(payload, swap))
