"""More of the edge op set (attention, feature normalisations, selection, signal,
losses, sampling ...): the interpreter and the compiled x86-64 module against onnxruntime on
random inputs, several attribute settings per op, and typed errors for what they refuse."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.errors import ModelError, ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.device_targets.onnx_backend import CuvilBackend
from onnx_cases import node_inputs

F16, F64, I32, I64, BOOL = np.float16, np.float64, np.int32, np.int64, np.bool_
MODES = ("interpreter", "compiled")


@dataclass(frozen=True)
class Feed:
    """A graph input filled with random values (``low``/``high`` bound integers)."""

    shape: tuple
    dtype: object = np.float32
    low: int = -5
    high: int = 6


@dataclass(frozen=True)
class Op:
    id: str
    op: str
    args: tuple  # Feed (graph input), np.ndarray (initializer) or None (absent optional input)
    attrs: dict = field(default_factory=dict)
    opset: int = 23
    outputs: int = 1
    oracle: object = None  # where onnxruntime lacks the op: the equivalent model it runs instead


def op(id, op_type, *args, opset=23, outputs=1, oracle=None, **attrs):
    return Op(id, op_type, args, attrs, opset, outputs, oracle)


def rng_array(shape, dtype, rng, low=-5, high=6):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.6
    if dtype.kind == "f":
        return rng.normal(size=shape).astype(dtype)
    return rng.integers(low, high, size=shape).astype(dtype)


def model_of(c: Op) -> bytes:
    inputs, inits, names = node_inputs(c.args, lambda a: isinstance(a, Feed))
    outs = [f"y{i}" for i in range(c.outputs)]
    node = helper.make_node(c.op, names, outs, name="n0", **c.attrs)
    graph = helper.make_graph([node], c.id, inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)])
    model.ir_version = 10
    model = onnx.shape_inference.infer_shapes(model)
    for out in model.graph.output:  # ONNX cannot infer every function-bodied op (MVN): the input's type
        if not out.type.tensor_type.HasField("shape"):
            out.type.CopyFrom(inputs[0].type)
    return model.SerializeToString()


def swiglu_oracle(c: Op) -> bytes:
    """SwiGLU as onnxruntime can run it (it has no Swish-24 kernel): A * Sigmoid(alpha * A) * B."""
    alpha = numpy_helper.from_array(np.array(c.attrs.get("alpha", 1.0), dtype=c.args[0].dtype), "alpha")
    nodes = [helper.make_node("Mul", ["in0", "alpha"], ["scaled"]), helper.make_node("Sigmoid", ["scaled"], ["gate"]),
             helper.make_node("Mul", ["in0", "gate"], ["swish"]), helper.make_node("Mul", ["swish", "in1"], ["y0"])]
    code = helper.np_dtype_to_tensor_dtype(np.dtype(c.args[0].dtype))
    inputs = [helper.make_tensor_value_info(f"in{i}", code, list(a.shape)) for i, a in enumerate(c.args)]
    graph = helper.make_graph(nodes, c.id, inputs, [helper.make_tensor_value_info("y0", code, None)], [alpha])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    return model.SerializeToString()


def feeds_of(c: Op, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {f"in{i}": rng_array(a.shape, a.dtype, rng, a.low, a.high)
            for i, a in enumerate(c.args) if isinstance(a, Feed)}


def run_ort(model: bytes, feeds: dict) -> list:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_close(actual, expected, dtype):
    rtol, atol = (2e-3, 2e-3) if np.dtype(dtype) == np.float16 else (1e-4, 1e-5)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, (i, a.dtype, a.shape, e.dtype, e.shape)
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"output {i}")


X4 = Feed((2, 3, 4, 5))
F = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731
L = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
R = np.random.default_rng(11)


def positions(batch, steps, limit):
    return R.integers(0, limit, size=(batch, steps)).astype(np.int64)


def caches(rows, half, dtype=np.float32):
    angles = np.arange(rows).reshape(-1, 1) / (10000 ** (np.arange(half) / half))
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


COS8, SIN8 = caches(16, 4)
COS2, SIN2 = caches(16, 2)
COS8H, SIN8H = caches(16, 4, F16)

CASES = [
    # --- RMSNormalization (23)
    op("rms_last_axis", "RMSNormalization", X4, Feed((5,))),
    op("rms_axis1_eps", "RMSNormalization", X4, Feed((3, 4, 5)), axis=1, epsilon=1e-3),
    op("rms_axis_neg2_bcast_scale", "RMSNormalization", X4, Feed((1, 5)), axis=-2),
    op("rms_f16", "RMSNormalization", Feed((2, 6, 8), F16), Feed((8,), F16)),
    op("rms_f64", "RMSNormalization", Feed((3, 7), F64), Feed((7,), F64)),
    # --- LpNormalization (1, 22)
    op("lpnorm_l2_last", "LpNormalization", X4, opset=13),
    op("lpnorm_l1_axis1", "LpNormalization", X4, axis=1, p=1, opset=13),
    op("lpnorm_axis0_zero_row", "LpNormalization", np.array([[0, 0, 0], [1, -2, 2]], np.float32), axis=1, opset=22),
    op("lpnorm_f64", "LpNormalization", Feed((4, 6), F64), axis=0, opset=22),
    # --- MeanVarianceNormalization (9, 13)
    op("mvn_default_axes", "MeanVarianceNormalization", X4, opset=13),
    op("mvn_spatial", "MeanVarianceNormalization", X4, axes=[2, 3], opset=13),
    op("mvn_opset9_all", "MeanVarianceNormalization", X4, axes=[0, 1, 2, 3], opset=9),
    # --- Attention (23, 24, 25)
    op("attn_4d", "Attention", Feed((2, 3, 4, 8)), Feed((2, 3, 6, 8)), Feed((2, 3, 6, 5))),
    op("attn_4d_all_outputs_mask_past", "Attention", Feed((2, 3, 4, 8)), Feed((2, 3, 6, 8)), Feed((2, 3, 6, 8)),
       Feed((4, 10)), Feed((2, 3, 4, 8)), Feed((2, 3, 4, 8)), outputs=4),
    op("attn_3d_gqa_causal", "Attention", Feed((2, 4, 24)), Feed((2, 6, 8)), Feed((2, 6, 10)),
       q_num_heads=6, kv_num_heads=2, is_causal=1),
    op("attn_bool_mask_scale", "Attention", Feed((1, 2, 3, 4)), Feed((1, 2, 5, 4)), Feed((1, 2, 5, 4)),
       Feed((2, 3, 5), BOOL), scale=0.3),
    op("attn_softcap_qk_mode2", "Attention", Feed((1, 2, 3, 4)), Feed((1, 2, 5, 4)), Feed((1, 2, 5, 4)),
       Feed((3, 7)), Feed((1, 2, 2, 4)), Feed((1, 2, 2, 4)), softcap=2.0, qk_matmul_output_mode=2, outputs=4),
    op("attn_qk_mode3_causal_past", "Attention", Feed((1, 2, 3, 4)), Feed((1, 2, 3, 4)), Feed((1, 2, 3, 4)),
       None, Feed((1, 2, 2, 4)), Feed((1, 2, 2, 4)), is_causal=1, qk_matmul_output_mode=3, outputs=4),
    op("attn_qk_mode0", "Attention", Feed((1, 2, 3, 4)), Feed((1, 2, 5, 4)), Feed((1, 2, 5, 4)),
       Feed((3, 6)), Feed((1, 2, 1, 4)), Feed((1, 2, 1, 4)), outputs=4),
    op("attn_mask_4d_softcap_qk_mode1", "Attention", Feed((2, 2, 3, 4)), Feed((2, 2, 5, 4)), Feed((2, 2, 5, 4)),
       Feed((2, 1, 3, 5)), Feed((2, 2, 0, 4)), Feed((2, 2, 0, 4)), softcap=1.5, qk_matmul_output_mode=1, outputs=4),
    op("attn_nonpad_causal_opset24", "Attention", Feed((2, 2, 2, 4)), Feed((2, 2, 6, 4)), Feed((2, 2, 6, 4)),
       None, None, None, np.array([4, 6], np.int64), is_causal=1, opset=24),
    op("attn_window_opset25", "Attention", Feed((1, 2, 6, 4)), Feed((1, 2, 6, 4)), Feed((1, 2, 6, 4)),
       left_window_size=1, right_window_size=2, opset=25),
    op("attn_f16", "Attention", Feed((1, 2, 4, 8), F16), Feed((1, 2, 4, 8), F16), Feed((1, 2, 4, 8), F16),
       is_causal=1),
    # --- RotaryEmbedding (23)
    op("rope_4d_positions", "RotaryEmbedding", Feed((2, 3, 5, 8)), COS8, SIN8, positions(2, 5, 16)),
    op("rope_3d_interleaved", "RotaryEmbedding", Feed((2, 5, 24)), COS8, SIN8, positions(2, 5, 16),
       num_heads=3, interleaved=1),
    op("rope_partial_dim", "RotaryEmbedding", Feed((1, 2, 5, 8)), COS2, SIN2, positions(1, 5, 16),
       rotary_embedding_dim=4),
    op("rope_no_positions", "RotaryEmbedding", Feed((2, 2, 5, 8)), np.stack([COS8[:5]] * 2), np.stack([SIN8[:5]] * 2)),
    op("rope_f16", "RotaryEmbedding", Feed((1, 2, 5, 8), F16), COS8H, SIN8H, positions(1, 5, 16)),
    # --- NonZero, Compress, Unique, ReverseSequence, EyeLike, CenterCropPad
    op("nonzero_int", "NonZero", Feed((3, 4), I32, -1, 2), opset=13),
    op("nonzero_bool_3d", "NonZero", Feed((2, 3, 4), BOOL), opset=13),
    op("compress_axis0", "Compress", Feed((4, 3)), Feed((4,), BOOL), axis=0, opset=13),
    op("compress_flat_short", "Compress", Feed((3, 4)), np.array([1, 0, 1, 1, 0], bool), opset=13),
    op("compress_axis_neg1", "Compress", Feed((2, 5)), Feed((3,), BOOL), axis=-1, opset=13),
    op("unique_sorted_all", "Unique", Feed((12,), I64, 0, 5), opset=13, outputs=4),
    op("unique_unsorted", "Unique", Feed((3, 4), I64, 0, 4), sorted=0, opset=13, outputs=4),
    op("unique_axis0", "Unique", np.array([[1, 2], [3, 4], [1, 2], [0, 9]], np.float32), axis=0, opset=13, outputs=4),
    op("reverse_time_major", "ReverseSequence", Feed((5, 3, 2)), np.array([5, 2, 0], np.int64), opset=13),
    op("reverse_batch_major", "ReverseSequence", Feed((3, 4)), np.array([1, 4, 3], np.int64),
       batch_axis=0, time_axis=1, opset=13),
    op("eyelike_k1_int", "EyeLike", Feed((4, 5)), k=1, dtype=TensorProto.INT32, opset=13),
    op("eyelike_neg_k", "EyeLike", Feed((3, 6), I64), k=-2, opset=22),
    op("center_crop_pad_mixed", "CenterCropPad", Feed((5, 6, 3)), np.array([8, 3, 3], np.int64), opset=18),
    op("center_crop_pad_axes", "CenterCropPad", Feed((2, 7, 4)), np.array([4, 9], np.int64), axes=[-2, 2], opset=18),
    # --- windows, MelWeightMatrix, DFT, STFT (17, 20)
    op("hann_periodic", "HannWindow", np.array(10, np.int32), opset=17),
    op("hamming_symmetric_f64", "HammingWindow", np.array(7, np.int64), periodic=0,
       output_datatype=TensorProto.DOUBLE, opset=17),
    op("blackman", "BlackmanWindow", np.array(9, np.int32), opset=17),
    op("melweight", "MelWeightMatrix", np.array(8, np.int32), np.array(32, np.int32), np.array(8000, np.int32),
       np.array(100, np.float32), np.array(3000, np.float32), opset=17),
    op("dft_opset17_axis1", "DFT", Feed((2, 8, 3, 1)), opset=17),
    op("dft_opset20_complex_axis", "DFT", Feed((2, 6, 2)), None, np.array(1, np.int64), opset=20),
    op("dft_onesided_length", "DFT", Feed((2, 8, 1)), np.array(10, np.int64), np.array(1, np.int64),
       onesided=1, opset=20),
    op("dft_inverse", "DFT", Feed((3, 5, 2)), None, np.array(-2, np.int64), inverse=1, opset=20),
    op("stft_window", "STFT", Feed((2, 64, 1)), np.array(8, np.int64), np.hanning(16).astype(np.float32), opset=17),
    op("stft_two_sided_length", "STFT", Feed((1, 40, 1)), np.array(6, np.int64), None, np.array(12, np.int64),
       onesided=0, opset=17),
    # --- GridSample (16, 20, 22), AffineGrid (20)
    op("gridsample_bilinear_zeros", "GridSample", X4, Feed((2, 3, 6, 2)), opset=16),
    op("gridsample_bicubic_border_align", "GridSample", X4, Feed((2, 5, 2, 2)), mode="bicubic",
       padding_mode="border", align_corners=1, opset=16),
    op("gridsample_nearest_reflection", "GridSample", X4, Feed((2, 4, 4, 2)), mode="nearest",
       padding_mode="reflection", opset=20),
    op("gridsample_linear_reflection_3d", "GridSample", Feed((1, 2, 3, 4, 5)), Feed((1, 2, 3, 2, 3)),
       padding_mode="reflection", opset=20),
    op("gridsample_cubic_zeros", "GridSample", X4, Feed((2, 3, 3, 2)), mode="cubic", opset=22),
    op("gridsample_cubic_reflection", "GridSample", X4, Feed((2, 3, 3, 2)), mode="cubic", padding_mode="reflection",
       opset=20),
    op("affine_grid_2d", "AffineGrid", Feed((2, 2, 3)), L(2, 3, 4, 5), opset=20),
    op("affine_grid_3d_align", "AffineGrid", Feed((1, 3, 4)), L(1, 1, 3, 4, 2), align_corners=1, opset=20),
    # --- LpPool (2, 11, 18, 22), Col2Im (18), MaxUnpool (9, 11, 22)
    op("lppool_p2", "LpPool", X4, kernel_shape=[2, 2], opset=13),
    op("lppool_p1_strides_pads", "LpPool", X4, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], p=1, opset=13),
    op("lppool_same_dilations_ceil", "LpPool", X4, kernel_shape=[2, 3], dilations=[2, 1], strides=[2, 2],
       ceil_mode=1, p=3, opset=18),
    op("lppool_same_upper", "LpPool", Feed((1, 2, 7)), kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER",
       opset=22),
    op("col2im_2d", "Col2Im", Feed((2, 12, 12)), L(4, 5), L(2, 2), opset=18),
    op("col2im_strides_pads_dilations", "Col2Im", Feed((1, 6, 6)), L(5, 5), L(3, 2), strides=[2, 2],
       pads=[1, 0, 1, 0], dilations=[1, 2], opset=18),
    op("maxunpool_2d", "MaxUnpool", Feed((1, 2, 2, 2)), np.array([[[[0, 3], [9, 14]], [[16, 19], [28, 31]]]]),
       kernel_shape=[2, 2], strides=[2, 2], opset=13),
    op("maxunpool_output_shape", "MaxUnpool", Feed((1, 1, 2, 2)), np.array([[[[6, 8], [16, 18]]]]),
       L(1, 1, 5, 5), kernel_shape=[2, 2], strides=[2, 2], opset=22),
    # --- GreaterOrEqual, LessOrEqual (12, 16), Det (11, 22), CumProd (26), Swish (24)
    op("greater_or_equal_bcast", "GreaterOrEqual", Feed((3, 4), I32, -2, 3), Feed((4,), I32, -2, 3), opset=13),
    op("less_or_equal_f16", "LessOrEqual", Feed((2, 5), F16), Feed((2, 1), F16), opset=16),
    op("det_batch", "Det", Feed((2, 3, 4, 4)), opset=13),
    op("det_single_matrix", "Det", Feed((3, 3)), opset=22),
    op("cumprod_axis1", "CumProd", Feed((3, 4)), np.array(1, np.int64), opset=26),
    op("cumprod_exclusive_reverse", "CumProd", Feed((2, 3, 4), I64, -3, 4), np.array(-1, np.int32), exclusive=1,
       reverse=1, opset=26),
    op("swish_alpha", "Swish", Feed((3, 7)), alpha=0.7, opset=24),
    op("swiglu_alpha", "SwiGLU", Feed((2, 3, 8)), Feed((2, 3, 8)), alpha=1.7, opset=28, oracle=swiglu_oracle),
    op("swiglu_f16", "SwiGLU", Feed((4, 6), F16), Feed((4, 6), F16), opset=28, oracle=swiglu_oracle),
    # --- TensorScatter (24), Scatter (9), BitCast (26), DynamicQuantizeLinear (11)
    op("tensorscatter_linear", "TensorScatter", Feed((2, 3, 6, 4)), Feed((2, 3, 2, 4)), L(0, 3), opset=24),
    op("tensorscatter_circular_axis", "TensorScatter", Feed((2, 5, 3)), Feed((2, 3, 3)), L(4, 1), axis=1,
       mode="circular", opset=24),
    op("scatter_axis1", "Scatter", Feed((3, 5)), np.array([[0, 4], [2, 1], [3, 3]], np.int64), Feed((3, 2)), axis=1,
       opset=10),
    op("bitcast_f32_i32", "BitCast", Feed((3, 4)), to=TensorProto.INT32, opset=26),
    op("bitcast_i16_f16", "BitCast", Feed((5,), np.int16, 0, 15000), to=TensorProto.FLOAT16, opset=26),
    op("dynamic_quantize", "DynamicQuantizeLinear", Feed((4, 6)), opset=11, outputs=3),
    op("dynamic_quantize_positive", "DynamicQuantizeLinear", np.abs(np.random.default_rng(3).normal(size=(8,)))
       .astype(np.float32), opset=11, outputs=3),
    # --- NonMaxSuppression (10, 11)
    op("nms_corners", "NonMaxSuppression", R.normal(size=(2, 6, 4)).astype(np.float32),
       Feed((2, 3, 6)), L(3), F(0.3), F(-0.5), opset=13),
    op("nms_center_no_threshold", "NonMaxSuppression",
       np.concatenate([R.random((1, 8, 2)) * 4, R.random((1, 8, 2)) + 0.5], axis=2).astype(np.float32),
       Feed((1, 2, 8)), L(5), F(0.2), opset=11, center_point_box=1),
    # --- RNN, GRU, LSTM (7, 14, 22)
    op("rnn_relu_bias_initial", "RNN", Feed((4, 2, 3)), Feed((1, 5, 3)), Feed((1, 5, 5)), Feed((1, 10)), None,
       Feed((1, 2, 5)), hidden_size=5, activations=["Relu"], opset=14, outputs=2),
    op("rnn_bidirectional_seq_lens", "RNN", Feed((4, 3, 2)), Feed((2, 4, 2)), Feed((2, 4, 4)), None,
       np.array([4, 2, 1], np.int32), hidden_size=4, direction="bidirectional", opset=22, outputs=2),
    op("gru_reverse_linear_before_reset", "GRU", Feed((5, 2, 3)), Feed((1, 12, 3)), Feed((1, 12, 4)),
       Feed((1, 24)), np.array([5, 3], np.int32), Feed((1, 2, 4)), hidden_size=4, direction="reverse",
       linear_before_reset=1, opset=14, outputs=2),
    op("gru_bidirectional_clip", "GRU", Feed((3, 2, 2)), Feed((2, 9, 2)), Feed((2, 9, 3)), hidden_size=3,
       direction="bidirectional", clip=0.5, opset=22, outputs=2),
    op("lstm_peepholes_states", "LSTM", Feed((3, 2, 4)), Feed((1, 12, 4)), Feed((1, 12, 3)), Feed((1, 24)),
       np.array([3, 2], np.int32), Feed((1, 2, 3)), Feed((1, 2, 3)), Feed((1, 9)), hidden_size=3, opset=14,
       outputs=3),
    op("lstm_bidirectional_activations", "LSTM", Feed((4, 1, 2)), Feed((2, 8, 2)), Feed((2, 8, 2)), hidden_size=2,
       direction="bidirectional", activations=["HardSigmoid", "Tanh", "Softsign", "Sigmoid", "LeakyRelu", "Tanh"],
       activation_alpha=[0.3, 0.05], activation_beta=[0.4], opset=22, outputs=3),
    op("lstm_input_forget", "LSTM", Feed((3, 2, 2)), Feed((1, 12, 2)), Feed((1, 12, 3)), hidden_size=3,
       input_forget=1, opset=22, outputs=2),
    # --- LinearAttention, CausalConvWithState (27)
    op("linear_attention_linear_gqa", "LinearAttention", Feed((2, 3, 16)), Feed((2, 3, 8)), Feed((2, 3, 6)),
       q_num_heads=4, kv_num_heads=2, update_rule="linear", opset=27, outputs=2),
    op("linear_attention_gated_delta_past", "LinearAttention", Feed((1, 4, 8)), Feed((1, 4, 8)), Feed((1, 4, 8)),
       Feed((1, 2, 4, 4)), -np.abs(R.normal(size=(1, 4, 2))).astype(np.float32),
       (R.random((1, 4, 2)) * 0.9).astype(np.float32), q_num_heads=2, kv_num_heads=2, scale=0.4, opset=27,
       outputs=2),
    op("linear_attention_gated_per_channel", "LinearAttention", Feed((1, 3, 8)), Feed((1, 3, 8)), Feed((1, 3, 4)),
       None, -np.abs(R.normal(size=(1, 3, 8))).astype(np.float32), q_num_heads=2, kv_num_heads=2,
       update_rule="gated", opset=27, outputs=2),
    op("causal_conv_silu_bias_state", "CausalConvWithState", Feed((2, 3, 5)), Feed((3, 1, 4)), Feed((3,)),
       Feed((2, 3, 3)), activation="silu", opset=27, outputs=2),
    op("causal_conv_plain", "CausalConvWithState", Feed((1, 4, 6)), Feed((4, 1, 2)), opset=27, outputs=2),
    # --- DeformConv (19, 22)
    op("deform_conv_plain", "DeformConv", Feed((1, 2, 5, 5)), Feed((3, 2, 3, 3)), Feed((1, 18, 3, 3)), opset=19),
    op("deform_conv_mask_bias_groups", "DeformConv", Feed((2, 4, 5, 6)), Feed((4, 2, 2, 2)), Feed((2, 16, 5, 3)),
       Feed((4,)), Feed((2, 8, 5, 3)), group=2, offset_group=2, strides=[1, 2], pads=[1, 0, 0, 0], opset=22),
    # --- RoiAlign (10, 16, 22)
    op("roialign_half_pixel", "RoiAlign", Feed((2, 3, 8, 9)), F(0, 0, 5, 4, 1.5, 2, 7.5, 8, 3, 1, 3.5, 1.2).reshape(3, 4),
       L(0, 1, 1), output_height=3, output_width=2, opset=16),
    op("roialign_output_half_pixel_ratio", "RoiAlign", Feed((1, 2, 6, 6)), F(0.5, 0.5, 9, 7, 2, 1, 4, 5).reshape(2, 4),
       L(0, 0), output_height=2, output_width=3, sampling_ratio=2, spatial_scale=0.5,
       coordinate_transformation_mode="output_half_pixel", opset=16),
    op("roialign_max", "RoiAlign", Feed((1, 2, 6, 6)), F(0, 0, 5, 5, 1, 2, 4, 3).reshape(2, 4), L(0, 0), mode="max",
       output_height=2, output_width=2, sampling_ratio=2, opset=16),
    op("roialign_opset10", "RoiAlign", Feed((1, 1, 5, 5)), F(0, 0, 4, 4).reshape(1, 4), L(0), output_height=2,
       output_width=2, opset=10),
    # --- TfIdfVectorizer (9)
    op("tfidf_tf_skip", "TfIdfVectorizer", Feed((2, 8), I32, 1, 6), mode="TF", min_gram_length=1, max_gram_length=2,
       max_skip_count=2, ngram_counts=[0, 3], ngram_indexes=[0, 1, 2, 3, 4, 5], pool_int64s=[2, 3, 5, 1, 2, 3, 4, 5, 5],
       opset=13),
    op("tfidf_idf_weights_1d", "TfIdfVectorizer", Feed((12,), I64, 1, 5), mode="IDF", min_gram_length=2,
       max_gram_length=3, max_skip_count=1, ngram_counts=[0, 2, 6], ngram_indexes=[0, 1, 2, 3, 4],
       pool_int64s=[1, 2, 1, 2, 3, 4, 1, 2, 3], weights=[0.5, 1.5, 2.0, 0.25, 3.0], opset=13),
    op("tfidf_tfidf", "TfIdfVectorizer", Feed((3, 6), I64, 1, 4), mode="TFIDF", min_gram_length=1,
       max_gram_length=1, max_skip_count=0, ngram_counts=[0], ngram_indexes=[2, 0, 1], pool_int64s=[1, 2, 3],
       weights=[2.0, 0.5, 1.0], opset=13),
    # --- losses (12, 13, 22)
    op("nll_mean", "NegativeLogLikelihoodLoss", Feed((4, 5)), Feed((4,), I64, 0, 5), opset=13),
    op("nll_weight_ignore_none", "NegativeLogLikelihoodLoss", Feed((3, 5, 2)), Feed((3, 2), I32, 0, 5),
       Feed((5,)), ignore_index=2, reduction="none", opset=13),
    op("nll_sum_3d", "NegativeLogLikelihoodLoss", Feed((2, 4, 3, 2)), Feed((2, 3, 2), I64, 0, 4), reduction="sum",
       opset=22),
    op("sce_mean_log_prob", "SoftmaxCrossEntropyLoss", Feed((4, 6)), Feed((4,), I64, 0, 6), opset=13, outputs=2),
    op("sce_weight_ignore", "SoftmaxCrossEntropyLoss", Feed((3, 5, 2)), Feed((3, 2), I64, 0, 5), Feed((5,)),
       ignore_index=1, opset=13),
    op("sce_none_f64", "SoftmaxCrossEntropyLoss", Feed((3, 4), F64), Feed((3,), I32, 0, 4), reduction="none",
       opset=13),
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ops-more")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("c", CASES, ids=lambda c: c.id)
def test_matches_onnxruntime(c, mode, cache_dir):
    # prepare
    model = model_of(c)
    feeds = feeds_of(c)
    expected = run_ort(c.oracle(c) if c.oracle else model, feeds)
    # act
    actual = CuvilBackend.prepare(model, mode=mode, cache_dir=cache_dir).run(feeds)
    # assert
    first = next((a for a in c.args if isinstance(a, Feed)), None)
    assert_close(actual, expected, first.dtype if first is not None else np.float32)


def test_data_dependent_lengths_bind_per_run(cache_dir):
    """NonZero's count is a symbol of its own: one compiled module serves inputs with any count."""
    model = model_of(op("nz", "NonZero", Feed((3, 4)), opset=13))
    rep = CuvilBackend.prepare(model, mode="compiled", cache_dir=cache_dir)
    for x in (np.zeros((3, 4), np.float32), np.eye(3, 4, dtype=np.float32), np.ones((3, 4), np.float32)):
        assert rep.run({"in0": x})[0].tolist() == np.array(np.nonzero(x)).tolist()


