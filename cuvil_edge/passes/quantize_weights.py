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

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from cuvil_edge.errors import CuvilError, PassError
from cuvil_edge.ir import ops
from cuvil_edge.ir.graph import Graph, Node
from cuvil_edge.ir.ops._activation import _activate

#: Columns rounded before the lazy update of the rest (GPTQ's block size: the same result, fewer passes).
BLOCK = 128
#: Fraction of the mean diagonal added to H (GPTQ's percdamp).
DAMP = 0.01


def gptq_supported(node: Node, weight: np.ndarray) -> bool:
    """Whether :func:`layer_inputs` can im2col this op's input (else the weight gets RTN)."""
    if node.op_type.endswith("Conv"):
        return (
            weight.ndim == 4 and node.attr("group", 1) == 1 and node.attr("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")
        )
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
    cols = [
        x[:, :, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]  # each [b, c, ho, wo]
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


def gptq(
    matrix: np.ndarray, hessian: np.ndarray, scale: np.ndarray, damp: float = DAMP, block: int = BLOCK
) -> np.ndarray:
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
            part[:, j + 1 :] -= np.outer(e, u[start + j, start + j + 1 : stop])
            errors[:, j] = e
        w[:, stop:] -= errors @ u[start:stop, stop:]
    out = np.empty_like(codes)
    out[:, order] = codes
    return out.astype(np.int8)


def output_error(matrix: np.ndarray, codes: np.ndarray, scale: np.ndarray, hessian: np.ndarray) -> float:
    """tr(D H Dᵀ) with D = matrix - codes·scale: the squared output error summed over the rows of X."""
    d = matrix.astype(np.float64) - codes.astype(np.float64) * scale.astype(np.float64)[:, None]
    return float(np.einsum("ij,jk,ik->", d, np.asarray(hessian, np.float64), d))


# --- the sequential walk: GPTQ on the quantized prefix's inputs, and bias correction ---------------
@dataclass(frozen=True)
class Site:
    """One quantized op of the QDQ graph: its weight ``w`` (the DequantizeLinear output), the int8
    codes and scale initializers, the channel axis, its fp32 input ``x`` and dequantized input ``dx``."""

    w: str
    codes: str
    scale: str
    axis: int
    x: str
    dx: str


#: With SHRINK, bias correction shrinks each channel's shift towards 0 by its squared standard error
#: over the samples (positive-part James-Stein): a Gemm's shift is a mean over as few values as there
#: are samples, mostly noise where the error has no systematic part. Off: on ResNet-18 it changed
#: nothing measurable (bench/results/quantization.md, probes).
SHRINK = False
#: Ops whose float32 bias (input 2, one value per output channel, output channels on axis 1) the
#: bias correction shifts.
BIASED = ("Conv", "CuvilFusedConv", "Gemm", "CuvilFusedGemm")


def correctable_bias(graph: Graph, node: Node) -> str | None:
    """The name of ``node``'s bias initializer when bias correction may shift it: a float32 constant
    of one value per output channel that no other node reads (Gemm only with beta = 1)."""
    if node.op_type not in BIASED or len(node.inputs) < 3 or not node.inputs[2]:
        return None
    b = node.inputs[2]
    bias, weight = graph.initializers.get(b), graph.initializers.get(node.inputs[1])
    if (
        bias is None
        or weight is None
        or bias.dtype != np.float32
        or b in {v.name for v in graph.inputs}
        or float(node.attr("beta", 1.0)) != 1.0
        or sum(b in n.inputs for n in graph.nodes) != 1
    ):
        return None
    channels = weight.shape[0] if node.op_type.endswith("Conv") or node.attr("transB", 0) else weight.shape[1]
    return b if bias.size == channels and bias.ndim >= 1 and bias.shape[-1] == channels else None


def sequential(
    graph: Graph,
    qgraph: Graph,
    sites: Mapping[str, Site],
    batches: list[dict[str, np.ndarray]],
    *,
    weights: bool = True,
    from_quantized: bool = True,
    bias_correction: bool = True,
) -> dict[str, np.ndarray]:
    """The initializers of ``qgraph`` (the QDQ form of ``graph``, weights rounded to nearest) with
    the weights of ``sites`` (node name -> Site) rounded by GPTQ (with ``weights``) and, with
    ``bias_correction``, their biases shifted, going through the ops in order on the calibration
    ``batches``:

    * ``from_quantized``: each layer's Hessian XᵀX comes from the inputs the already-quantized prefix
      gives it (as GPTQ's reference implementation does), so a layer compensates for the error of
      the layers before it; otherwise from the float32 graph's inputs.
    * ``bias_correction`` (Nagel et al., 2019, "Data-free quantization through weight equalization and
      bias correction", the empirical variant): the mean over the samples and positions of fp32 output
      minus quantized output (before a fused activation), per output channel, is added to the float32
      bias, so the quantized layer's output is unbiased where the next layers read it.
    """
    inits_f, inits_q = graph.initializers, dict(qgraph.initializers)
    fp_nodes = {node.name: node for node in graph.nodes}
    quantized_path = (weights and from_quantized) or bias_correction
    last_q: dict[str, int] = {}
    last_f: dict[str, int] = {}
    for i, node in enumerate(qgraph.nodes):
        for name in node.inputs:
            last_q[name] = i
        for name in fp_nodes[node.name].inputs if node.name in fp_nodes else ():
            last_f[name] = i
    producer = {node.outputs[0]: node for node in qgraph.nodes if node.outputs}
    env_f = [dict(feeds) for feeds in batches]
    env_q = [dict(feeds) for feeds in batches] if quantized_path else []
    done: set[str] = set()
    for i, node in enumerate(qgraph.nodes):
        site = sites.get(node.name)
        if site is not None and site.w not in done:
            done.add(site.w)
            weight = inits_f[site.w]
            if weights and gptq_supported(node, weight):
                envs, x = (env_q, site.dx) if from_quantized else (env_f, site.x)
                inits_q[site.codes] = _gptq_on(node, weight, site, [env[x] for env in envs], inits_q[site.scale])
                for env in env_q:  # the weight as the node reads it, from the new codes
                    env[site.w] = _run(producer[site.w], env, inits_q)[0]
        fp = fp_nodes.get(node.name)
        bias = correctable_bias(graph, fp) if site is not None and bias_correction and fp is not None else None
        if bias is not None and fp is not None:
            _correct(fp, node, bias, env_f, env_q, inits_f, inits_q)
        else:
            for env in env_q:
                env.update(zip(node.outputs, _run(node, env, inits_q), strict=False))
            if fp is not None:
                for env in env_f:
                    env.update(zip(fp.outputs, _run(fp, env, inits_f), strict=False))
        for envs, last in ((env_q, last_q), (env_f, last_f)):
            for env in envs:
                for name in [n for n in env if last.get(n, -1) <= i]:
                    del env[name]
    return inits_q


def _gptq_on(node: Node, weight: np.ndarray, site: Site, xs: list[np.ndarray], scale: np.ndarray) -> np.ndarray:
    k = int(np.prod(weight.shape)) // weight.shape[site.axis]
    hessian = np.zeros((k, k))
    for x in xs:
        rows = layer_inputs(node, np.asarray(x, np.float32), k)
        if not np.isfinite(rows).all():
            raise PassError(
                f"activation {site.x!r} becomes NaN or Inf on the calibration samples; fix the model or "
                "the samples before quantizing"
            )
        hessian += rows.T @ rows
    codes = gptq(as_matrix(weight, site.axis), hessian, scale)
    return from_matrix(codes, weight.shape, site.axis)


def _correct(fp: Node, node: Node, bias: str, env_f, env_q, inits_f, inits_q) -> None:
    """Run the op on both paths, add the mean fp32 - quantized difference of its pre-activation output
    per channel to the quantized path's bias, and leave both paths' outputs in their environments."""
    act = str(node.attr("activation", "none"))
    plain = [
        Node(
            n.name,
            n.op_type,
            n.inputs,
            n.outputs,
            {**n.attrs, "activation": "none"} if "activation" in n.attrs else n.attrs,
            n.version,
        )
        for n in (fp, node)
    ]
    want = [_run(plain[0], env, inits_f)[0] for env in env_f]
    got = [_run(plain[1], env, inits_q)[0] for env in env_q]
    # per sample, the mean error of each channel over the positions: [samples, channels]
    per = np.concatenate(
        [
            (a - b).astype(np.float64).reshape(a.shape[0], a.shape[1], -1).mean(axis=2)
            for a, b in zip(want, got, strict=True)
        ]
    )
    shift = per.mean(axis=0)
    if SHRINK and len(per) > 1:  # keep a channel's shift only as far as it stands out of its sampling noise
        noise = per.var(axis=0, ddof=1) / len(per)
        shift *= np.clip(1.0 - noise / np.maximum(shift * shift, 1e-300), 0.0, 1.0)
    inits_q[bias] = (inits_q[bias] + shift.reshape(inits_q[bias].shape)).astype(np.float32)
    channel = (1, -1) + (1,) * (want[0].ndim - 2)
    for envs, ys, add in ((env_f, want, None), (env_q, got, shift.astype(np.float32).reshape(channel))):
        for env, y in zip(envs, ys, strict=True):
            env[node.outputs[0]] = _activate(y if add is None else y + add, act)


def _run(node: Node, env: dict[str, np.ndarray], inits: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return list(
            ops.get(node.op_type, node.describe()).kernel(
                node, *[(env[n] if n in env else inits[n]) if n else None for n in node.inputs]
            )
        )
    except CuvilError:
        raise
    except Exception as e:  # a kernel fault names the node, as in the interpreter
        raise PassError(f"quantization: {node.describe()} failed: {type(e).__name__}: {e}") from e


__all__ = [
    "gptq",
    "gptq_supported",
    "layer_inputs",
    "as_matrix",
    "from_matrix",
    "output_error",
    "sequential",
    "correctable_bias",
    "Site",
    "BLOCK",
    "DAMP",
]
