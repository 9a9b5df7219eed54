"""Window helpers shared by the convolutions (:mod:`.conv`, :mod:`.conv_add`) and the pooling ops
(:mod:`.pooling`); not an op module: the name starts with ``_``.

The ``_win_*`` functions are kernel helpers (rows list them in ``helpers``; compiled modules paste
their source): ``SAME_*`` pads, output lengths and the padded input's windows, as per-tap views or
one strided view. :func:`_window_attrs` resolves strides, pads, dilations and auto_pad once, for
``attrs(node)``.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.ir.ops._util import choice, ints


# --- helpers the kernels call ---------------------------------------------------------------
def _win_same_pads(spatial, kernel, strides, dilations, upper):
    """auto_pad SAME_UPPER (``upper``) / SAME_LOWER: pads (begin..., end...) so out = ceil(in / stride)."""
    begin, end = [], []
    for i in range(len(kernel)):
        out = -(-spatial[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - spatial[i])
        small, big = total // 2, total - total // 2
        begin.append(small if upper else big)
        end.append(big if upper else small)
    return tuple(begin + end)


def _win_out(spatial, kernel, strides, pads, dilations, ceil_mode):
    """Output length per spatial axis (a ceil_mode window must start inside the input or left pad)."""
    n = len(kernel)
    out = []
    for i in range(n):
        steps = spatial[i] + pads[i] + pads[i + n] - dilations[i] * (kernel[i] - 1) - 1
        size = (-(-steps // strides[i]) if ceil_mode else steps // strides[i]) + 1
        if ceil_mode and (size - 1) * strides[i] >= spatial[i] + pads[i]:
            size -= 1
        out.append(size)
    return tuple(out)


def _win_padded(x, kernel, strides, pads, dilations, out, fill):
    """``x`` padded with ``fill`` so every window fits (extra end padding covers ceil_mode windows),
    contiguous; ``x`` itself when it needs no padding and is contiguous. (np.pad costs ~25x more
    per call on small inputs and copies even when nothing is padded.)"""
    n = len(kernel)
    lead = x.ndim - n
    begin, shape, inner = [], list(x.shape[:lead]), [slice(None)] * lead
    for i in range(n):
        size = x.shape[lead + i]
        need = (out[i] - 1) * strides[i] + dilations[i] * (kernel[i] - 1) + 1 - size - pads[i]
        begin.append(pads[i])
        shape.append(pads[i] + size + max(pads[i + n], need))
        inner.append(slice(pads[i], pads[i] + size))
    # which of the two exits a call site takes follows from its pads and the input's dims, and
    # helper copies are not given those dims: each exit is declared, for the sites that take the other
    if tuple(shape) == x.shape:  # fallback: no pad needed (zero pads, windows within the input)
        return np.ascontiguousarray(x)
    # fallback: a pad the windows need (nonzero pads, or ceil_mode windows past the input's end)
    padded = np.full(shape, fill, dtype=x.dtype)
    padded[tuple(inner)] = x
    return padded


def _win_taps(x, kernel, strides, pads, dilations, out, fill):
    """Per kernel tap, the strided (N, C, *out) view of ``x`` padded with ``fill``."""
    padded = _win_padded(x, kernel, strides, pads, dilations, out, fill)
    lead = (slice(None),) * (x.ndim - len(kernel))
    for tap in np.ndindex(*kernel):
        yield (
            tap,
            padded[
                lead
                + tuple(
                    slice(t * d, t * d + (o - 1) * s + 1, s)
                    for t, d, o, s in zip(tap, dilations, out, strides, strict=True)
                )
            ],
        )


def _win_view(x, kernel, strides, pads, dilations, out, fill):
    """Every window of ``x`` padded with ``fill`` as one read-only strided view, shaped
    (N, C, *out, *kernel) (what sliding_window_view and slicing give, at a fraction of the cost)."""
    padded = _win_padded(x, kernel, strides, pads, dilations, out, fill)
    n, st = len(kernel), padded.strides
    lead = x.ndim - n
    view = np.ndarray(
        x.shape[:lead] + tuple(out) + tuple(kernel),
        padded.dtype,
        padded,
        0,
        st[:lead]
        + tuple(st[lead + i] * strides[i] for i in range(n))
        + tuple(st[lead + i] * dilations[i] for i in range(n)),
    )
    view.flags.writeable = False
    return view


_WINDOW = (_win_same_pads, _win_out, _win_padded, _win_taps, _win_view)


# --- attributes -------------------------------------------------------------------------------
def _auto_pad(node) -> str:
    return choice(node, "auto_pad", "NOTSET", ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"))


def _window_attrs(node, rank: int | None) -> dict:
    """strides, pads, dilations, auto_pad: defaults filled when ``rank`` (spatial dims) is known,
    ``VALID`` as explicit zero pads."""
    auto_pad = _auto_pad(node)
    strides, pads, dilations = (tuple(ints(node, key)) for key in ("strides", "pads", "dilations"))
    if rank is not None:
        strides, dilations = strides or (1,) * rank, dilations or (1,) * rank
        pads = pads or (0,) * (2 * rank)
    if auto_pad == "VALID":
        pads, auto_pad = ((0,) * (2 * rank) if rank is not None else ()), "NOTSET"
    elif auto_pad != "NOTSET":
        pads = ()
    return {"strides": strides, "pads": pads, "dilations": dilations, "auto_pad": auto_pad}
