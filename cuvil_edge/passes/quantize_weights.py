"""Error-compensating int8 weight rounding for :mod:`cuvil_edge.passes.quantize` (GPTQ).

Round-to-nearest (RTN) rounds each weight on its own. GPTQ (Frantar et al., 2023, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers", after Optimal Brain Quantization)
rounds the columns of a layer's weight matrix ``W`` [out, in] one at a time and moves each column's
rounding error onto the columns not yet rounded, so that the layer's *output* on the calibration data
stays close:

    minimise  || W X - Wq X ||²  =  tr((W - Wq) H (W - Wq)ᵀ),   H = X Xᵀ  (second moments of the layer's inputs)

using the upper Cholesky factor ``U`` of ``H⁻¹``: after rounding column ``i`` with error ``e``,
``W[:, j] -= e · U[i, j] / U[i, i]`` for ``j > i``. Columns go in order of decreasing ``H[i, i]`` (the
inputs that matter most are rounded first, "act-order"), ``H`` is damped by 1 % of its mean diagonal
(the calibration set has fewer samples than a late conv layer has inputs), and the per-channel scales
are RTN's (max |w| / 127), so every code stays in [-127, 127] and nothing is clipped.

Where inputs are white (a first conv reading standard-normal pixels), ``H`` is a multiple of the
identity and GPTQ is RTN; where they are correlated or far from zero mean (after a Relu), the output
error falls several-fold (measured: bench/results/quantization.md).

Handled: Conv with 2-D kernels and one group (weights [out, in, kh, kw], inputs im2col'ed the way the
kernel reads them) and Gemm/MatMul with a 2-D weight (no transA). Anything else gets RTN.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.graph import Node

#: Columns rounded before the lazy update of the rest (GPTQ's block size: the same result, fewer passes).
BLOCK = 128
#: Fraction of the mean diagonal added to H (GPTQ's percdamp).
DAMP = 0.01


def gptq_supported(node: Node, weight: np.ndarray) -> bool:
    """Whether :func:`layer_inputs` can im2col this op's input (else the weight gets RTN)."""
    if node.op_type.endswith("Conv"):
        return (weight.ndim == 4 and node.attr("group", 1) == 1
                and node.attr("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET"))
    return weight.ndim == 2 and not node.attr("transA", 0)


def layer_inputs(node: Node, x: np.ndarray, k: int) -> np.ndarray:
    """The op's input as rows [samples, k], one row per output position (im2col for a Conv, in the
    (channel, kh, kw) order of the flattened weight)."""
    if not node.op_type.endswith("Conv"):
        return np.ascontiguousarray(x.reshape(-1, k))
    kh, kw = node.attr("kernel_shape", None) or (1, 1)
    sh, sw = node.attr("strides", None) or (1, 1)
    dh, dw = node.attr("dilations", None) or (1, 1)
    pads = node.attr("pads", None) or (0, 0, 0, 0)
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    ho = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    cols = [x[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
            for i in range(kh) for j in range(kw)]  # each [b, c, ho, wo]
    patches = np.stack(cols, axis=2)  # [b, c, kh*kw, ho, wo]
    return np.ascontiguousarray(patches.transpose(0, 3, 4, 1, 2).reshape(-1, k))


def as_matrix(weight: np.ndarray, axis: int) -> np.ndarray:
    """The weight as [output channels, inputs] (the layout GPTQ rounds), from ``axis`` = channel axis."""
    if axis == 0:
        return weight.reshape(weight.shape[0], -1)
    return np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1)


def from_matrix(matrix: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    """Inverse of :func:`as_matrix`."""
    if axis == 0:
        return matrix.reshape(shape)
    moved = (shape[axis],) + tuple(s for i, s in enumerate(shape) if i != axis)
    return np.moveaxis(matrix.reshape(moved), 0, axis)


def gptq(matrix: np.ndarray, hessian: np.ndarray, scale: np.ndarray, damp: float = DAMP,
         block: int = BLOCK) -> np.ndarray:
    """int8 codes [out, in] for ``matrix`` [out, in] with per-row ``scale``, minimising the output error
    under the input second moments ``hessian`` [in, in] (see the module docstring)."""
    w = matrix.astype(np.float64)
    h = np.array(hessian, dtype=np.float64)
    n = w.shape[1]
    diag = np.diag(h).copy()
    dead = diag <= 0  # an input that was always 0 on the calibration data: its column is rounded alone
    h[dead, dead] = 1.0
    order = np.argsort(-np.diag(h), kind="stable")
    w, h = w[:, order], h[np.ix_(order, order)]
    h[np.diag_indices(n)] += damp * float(np.mean(np.diag(h)))
    try:
        inverse = np.linalg.inv(h)
        u = np.linalg.cholesky((inverse + inverse.T) / 2).T  # upper: H⁻¹ = Uᵀ U
    except np.linalg.LinAlgError:  # numerically singular even after damping: no compensation
        return np.clip(np.rint(matrix / scale[:, None]), -127, 127).astype(np.int8)
    s = scale.astype(np.float64)
    codes = np.zeros(w.shape, np.float64)
    for start in range(0, n, block):
        stop = min(start + block, n)
        part = w[:, start:stop].copy()
        errors = np.zeros_like(part)
        for j in range(stop - start):
            q = np.clip(np.rint(part[:, j] / s), -127, 127)
            codes[:, start + j] = q
            e = (part[:, j] - q * s) / u[start + j, start + j]
            part[:, j + 1:] -= np.outer(e, u[start + j, start + j + 1:stop])
            errors[:, j] = e
        w[:, stop:] -= errors @ u[start:stop, stop:]
    out = np.empty_like(codes)
    out[:, order] = codes
    return out.astype(np.int8)


def output_error(matrix: np.ndarray, codes: np.ndarray, scale: np.ndarray, hessian: np.ndarray) -> float:
    """tr(D H Dᵀ) with D = matrix - codes·scale: the squared output error summed over the rows of X."""
    d = matrix.astype(np.float64) - codes.astype(np.float64) * scale.astype(np.float64)[:, None]
    return float(np.einsum("ij,jk,ik->", d, np.asarray(hessian, np.float64), d))


__all__ = ["gptq", "gptq_supported", "layer_inputs", "as_matrix", "from_matrix", "output_error", "BLOCK", "DAMP"]
