"""Signal-processing ops of opset 17+, one table row each (the op contract: ``_contract.py``):
the window functions (HannWindow, HammingWindow, BlackmanWindow), MelWeightMatrix, DFT and STFT.

Sizes that decide output shapes (a window's size, a DFT's length and axis, STFT's frame step and
length, the mel matrix's bin counts) are constant inputs (``CONST_INPUTS``); the kernels read
them from their arrays at run time. Complex values are a trailing axis of 2 (real, imaginary),
as ONNX stores them; transforms run in numpy's FFT at the input's precision (float16 in float32).
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef, per_element
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._util import INT, axis_index, need

SIZES = frozenset({"int32", "int64"})


def k_hann_window(size, periodic, dtype):
    n = int(np.asarray(size).reshape(()))
    span = n if periodic else n - 1
    return np.asarray(np.sin(np.arange(n) * np.pi / span) ** 2).astype(dtype)


def k_hamming_window(size, periodic, dtype):
    n = int(np.asarray(size).reshape(()))
    span = n if periodic else n - 1
    alpha = 25.0 / 46.0
    return np.asarray(alpha - np.cos(np.arange(n) * 2 * np.pi / span) * (1 - alpha)).astype(dtype)


def k_blackman_window(size, periodic, dtype):
    n = int(np.asarray(size).reshape(()))
    span = n if periodic else n - 1
    angle = np.arange(n) * 2 * np.pi / span
    return np.asarray(0.42 - 0.5 * np.cos(angle) + 0.08 * np.cos(2 * angle)).astype(dtype)


def k_mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, dtype):
    bins, length = int(np.asarray(num_mel_bins).reshape(())), int(np.asarray(dft_length).reshape(()))
    low = 2595 * np.log1p(lower_edge_hertz / 700) / np.log(10)  # hertz -> mel, in the edges' dtype
    high = 2595 * np.log1p(upper_edge_hertz / 700) / np.log(10)
    step = (high - low) / (bins + 2)
    mels = np.arange(0, bins + 2) * step + low
    hertz = 700 * np.expm1(mels / 2595 * np.log(10))
    edges = (((length + 1) * hertz) // sample_rate).astype(np.int64)
    out = np.zeros((length // 2 + 1, bins))
    j = np.arange(length // 2 + 1).reshape(-1, 1)
    left, center, right = edges[:-2], edges[1:-1], edges[2:]
    rising = (j - left) / np.maximum(center - left, 1)
    falling = (right - j) / np.maximum(right - center, 1)
    out = np.where((j >= left) & (j <= center), np.where(center == left, (j == center) * 1.0, rising), out)
    out = np.where((j >= center) & (j < right), falling, out)
    return out.astype(dtype)


def k_dft(x, dft_length=None, axis_input=None, *, axis, inverse, onesided):
    a = (int(np.asarray(axis_input).reshape(())) if axis_input is not None else axis) % x.ndim
    w = x.astype(np.float32) if x.dtype == np.float16 else x
    signal = w[..., 0] + 1j * w[..., 1] if x.shape[-1] == 2 else w[..., 0]  # in the input's precision
    if dft_length is not None:
        n = int(np.asarray(dft_length).reshape(()))
    else:
        n = 2 * (x.shape[a] - 1) if inverse and onesided else x.shape[a]
    if inverse and onesided:
        return np.fft.irfft(signal, n=n, axis=a)[..., None].astype(x.dtype)
    spectrum = np.fft.ifft(signal, n=n, axis=a) if inverse else np.fft.fft(signal, n=n, axis=a)
    if onesided and not inverse:
        spectrum = np.take(spectrum, np.arange(n // 2 + 1), axis=a)
    return np.stack((spectrum.real, spectrum.imag), axis=-1).astype(x.dtype)


def k_stft(signal, frame_step, window=None, frame_length=None, *, onesided):
    step = int(np.asarray(frame_step).reshape(()))
    if frame_length is not None:
        size = int(np.asarray(frame_length).reshape(()))
    else:
        size = signal.shape[1] if window is None else window.shape[0]
    frames = 1 + (signal.shape[1] - size) // step
    starts = np.arange(frames).reshape(-1, 1) * step + np.arange(size)  # (frames, size)
    chunks = signal[:, starts].astype(np.float32) if signal.dtype == np.float16 else signal[:, starts]
    if chunks.shape[-1] == 2:
        values = chunks[..., 0] + 1j * chunks[..., 1]
    else:
        values = chunks[..., 0]
    if window is not None:
        values = values * window.astype(values.real.dtype)
    spectrum = np.fft.fft(values, n=size, axis=-1)
    if onesided:
        spectrum = spectrum[..., : size // 2 + 1]
    return np.stack((spectrum.real, spectrum.imag), axis=-1).astype(signal.dtype)


# --- inference and attributes -----------------------------------------------------------------
def _scalar_int(node, consts, index, what):
    value = (consts or {}).get(index)
    if value is None or np.asarray(value).size != 1 or np.asarray(value).dtype.kind not in "iu":
        raise ShapeInferenceError(
            f"{node.describe()}: {what} must be a constant integer scalar; it decides the output shape"
        )
    return int(np.asarray(value).reshape(()))


def _out_dtype(node, default=1):
    code = int(node.attr("output_datatype", default))
    name = dtypes.FROM_ONNX_CODE.get(code)
    if name is None:
        raise UnsupportedAttributeError(f"{node.describe()}: output_datatype {code} is not an IR dtype")
    return name


def _infer_window(node, inputs, consts=None):
    need(node, inputs, 1)
    want(node, inputs[0], ((17, SIZES),), "size")
    size = _scalar_int(node, consts, 0, "size")
    if size < 0:
        raise ShapeInferenceError(f"{node.describe()}: size {size} is negative")
    return [TensorType(_out_dtype(node), (size,))]


def _window_attrs(node):
    return {"periodic": int(node.attr("periodic", 1)), "dtype": _out_dtype(node)}


def _window(op_type, kernel):
    return OpDef(
        op_type,
        (17,),
        infer=_infer_window,
        fn=kernel,
        flops=per_element(TRANSCENDENTAL),
        attrs=_window_attrs,
        ATTRS={"output_datatype": INT, "periodic": INT},
        CONST_INPUTS=(0,),
    )


def _infer_mel(node, inputs, consts=None):
    need(node, inputs, 5)
    for t, what in zip(inputs[:3], ("num_mel_bins", "dft_length", "sample_rate"), strict=True):
        want(node, t, ((17, SIZES),), what)
    for t, what in zip(inputs[3:], ("lower_edge_hertz", "upper_edge_hertz"), strict=True):
        want(node, t, ((17, FLOATS),), what)
    bins, length = _scalar_int(node, consts, 0, "num_mel_bins"), _scalar_int(node, consts, 1, "dft_length")
    if bins < 1 or length < 1:
        raise ShapeInferenceError(f"{node.describe()}: num_mel_bins {bins} and dft_length {length} must be positive")
    return [TensorType(_out_dtype(node), (length // 2 + 1, bins))]


def _infer_dft(node, inputs, consts=None):
    need(node, inputs, 1, 2 if node.version >= 20 else 1)
    x = inputs[0]
    want(node, x, ((17, FLOATS),))
    if x.rank < 2 or x.shape[-1] not in (1, 2):
        raise ShapeInferenceError(
            f"{node.describe()}: the input must end in an axis of 1 (real) or 2 (complex), got {x}"
        )
    attrs = _dft_attrs(node)
    axis = attrs["axis"]
    if node.version >= 20 and len(inputs) > 2 and inputs[2] is not None:
        axis = _scalar_int(node, consts, 2, "axis")
    a = axis_index(node, axis, x.rank)
    if a == x.rank - 1:
        raise ShapeInferenceError(f"{node.describe()}: axis {axis} is the real/imaginary axis")
    if len(inputs) > 1 and inputs[1] is not None:
        n = _scalar_int(node, consts, 1, "dft_length")
    elif isinstance(x.shape[a], int):
        n = 2 * (x.shape[a] - 1) if attrs["inverse"] and attrs["onesided"] else x.shape[a]
    else:
        raise ShapeInferenceError(f"{node.describe()}: the transformed axis must be static")
    if n < 1:
        raise ShapeInferenceError(f"{node.describe()}: dft_length {n} must be positive")
    if attrs["inverse"] and attrs["onesided"]:
        size, last = n, 1
    else:
        size, last = (n // 2 + 1 if attrs["onesided"] else n), 2
    return [TensorType(x.dtype, tuple(size if i == a else d for i, d in enumerate(x.shape[:-1])) + (last,))]


def _dft_attrs(node):
    inverse, onesided = int(node.attr("inverse", 0)), int(node.attr("onesided", 0))
    return {"axis": int(node.attr("axis", 1)) if node.version < 20 else -2, "inverse": inverse, "onesided": onesided}


def _dft_flops(node, inputs, outputs):
    n = max(outputs[0].numel(), 2)
    return 5 * n * int(np.log2(n) + 1)


def _infer_stft(node, inputs, consts=None):
    need(node, inputs, 2, 2)
    x = inputs[0]
    window = inputs[2] if len(inputs) > 2 else None
    want(node, x, ((17, FLOATS),), "signal")
    if x.rank != 3 or x.shape[2] not in (1, 2):
        raise ShapeInferenceError(f"{node.describe()}: signal must be [batch, length, 1 or 2], got {x}")
    step = _scalar_int(node, consts, 1, "frame_step")
    if len(inputs) > 3 and inputs[3] is not None:
        size = _scalar_int(node, consts, 3, "frame_length")
    elif window is not None:
        if window.rank != 1:
            raise ShapeInferenceError(f"{node.describe()}: window must be a vector, got {window}")
        size = window.shape[0]
    else:
        size = x.shape[1]
    if window is not None and (window.rank != 1 or window.dtype != x.dtype or window.shape[0] != size):
        raise ShapeInferenceError(f"{node.describe()}: window must be a {x.dtype} vector of {size}, got {window}")
    if not isinstance(size, int) or not isinstance(x.shape[1], int) or step < 1 or not 1 <= size <= x.shape[1]:
        raise ShapeInferenceError(f"{node.describe()}: frame length {size} and step {step} do not fit signal {x}")
    onesided = int(node.attr("onesided", 1))
    return [TensorType(x.dtype, (x.shape[0], 1 + (x.shape[1] - size) // step, size // 2 + 1 if onesided else size, 2))]


OPS = (
    _window("HannWindow", k_hann_window),
    _window("HammingWindow", k_hamming_window),
    _window("BlackmanWindow", k_blackman_window),
    OpDef(
        "MelWeightMatrix",
        (17,),
        infer=_infer_mel,
        fn=k_mel_weight_matrix,
        flops=per_element(4),
        attrs=lambda node: {"dtype": _out_dtype(node)},
        ATTRS={"output_datatype": INT},
        CONST_INPUTS=(0, 1),
    ),
    OpDef(
        "DFT",
        (17, 20),
        infer=_infer_dft,
        fn=k_dft,
        flops=_dft_flops,
        attrs=_dft_attrs,
        ATTRS={"axis": INT, "inverse": INT, "onesided": INT},
        CONST_INPUTS=(1, 2),
    ),
    OpDef(
        "STFT",
        (17,),
        infer=_infer_stft,
        fn=k_stft,
        flops=_dft_flops,
        attrs=lambda node: {"onesided": int(node.attr("onesided", 1))},
        ATTRS={"onesided": INT},
        CONST_INPUTS=(1, 3),
    ),
)