BAD = [
    (op("attn_3d_without_heads", "Attention", Feed((1, 3, 8)), Feed((1, 3, 8)), Feed((1, 3, 8))),
     ShapeInferenceError, "q_num_heads"),
    (op("attn_heads_do_not_split", "Attention", Feed((1, 3, 8)), Feed((1, 3, 8)), Feed((1, 3, 8)),
        q_num_heads=3, kv_num_heads=3), ShapeInferenceError, "does not split"),
    (op("attn_bad_gqa", "Attention", Feed((1, 3, 2, 4)), Feed((1, 2, 2, 4)), Feed((1, 2, 2, 4))),
     ShapeInferenceError, "do not group"),
    (op("rms_stash_type", "RMSNormalization", X4, Feed((5,)), stash_type=0), UnsupportedAttributeError, "stash_type"),
    (op("lp_p3", "LpNormalization", X4, p=3, opset=13), UnsupportedAttributeError, "p must be 1 or 2"),
    (op("rope_odd_dim", "RotaryEmbedding", Feed((1, 2, 5, 8)), COS2, SIN2, positions(1, 5, 16),
        rotary_embedding_dim=3), ShapeInferenceError, "even"),
    (op("crop_runtime_shape", "CenterCropPad", Feed((4, 4)), Feed((2,), I64), opset=18), ShapeInferenceError,
     "constant"),
    (op("window_runtime_size", "HannWindow", Feed((), I32), opset=17), ShapeInferenceError, "constant integer"),
    (op("nll_bad_target", "NegativeLogLikelihoodLoss", Feed((4, 5)), Feed((5,), I64), opset=13),
     ShapeInferenceError, "without axis 1"),
    (op("eyelike_3d", "EyeLike", Feed((2, 2, 2)), opset=13), ShapeInferenceError, "2-D"),
    (op("reverse_bad_axes", "ReverseSequence", Feed((3, 4, 2)), np.array([1, 1, 1, 1], np.int64), batch_axis=2,
        time_axis=0, opset=13), UnsupportedAttributeError, "batch_axis"),
]


