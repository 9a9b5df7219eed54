"""QDQ-wrapped products become QLinearConv / QLinearMatMul at load on targets with int8 kernels, and
compute what onnxruntime computes for the same QDQ model (its quantizer's output), within one step."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, save
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from cuvil_edge.device_targets import build, load_target
from cuvil_edge.device_targets.cost_int8 import INT8_FACTORS, INT8_KIND
from cuvil_edge.device_targets.cost_model import predict
from cuvil_edge.frontend import load_model
from cuvil_edge.passes import optimize
from cuvil_edge.passes.quantize import calibrate_ranges, dequantize_at_load, quantize_int8

SHAPE = (1, 3, 16, 16)


class _Payload:
    def __init__(self, graph):
        self.graph, self.payload_digest = graph, "cd" * 32


def _float_model(path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, s).astype(np.float32), n) for n, s in
             (("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (16, 8, 3, 3)), ("b2", (16,)), ("w3", (12, 16, 1, 1)),
              ("w4", (12, 16, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], strides=[2, 2], pads=[1, 0, 1, 0]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["y3"]),
             helper.make_node("Conv", ["r2", "w4"], ["y4"]),
             helper.make_node("Add", ["y3", "y4"], ["y"])]  # a residual-like sum of two products
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 12, 8, 7))], inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


class _Reader(CalibrationDataReader):
    def __init__(self):
        self.batches = iter([{"x": np.random.default_rng(s).normal(size=SHAPE).astype(np.float32)} for s in range(8)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def ort_qdq(tmp_path_factory):
    """onnxruntime's static QDQ quantization (per channel) of a small conv net: its path. reduce_range
    gives 7-bit weights, which onnxruntime's own AVX2 kernel computes without int16 saturation, so its
    result is an exact oracle."""
    folder = tmp_path_factory.mktemp("qdq")
    _float_model(folder / "f.onnx")
    quantize_static(str(folder / "f.onnx"), str(folder / "q.onnx"), _Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return folder / "q.onnx"


def _ort_run(path, x):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_onnxruntime_qdq_convs_become_qlinearconv_and_match_it(ort_qdq, tmp_path):
    """Convs as QLinearConv, the DequantizeLinear-Add-QuantizeLinear as CuvilQLinearAdd, the MaxPool on int8."""
    graph = load_model(str(ort_qdq))
    fused = dequantize_at_load(graph, int8=True)
    ops = Counter(n.op_type for n in fused.nodes)
    assert ops["QLinearConv"] == 4 and ops["CuvilQLinearAdd"] == 1 and "Conv" not in ops and "Add" not in ops
    pool = next(n for n in fused.nodes if n.op_type == "MaxPool")
    assert fused.types[pool.inputs[0]].dtype == "uint8"  # pools the int8 values: no float tensor around it
    assert all(fused.initializers[n.inputs[3]].dtype == np.int8 for n in fused.nodes if n.op_type == "QLinearConv")
    step = float(next(graph.initializers[n.inputs[1]] for n in graph.nodes
                      if n.op_type == "DequantizeLinear" and n.outputs[0] == "y"))
    model = build(_Payload(fused), "x86-64", cache_dir=tmp_path)
    for seed in range(3):
        x = np.random.default_rng(100 + seed).normal(size=SHAPE).astype(np.float32)
        got, want = next(iter(model.run({"x": x}).values())), _ort_run(ort_qdq, x)
        assert got.shape == want.shape and np.abs(got - want).max() <= step * 1.001


def test_our_int8_package_computes_in_int8_within_one_step(tmp_path):
    path = tmp_path / "f.onnx"
    _float_model(path)
    graph, _ = optimize(load_model(str(path)))
    samples = [{"x": np.random.default_rng(s).normal(size=SHAPE).astype(np.float32)} for s in range(4)]
    package = quantize_int8(graph, calibrate_ranges(graph, samples), samples=samples)
    fused, widened = dequantize_at_load(package, int8=True), dequantize_at_load(package)
    # our quantizer quantizes the inputs of products only: the conv before the (float) MaxPool and the
    # last two, whose outputs are float, stay float convs; the one between them is fused
    assert Counter(n.op_type for n in fused.nodes)["QLinearConv"] == 1
    model_i8, model_f = build(_Payload(fused), "x86-64", cache_dir=tmp_path), build(_Payload(widened), "x86-64",
                                                                                   cache_dir=tmp_path)
    # the step of the last conv's int8 input: one step there moves y by at most |w3| summed over inputs
    scale = next(float(package.initializers[n.inputs[1]]) for n in package.nodes
                 if n.op_type == "QuantizeLinear" and n.outputs[0].startswith("r2"))
    bound = scale * float((np.abs(graph.initializers["w3"]) + np.abs(graph.initializers["w4"])).sum(axis=(1, 2, 3)).max())
    x = np.random.default_rng(9).normal(size=SHAPE).astype(np.float32)
    got, want = next(iter(model_i8.run({"x": x}).values())), next(iter(model_f.run({"x": x}).values()))
    assert np.abs(got - want).max() <= bound


def test_targets_without_an_int8_dot_keep_widening(ort_qdq):
    assert load_target("x86-64").int8_kernels and load_target("jetson-orin-nano").int8_kernels
    assert not load_target("rpi4").int8_kernels  # Cortex-A72: no sdot, float is faster
    assert not load_target("ascend-310").int8_kernels  # no native kernels
    assert load_target("ascend-310").capabilities()["TARGET_INT8_DOT"] == "none"
    graph = load_model(str(ort_qdq))
    assert dequantize_at_load(graph, int8=False).nodes == dequantize_at_load(graph).nodes
    assert "QLinearConv" not in {n.op_type for n in dequantize_at_load(graph).nodes}


def test_the_pruner_keeps_the_int8_branch_only_with_native_kernels(ort_qdq, tmp_path):
    fused = dequantize_at_load(load_model(str(ort_qdq)), int8=True)
    with_native = build(_Payload(fused), "x86-64", cache_dir=tmp_path).source
    without = build(_Payload(fused), "ascend-310", cache_dir=tmp_path, precision="fp32").source
    assert "_i8_ops()" in with_native and "_i8_ops()" not in without
    x = np.random.default_rng(1).normal(size=SHAPE).astype(np.float32)
    a = next(iter(build(_Payload(fused), "x86-64", cache_dir=tmp_path).run({"x": x}).values()))
    b = next(iter(build(_Payload(fused), "ascend-310", cache_dir=tmp_path).run({"x": x}).values()))
    assert np.array_equal(a, b)  # the numpy path computes the same integers


def test_the_cost_model_costs_int8_nodes_at_the_int8_rate(ort_qdq):
    graph = load_model(str(ort_qdq))
    fused = dequantize_at_load(graph, int8=True)
    spec = load_target("x86-64")
    rows = [r for r in predict(fused, spec).nodes if r.op_type == "QLinearConv"]
    assert len(rows) == 4 and all(r.kernel == INT8_KIND and r.gemm for r in rows)
    for r in rows:  # one image's GEMM: out channels x (C x taps) x pixels, at vpdpbusd's rate
        m, k, n, count = r.gemm[0]
        assert r.compute_s == pytest.approx(2 * m * k * n * count / (spec.native_gflops * INT8_FACTORS["vnni"] * 1e9))
    avx2 = [r for r in predict(fused, spec.model_copy(update={"int8_dot": "avx2"})).nodes if r.op_type == "QLinearConv"]
    assert sum(r.compute_s for r in avx2) == pytest.approx(2 * sum(r.compute_s for r in rows))
    slow = predict(fused, "ascend-310")  # no native kernels: numpy's int32 products, not the int8 kernel
    assert all(r.kernel != INT8_KIND for r in slow.nodes)


@pytest.mark.parametrize("dtypes", [(np.uint8, np.uint8, np.uint8), (np.int8, np.uint8, np.int8),
                                    (np.uint8, np.int8, np.uint8)])
def test_the_fused_add_is_exactly_the_three_ops_it_replaces(dtypes, monkeypatch):
    from cuvil_edge.ir.ops import binary, qlinear_add, quant

    rng = np.random.default_rng(2)
    a, b = (rng.integers(np.iinfo(d).min, np.iinfo(d).max + 1, (2, 16, 9, 9)).astype(d) for d in dtypes[:2])
    params = (np.array(0.0371, np.float32), np.array(3, dtypes[0]), np.array(0.0213, np.float32),
              np.array(-5 if dtypes[1] == np.int8 else 130, dtypes[1]), np.array(0.05123, np.float32),
              np.array(11, dtypes[2]))
    as_, az, bs, bz, ys, yz = params
    want = quant.k_quantize_linear(binary.k_add(quant.k_dequantize_linear(a, as_, az), quant.k_dequantize_linear(b, bs, bz)),
                                   ys, yz)
    for capability in ("avx2", "none"):  # the native pass and the numpy fallback
        monkeypatch.setattr(qlinear_add, "TARGET_INT8_DOT", capability)
        got = qlinear_add.k_q_linear_add(a, as_, az, b, bs, bz, ys, yz)
        assert got.dtype == want.dtype and np.array_equal(got, want), capability
