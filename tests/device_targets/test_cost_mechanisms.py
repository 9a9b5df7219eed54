"""Cost-model mechanisms found by per-node measurement: a batched np.matmul's further
products, the native Softmax's scalar row remainder, and the calibration's run and per-kind overheads
timed in interleaved rounds. Correctness only (no timing): timing is bench/bench_cost_model.py's."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from cuvil_edge.device_targets import load_target
from cuvil_edge.device_targets.cost_kernels import gemm_ns, gemm_products_ns, softmax_tail_ns
from cuvil_edge.device_targets.cost_model import predict
from cuvil_edge.frontend import load_model

TERMS = {"gemm_flop": 0.01, "gemm_mk": 0.2, "gemm_kn": 0.2, "gemm_mn": 0.2, "gemm_call": 1000.0}


def graph_of(nodes, inputs, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(inits))
    model = shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return load_model(model.SerializeToString())


def spec_with(**terms):
    return load_target("x86-64").model_copy(update={"kernel_ns": {**TERMS, **terms}})


# ---------------------------------------------------------------- batched products


def test_products_of_one_batched_call_pay_the_call_once():
    one = gemm_ns(TERMS, 12, 8, 12)
    assert gemm_products_ns(TERMS, 12, 8, 12, 64, 64) == pytest.approx(64 * one)  # one call each
    assert gemm_products_ns(TERMS, 12, 8, 12, 64, 0) == pytest.approx(64 * one)  # 0: one call each
    batched = gemm_products_ns({**TERMS, "gemm_batch_call": 30.0}, 12, 8, 12, 64, 1)
    assert batched == pytest.approx(one + 63 * (one - 1000.0 + 30.0))
    # without a measured per-product term, a batched product costs a full call (the earlier model)
    assert gemm_products_ns(TERMS, 12, 8, 12, 64, 1) == pytest.approx(64 * one)
    assert gemm_products_ns({"gemm_flop": 1.0}, 1, 1, 1, 4, 1) is None


def test_batched_matmul_and_batch_broadcast_convolutions_use_the_batched_product_cost():
    attention = graph_of([helper.make_node("MatMul", ["a", "b"], ["y"], name="n")],
                         [("a", [4, 8, 12, 16]), ("b", [4, 8, 16, 12])])
    plain, batched = (predict(attention, spec_with(**t)).nodes[0] for t in ({}, {"gemm_batch_call": 30.0}))
    assert plain.kernel == "gemm batched" and plain.gemm == ((12, 16, 12, 32),)
    assert plain.compute_s - batched.compute_s == pytest.approx(31 * (1000.0 - 30.0) * 1e-9)
    # a 1x1 convolution over a batch is one np.matmul broadcasting the weight over the images
    w = numpy_helper.from_array(np.full((16, 8, 1, 1), 0.1, np.float32), "w")
    conv = graph_of([helper.make_node("Conv", ["x", "w"], ["y"], name="n")], [("x", [5, 8, 8, 8])], [w])
    numpy_only = {"native_kernels": False}  # the numpy convolution paths
    plain, batched = (predict(conv, spec_with(**t).model_copy(update=numpy_only)).nodes[0]
                      for t in ({}, {"gemm_batch_call": 30.0}))
    assert plain.kernel == "conv 1x1 gemm" and plain.gemm[0][3] == 5
    assert plain.compute_s - batched.compute_s == pytest.approx(4 * 970.0 * 1e-9)
    # im2col in row blocks: one np.matmul per block, each pays the whole call
    w3 = numpy_helper.from_array(np.full((64, 64, 3, 3), 0.1, np.float32), "w")
    blocks = graph_of([helper.make_node("Conv", ["x", "w"], ["y"], name="n", pads=[1, 1, 1, 1])],
                      [("x", [1, 64, 112, 112])], [w3])
    plain, batched = (predict(blocks, spec_with(**t).model_copy(update=numpy_only)).nodes[0]
                      for t in ({}, {"gemm_batch_call": 30.0}))
    assert plain.kernel == "conv im2col blocks" and plain.gemm[0][3] > 1
    assert plain.compute_s == batched.compute_s


# ---------------------------------------------------------------- the native Softmax's row remainder


def softmax(shape):
    return graph_of([helper.make_node("Softmax", ["x"], ["y"], name="n", axis=-1)], [("x", shape)])


def test_softmax_rows_off_the_simd_width_pay_the_scalar_remainder():
    tail = {"softmax_tail_row": 40.0, "softmax_tail_element": 4.0}
    assert softmax_tail_ns(tail, 48, 12, 16) == pytest.approx(48 * (40 + 12 * 4))
    assert softmax_tail_ns(tail, 48, 17, 16) == pytest.approx(48 * (40 + 4))
    assert softmax_tail_ns(tail, 48, 32, 16) == 0.0  # a multiple of the SIMD width: no scalar loop
    assert softmax_tail_ns(tail, 48, 12, 8) == pytest.approx(48 * (40 + 4 * 4))
    assert softmax_tail_ns({}, 48, 12, 16) == 0.0  # not measured: nothing added

    def node(shape, simd_bits=512, **terms):
        spec = spec_with(**terms).model_copy(update={"simd_bits": simd_bits})
        return predict(softmax(shape), spec).nodes[0]

    assert node([1, 4, 12, 12]).kernel == "native"
    extra = node([1, 4, 12, 12], **tail).compute_s - node([1, 4, 12, 12]).compute_s
    assert extra == pytest.approx(48 * (40 + 12 * 4) * 1e-9)
    assert node([1, 4, 12, 16], **tail).compute_s == node([1, 4, 12, 16]).compute_s
    narrow = node([1, 4, 12, 12], simd_bits=256, **tail).compute_s - node([1, 4, 12, 12], simd_bits=256).compute_s
    assert narrow == pytest.approx(48 * (40 + 4 * 4) * 1e-9)


# ---------------------------------------------------------------- calibration's interleaved rounds


class FakeClock:
    """Stands in for calibrate._time_per_call: runs each probe once, returns the next scripted time."""

    def __init__(self, times):
        self.times, self.calls = list(times), 0

    def __call__(self, fn, budget):
        fn()
        self.calls += 1
        return self.times.pop(0)


def test_run_overhead_is_at_least_what_run_adds_around_forward(monkeypatch):
    from cuvil_edge.device_targets import calibrate

    spec = load_target("x86-64").model_copy(update={"native_kernels": False})
    # three interleaved rounds of (6 nodes, 66 nodes, the generated _forward of 6 nodes); the second
    # round is disturbed, the fastest of each is kept
    us = 1e-6
    clock = FakeClock([12 * us, 140 * us, 9 * us, 30 * us, 300 * us, 20 * us, 10 * us, 130 * us, 7 * us])
    monkeypatch.setattr(calibrate, "_time_per_call", clock)
    call, run, native, plane = calibrate._module_costs(spec, 0.01)
    assert clock.calls == 9 and native is None and plane is None
    assert call == pytest.approx((130 - 10) / 60)  # 2 µs a node: 10 - 6 x 2 < 0 would say no run overhead
    assert run == pytest.approx(10 - 7)  # run()'s checks and outputs around _forward


def test_kind_overheads_keep_the_fastest_of_interleaved_rounds(monkeypatch):
    from cuvil_edge.device_targets import calibrate

    spec = load_target("x86-64")
    first = FakeClock([1.0] * 64)
    monkeypatch.setattr(calibrate, "_time_per_call", first)
    count = len(calibrate._kind_overheads(spec, 0.01, rounds=1))
    # round 1 slow (1 s), round 2 fast (8 µs per module of 8 calls), round 3 slow again
    clock = FakeClock([1.0] * count + [8e-6] * count + [1.0] * count)
    monkeypatch.setattr(calibrate, "_time_per_call", clock)
    out = calibrate._kind_overheads(spec, 0.01, rounds=3)
    assert clock.calls == 3 * count and len(out) == count
    assert all(v < 1.0 for v in out.values())  # (8 µs - run) / 8 calls, less the work: never the slow rounds


# ---------------------------------------------------------------- one-row products, pooling kernels


def test_a_one_row_product_is_costed_as_sgemv():
    gemv = {"gemv_element": 0.15, "gemv_call": 500.0}
    assert gemm_ns({**TERMS, **gemv}, 1, 1568, 128) == pytest.approx(500 + 0.15 * 1568 * 128)
    assert gemm_ns({**TERMS, **gemv}, 64, 256, 1) == pytest.approx(500 + 0.15 * 64 * 256)  # matrix @ vector
    assert gemm_ns({**TERMS, **gemv}, 2, 1568, 128) == gemm_ns(TERMS, 2, 1568, 128)  # two rows: sgemm
    assert gemm_ns(TERMS, 1, 1568, 128) == pytest.approx(0.01 * 2 * 1568 * 128 + 0.2 * (1568 + 1568 * 128 + 128)
                                                         + 1000)  # not measured: the sgemm terms
    w = numpy_helper.from_array(np.full((128, 1568), 0.1, np.float32), "w")
    fc = graph_of([helper.make_node("Gemm", ["x", "w"], ["y"], name="n", transB=1)], [("x", ["N", 1568])], [w])
    one, many = (predict(fc, spec_with(**gemv), batch=b).nodes[0] for b in (1, 16))
    assert one.compute_s == pytest.approx((500 + 0.15 * 1568 * 128) * 1e-9)
    assert many.compute_s == pytest.approx(gemm_ns(TERMS, 16, 1568, 128) * 1e-9)


def test_native_max_pooling_uses_its_own_terms_when_measured():
    pool = graph_of([helper.make_node("MaxPool", ["x"], ["y"], name="n", kernel_shape=[2, 2], strides=[2, 2])],
                    [("x", [1, 16, 28, 28])])
    depthwise = {"dw_plane": 300.0, "dw_pad": 0.5, "dw_tap": 0.05, "dw_strided_tap": 0.4}
    own = {"mp_plane": 50.0, "mp_pad": 0.2, "mp_tap": 0.3}
    before, after = (predict(pool, spec_with(**t)).nodes[0] for t in (depthwise, {**depthwise, **own}))
    assert before.kernel == after.kernel == "native"
    assert before.compute_s == pytest.approx(16 * (300 + 0.5 * 28 * 28 + 0.4 * 4 * 14 * 14) * 1e-9)
    assert after.compute_s == pytest.approx(16 * (50 + 0.2 * 28 * 28 + 0.3 * 4 * 14 * 14) * 1e-9)


def window_node(op, spec, **attrs):
    graph = graph_of([helper.make_node(op, ["x"], ["y"], name="n", **attrs)], [("x", [1, 16, 8, 8])])
    return predict(graph, spec).nodes[0]


def test_numpy_window_loops_pay_per_tap_padding_and_averagepools_counts():
    from cuvil_edge.device_targets.cost_model import NUMPY_PAD, WINDOW_TAP

    base = load_target("x86-64").model_copy(update={"native_kernels": False})  # MaxPool's numpy taps
    spec = base.model_copy(update={"kernel_overhead_us": {"numpy window taps": 4.0, WINDOW_TAP: 3.0, NUMPY_PAD: 30.0},
                                   "numpy_call_us": 0.5})
    two = window_node("MaxPool", spec, kernel_shape=[2, 2], strides=[2, 2])
    three = window_node("MaxPool", spec, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    assert two.kernel == three.kernel == "numpy window taps"
    assert two.overhead_s == pytest.approx((4.0 + 4 * 3.0) * 1e-6)
    assert three.overhead_s == pytest.approx((4.0 + 9 * 3.0 + 2 * 0.5) * 1e-6)  # np.full and the assignment
    # without a measured per-tap cost, each tap is one numpy call (the earlier model)
    plain = base.model_copy(update={"kernel_overhead_us": {"numpy window taps": 4.0}, "numpy_call_us": 0.5})
    assert window_node("MaxPool", plain, kernel_shape=[2, 2], strides=[2, 2]).overhead_s == pytest.approx(6e-6)
    # AveragePool: two tap loops (values, window counts), 4 small arrays and the division; np.pad with
    # count_include_pad, even when nothing is padded
    mean = window_node("AveragePool", spec, kernel_shape=[2, 2], strides=[2, 2])
    counted = window_node("AveragePool", spec, kernel_shape=[2, 2], strides=[2, 2], count_include_pad=1)
    assert mean.overhead_s == pytest.approx((4.0 + 8 * 3.0 + 4 * 0.5) * 1e-6)
    assert counted.overhead_s - mean.overhead_s == pytest.approx(30.0e-6)


def test_calibration_measures_the_window_tap_and_np_pad_costs(monkeypatch):
    from cuvil_edge.device_targets import calibrate

    spec = load_target("x86-64")
    clock = FakeClock([48e-6, 28e-6, 40e-6, 30e-6, 44e-6, 29e-6])  # (3x3, 2x2) chains of 8, three rounds
    monkeypatch.setattr(calibrate, "_time_per_call", clock)
    assert calibrate._window_tap_us(spec, 0.01) == pytest.approx((40 - 28) / 5 / 8)
    assert clock.calls == 6


def test_native_layer_norm_is_its_own_kernel_kind_with_a_calibrated_call_cost():
    from cuvil_edge.device_targets import calibrate_probes
    from cuvil_edge.device_targets.cost_model import KIND_FACTORS

    scale = numpy_helper.from_array(np.ones(64, np.float32), "s")
    ln = graph_of([helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="n", axis=-1)],
                  [("x", [1, 16, 64])], [scale])
    base = load_target("x86-64")
    node = predict(ln, base).nodes[0]
    assert node.kernel == "native layer norm" and KIND_FACTORS["native layer norm"] > KIND_FACTORS["native"]
    bumped = predict(ln, base.model_copy(update={"kernel_overhead_us": {"native layer norm": 50.0}})).nodes[0]
    assert bumped.overhead_s == pytest.approx(50e-6)
    # calibrate probes it apart from the other native kernels (Softmax: two arrays passed, not four)
    kinds = {
        predict(calibrate_probes.chain(op, probe, 2), base).nodes[0].kernel for op, probe in calibrate_probes.kind_probes()
    }
    assert {"native", "native layer norm"} <= kinds