@pytest.mark.parametrize("c,error,fragment", BAD, ids=[b[0].id for b in BAD])
def test_refuses_with_a_typed_error_naming_the_node(c, error, fragment):
    from cuvil_edge.frontend.onnx_import import load_model

    with pytest.raises(error, match=fragment) as info:
        load_model(_unchecked_model(c))
    assert isinstance(info.value, ModelError) and "n0" in str(info.value)


def _unchecked_model(c: Op) -> bytes:
    """The one-node model without ONNX's checker or shape inference: some are invalid on purpose."""
    inputs, inits, names = node_inputs(c.args, lambda a: isinstance(a, Feed))
    node = helper.make_node(c.op, names, ["y0"], name="n0", **c.attrs)
    out = helper.make_tensor_value_info("y0", TensorProto.FLOAT, None)
    out.type.tensor_type.shape.SetInParent()
    graph = helper.make_graph([node], c.id, inputs, [out], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", c.opset)])
    model.ir_version = 10
    return model.SerializeToString()


def test_attention_kernel_is_the_contract_function():
    """The interpreter and compiled modules share one kernel, specialised per call site."""
    from cuvil_edge.device_targets.codegen import Specialiser
    from cuvil_edge.ir import ops
    from cuvil_edge.ir.graph import Node

    attention = ops.registry()["Attention"]
    node = Node("att", "Attention", ("q", "k", "v"), ("y",), {"is_causal": 1}, 23)
    specialiser = Specialiser()
    call = specialiser.call(attention, node, ["v0", "v1", "v2"], ["v3"])
    text = "\n".join(specialiser.functions)
    assert call == "v3 = k_attention_1(v0, v1, v2)"
    assert "past_key is None" not in text and "if is_causal" not in text  # absent inputs and attributes folded
