"""int8 weight rounding options: with weights="gptq" GPTQ's Hessians come from the
inputs the already-quantized prefix gives each layer, and bias correction shifts the float32 biases
so the quantized layers' outputs are unbiased on the calibration samples (and lower-biased off them);
the default stays GPTQ on the float32 graph's Hessians without bias correction."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_edge.errors import PassError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir import interpreter
from cuvil_edge.passes import optimize, quantize_weights
from cuvil_edge.passes.quantize import _activations, calibrate_ranges, quantize_int8

from pass_helpers import graph_from_text


def _mlp():
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((24, 16), dtype=np.float32) / 4
    w2 = rng.standard_normal((6, 24), dtype=np.float32) / 4
    return graph_from_text("""g (float[batch, 16] x) => (float[batch, 6] y) {
            h = Gemm <transB = 1> (x, w1, b1)
            r = Relu(h)
            y = Gemm <transB = 1> (r, w2, b2)
        }""", w1=w1, b1=np.full(24, 0.1, np.float32), w2=w2, b2=np.zeros(6, np.float32))


def _inputs(n, seed, batch=16):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, 16), dtype=np.float32) + 0.5 for _ in range(n)]


def _out(graph, x):
    return next(iter(interpreter.run(graph, {graph.inputs[0].name: x}).values()))


def test_gptq_hessians_come_from_the_quantized_prefix(monkeypatch):
    """The second layer's XᵀX is that of its input in the int8 graph (the first layer's int8 output,
    quantized), not the float32 one; weights="gptq_fp32" keeps the float32 graph's."""
    graph, samples = _mlp(), _inputs(4, seed=1)
    ranges = calibrate_ranges(graph, samples)
    seen: list[np.ndarray] = []
    real = quantize_weights.gptq
    monkeypatch.setattr(quantize_weights, "gptq", lambda m, h, s, *a, **k: seen.append(h) or real(m, h, s, *a, **k))
    q = quantize_int8(graph, ranges, samples=samples, weights="gptq", bias_correction=False)
    second = next(n for n in q.nodes if n.name == graph.nodes[2].name)
    rows = [_activations(q, {"x": x}, {second.inputs[0]})[second.inputs[0]] for x in samples]
    assert len(seen) == 2
    np.testing.assert_allclose(seen[1], sum(r.T.astype(np.float64) @ r for r in rows), rtol=1e-5)
    fp = [np.maximum(x @ graph.initializers["w1"].T + graph.initializers["b1"], 0) for x in samples]
    want_fp32 = sum(r.T.astype(np.float64) @ r for r in fp)
    assert not np.allclose(seen[1], want_fp32, rtol=1e-3)
    seen.clear()
    quantize_int8(graph, ranges, samples=samples, weights="gptq_fp32", bias_correction=False)
    np.testing.assert_allclose(seen[1], want_fp32, rtol=1e-4)


def test_bias_correction_zeroes_the_mean_output_error_on_the_samples(monkeypatch):
    """On the calibration samples the int8 output's mean error per output is ~0 after bias correction
    (the last layer's shift is exactly that mean), and the structure is the same as without it; with
    the shrinkage (SHRINK) the shifts are smaller but still remove most of that mean error."""
    graph, samples = _mlp(), _inputs(4, seed=1)
    monkeypatch.setattr(quantize_weights, "SHRINK", True)
    ranges = calibrate_ranges(graph, samples, method="minmax")
    x = np.concatenate(samples)
    want = _out(graph, x)
    plain = quantize_int8(graph, ranges, samples=samples, weights="rtn", bias_correction=False)
    corrected = quantize_int8(graph, ranges, samples=samples, weights="rtn", bias_correction=True)
    assert [n.op_type for n in plain.nodes] == [n.op_type for n in corrected.nodes]
    assert set(plain.initializers) == set(corrected.initializers)
    bias_plain = np.abs((_out(plain, x) - want).mean(0)).max()
    bias_corrected = np.abs((_out(corrected, x) - want).mean(0)).max()
    assert bias_corrected < 0.25 * bias_plain, (bias_corrected, bias_plain)
    assert not np.array_equal(plain.initializers["b1"], corrected.initializers["b1"])
    monkeypatch.setattr(quantize_weights, "SHRINK", False)
    exact = quantize_int8(graph, ranges, samples=samples, weights="rtn", bias_correction=True)
    assert np.abs((_out(exact, x) - want).mean(0)).max() < 1e-5 < bias_corrected


def test_bias_correction_lowers_the_mean_output_error_of_a_conv_net_on_held_out_inputs():
    """The digits CNN (Conv + Relu fused, then Gemm) with coarse int8 weights: the mean over held-out
    inputs of int8 - fp32 output falls with bias correction, and so does the mean absolute error."""
    graph = optimize(load_model(digits_cnn_onnx(0)))[0]
    rng = np.random.default_rng(0)
    samples = [rng.random((16, 1, 8, 8), dtype=np.float32) for _ in range(4)]
    held_out = rng.random((256, 1, 8, 8), dtype=np.float32)
    ranges = calibrate_ranges(graph, samples, method="minmax")
    want = _out(graph, held_out)
    errors = {}
    for bc in (False, True):
        q = quantize_int8(graph, ranges, samples=samples, weights="rtn", bias_correction=bc)
        diff = _out(q, held_out) - want
        errors[bc] = (float(np.abs(diff.mean(0)).mean()), float(np.abs(diff).mean()))
    assert errors[True][0] < 0.5 * errors[False][0], errors
    assert errors[True][1] < errors[False][1], errors


def test_default_is_gptq_on_float32_hessians_without_bias_correction_and_options_need_samples():
    """The default with samples stays GPTQ on the float32 graph's Hessians, no bias correction (the
    sequential Hessians and bias correction were not better on ResNet-18); both need the samples."""
    graph, samples = _mlp(), _inputs(2, seed=1)
    ranges = calibrate_ranges(graph, samples)
    default = quantize_int8(graph, ranges, samples=samples)
    explicit = quantize_int8(graph, ranges, samples=samples, weights="gptq_fp32", bias_correction=False)
    for name, array in default.initializers.items():
        np.testing.assert_array_equal(array, explicit.initializers[name])
    np.testing.assert_array_equal(default.initializers["b1"], graph.initializers["b1"])
    with pytest.raises(PassError, match="with bias correction needs the calibration samples"):
        quantize_int8(graph, ranges, weights="rtn", bias_correction=True)
    with pytest.raises(PassError, match="needs the calibration samples"):
        quantize_int8(graph, ranges, weights="gptq")
    without = quantize_int8(graph, ranges)  # no samples: round to nearest, biases as they are
    np.testing.assert_array_equal(without.initializers["b1"], graph.initializers["b1"])
