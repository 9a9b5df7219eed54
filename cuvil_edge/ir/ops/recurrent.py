"""Recurrent layers, one table row each (the op contract: ``_contract.py``): RNN, GRU and LSTM
(forward, reverse, bidirectional; ``layout`` 0 or 1; ``sequence_lens``; initial states; the
activation list with its alphas and betas; ``clip``; GRU's ``linear_before_reset``; LSTM's
peepholes and ``input_forget``).

The input projection of every step is one matmul; the recurrence loops over time. Steps past a
row's ``sequence_lens`` leave its state unchanged and output zeros; the reverse direction runs
each row from its own last valid step. float16 is computed in float32 and rounded once.
"""

from __future__ import annotations

import numpy as np

from cuvil_edge.errors import ShapeInferenceError, UnsupportedAttributeError
from cuvil_edge.ir.graph import TensorType
from cuvil_edge.ir.ops._contract import OpDef
from cuvil_edge.ir.ops._elementwise import FLOATS, TRANSCENDENTAL, want
from cuvil_edge.ir.ops._util import FLOAT, FLOATS as FLOAT_LIST, INT, STR, choice, need

#: activation -> (uses alpha, default alpha, uses beta, default beta)
ACTIVATIONS = {
    "relu": (False, 0.0, False, 0.0),
    "tanh": (False, 0.0, False, 0.0),
    "sigmoid": (False, 0.0, False, 0.0),
    "affine": (True, 1.0, True, 0.0),
    "leakyrelu": (True, 0.01, False, 0.0),
    "thresholdedrelu": (True, 1.0, False, 0.0),
    "scaledtanh": (True, 1.0, True, 1.0),
    "hardsigmoid": (True, 0.2, True, 0.5),
    "elu": (True, 1.0, False, 0.0),
    "softsign": (False, 0.0, False, 0.0),
    "softplus": (False, 0.0, False, 0.0),
}
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULTS = {"RNN": ("tanh",), "GRU": ("sigmoid", "tanh"), "LSTM": ("sigmoid", "tanh", "tanh")}


def _rnn_act(name, v, alpha, beta):
    """One of ONNX's recurrent activations."""
    if name == "sigmoid":
        e = np.exp(-np.abs(v))
        return np.where(v >= 0, 1 / (1 + e), e / (1 + e))
    if name == "tanh":
        return np.tanh(v)
    if name == "relu":
        return np.maximum(v, 0)
    if name == "affine":
        return alpha * v + beta
    if name == "leakyrelu":
        return np.where(v >= 0, v, alpha * v)
    if name == "thresholdedrelu":
        return np.where(v > alpha, v, 0)
    if name == "scaledtanh":
        return alpha * np.tanh(beta * v)
    if name == "hardsigmoid":
        return np.clip(alpha * v + beta, 0, 1)
    if name == "elu":
        return np.where(v >= 0, v, alpha * np.expm1(np.minimum(v, 0)))
    if name == "softsign":
        return v / (1 + np.abs(v))
    return np.logaddexp(0, v)  # softplus


def _rnn_steps(x, sequence_lens, layout):
    """The input as [steps, batch, features] (float16 widened), each row's length, steps, batch,
    the compute dtype's scalar type and the row indices."""
    xs = np.swapaxes(x, 0, 1) if layout else x
    xs = xs.astype(np.float32) if xs.dtype == np.float16 else xs
    steps, batch = xs.shape[0], xs.shape[1]
    lens = np.full(batch, steps, np.int64) if sequence_lens is None else sequence_lens.astype(np.int64).reshape(-1)
    return xs, lens, steps, batch, xs.dtype.type, np.arange(batch)


def _rnn_order(lens, steps, reverse):
    """Time index per (step, row): forward, or each row's first ``lens`` steps reversed."""
    t = np.arange(steps).reshape(-1, 1)
    return (
        np.where(t < lens.reshape(1, -1), lens.reshape(1, -1) - 1 - t, t)
        if reverse
        else np.broadcast_to(t, (steps, lens.shape[0]))
    )


def _rnn_state(state, direction, layout, batch, hidden, dtype):
    if state is None:
        return np.zeros((batch, hidden), dtype)
    return (state[:, direction] if layout else state[direction]).astype(dtype)


def _rnn_outputs(ys, states, layout, dtype, outputs):
    y = np.stack(ys, axis=1)  # [steps, directions, batch, hidden]
    finals = [np.stack(s, axis=0) for s in states]  # [directions, batch, hidden] each
    if layout:
        y = np.transpose(y, (2, 0, 1, 3))
        finals = [np.swapaxes(f, 0, 1) for f in finals]
    results = tuple(v.astype(dtype) for v in (y, *finals))
    return results[0] if outputs == 1 else results[:outputs]


def k_rnn(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    *,
    hidden,
    directions,
    layout,
    activations,
    alphas,
    betas,
    clip,
    outputs,
):
    xs, lens, steps, batch, t, rows = _rnn_steps(x, sequence_lens, layout)
    ys, hs = [], []
    for d, direction in enumerate(directions):
        order = _rnn_order(lens, steps, direction == "reverse")
        bias = 0 if b is None else (b[d, :hidden] + b[d, hidden:]).astype(t)
        projected = np.matmul(xs[order, rows], w[d].astype(t).T) + bias
        h = _rnn_state(initial_h, d, layout, batch, hidden, t)
        y = np.zeros((steps, batch, hidden), t)
        for s in range(steps):
            pre = projected[s] + np.matmul(h, r[d].astype(t).T)
            if clip is not None:
                pre = np.clip(pre, -clip, clip)
            new = _rnn_act(activations[d], pre, alphas[d], betas[d])
            live = (s < lens).reshape(-1, 1)
            h = np.where(live, new, h)
            y[s] = np.where(live, new, t(0))
        ys.append(y[order, rows])
        hs.append(h)
    return _rnn_outputs(ys, [hs], layout, x.dtype, outputs)


def k_gru(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    *,
    hidden,
    directions,
    layout,
    activations,
    alphas,
    betas,
    clip,
    linear_before_reset,
    outputs,
):
    xs, lens, steps, batch, t, rows = _rnn_steps(x, sequence_lens, layout)
    ys, hs = [], []
    for d, direction in enumerate(directions):
        f, g = activations[2 * d], activations[2 * d + 1]
        order = _rnn_order(lens, steps, direction == "reverse")
        wb = np.zeros(3 * hidden, t) if b is None else b[d, : 3 * hidden].astype(t)
        rb = np.zeros(3 * hidden, t) if b is None else b[d, 3 * hidden :].astype(t)
        projected = np.matmul(xs[order, rows], w[d].astype(t).T) + wb  # gates z, r, h
        rz, rr, rh = (r[d, k * hidden : (k + 1) * hidden].astype(t) for k in range(3))
        h = _rnn_state(initial_h, d, layout, batch, hidden, t)
        y = np.zeros((steps, batch, hidden), t)
        for s in range(steps):
            p = projected[s]
            z_pre = p[:, :hidden] + np.matmul(h, rz.T) + rb[:hidden]
            r_pre = p[:, hidden : 2 * hidden] + np.matmul(h, rr.T) + rb[hidden : 2 * hidden]
            if clip is not None:
                z_pre, r_pre = np.clip(z_pre, -clip, clip), np.clip(r_pre, -clip, clip)
            z = _rnn_act(f, z_pre, alphas[2 * d], betas[2 * d])
            reset = _rnn_act(f, r_pre, alphas[2 * d], betas[2 * d])
            if linear_before_reset:
                h_pre = p[:, 2 * hidden :] + reset * (np.matmul(h, rh.T) + rb[2 * hidden :])
            else:
                h_pre = p[:, 2 * hidden :] + np.matmul(reset * h, rh.T) + rb[2 * hidden :]
            if clip is not None:
                h_pre = np.clip(h_pre, -clip, clip)
            candidate = _rnn_act(g, h_pre, alphas[2 * d + 1], betas[2 * d + 1])
            new = (1 - z) * candidate + z * h
            live = (s < lens).reshape(-1, 1)
            h = np.where(live, new, h)
            y[s] = np.where(live, new, t(0))
        ys.append(y[order, rows])
        hs.append(h)
    return _rnn_outputs(ys, [hs], layout, x.dtype, outputs)


def k_lstm(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    p=None,
    *,
    hidden,
    directions,
    layout,
    activations,
    alphas,
    betas,
    clip,
    input_forget,
    outputs,
):
    xs, lens, steps, batch, t, rows = _rnn_steps(x, sequence_lens, layout)
    ys, hs, cs = [], [], []
    for d, direction in enumerate(directions):
        f, g, act_h = activations[3 * d], activations[3 * d + 1], activations[3 * d + 2]
        af, ag, ah = alphas[3 * d : 3 * d + 3]
        bf, bg, bh = betas[3 * d : 3 * d + 3]
        order = _rnn_order(lens, steps, direction == "reverse")
        bias = 0 if b is None else (b[d, : 4 * hidden] + b[d, 4 * hidden :]).astype(t)
        projected = np.matmul(xs[order, rows], w[d].astype(t).T) + bias  # gates i, o, f, c
        peep = np.zeros(3 * hidden, t) if p is None else p[d].astype(t)  # i, o, f
        h = _rnn_state(initial_h, d, layout, batch, hidden, t)
        c = _rnn_state(initial_c, d, layout, batch, hidden, t)
        y = np.zeros((steps, batch, hidden), t)
        for s in range(steps):
            gates = projected[s] + np.matmul(h, r[d].astype(t).T)
            if clip is not None:
                gates = np.clip(gates, -clip, clip)
            i_pre = gates[:, :hidden] + peep[:hidden] * c
            f_pre = gates[:, 2 * hidden : 3 * hidden] + peep[2 * hidden :] * c
            if clip is not None:
                i_pre, f_pre = np.clip(i_pre, -clip, clip), np.clip(f_pre, -clip, clip)
            i_gate = _rnn_act(f, i_pre, af, bf)
            f_gate = 1 - i_gate if input_forget else _rnn_act(f, f_pre, af, bf)
            cell = f_gate * c + i_gate * _rnn_act(g, gates[:, 3 * hidden :], ag, bg)
            o_pre = gates[:, hidden : 2 * hidden] + peep[hidden : 2 * hidden] * cell
            if clip is not None:
                o_pre = np.clip(o_pre, -clip, clip)
            new = _rnn_act(f, o_pre, af, bf) * _rnn_act(act_h, cell, ah, bh)
            live = (s < lens).reshape(-1, 1)
            h, c = np.where(live, new, h), np.where(live, cell, c)
            y[s] = np.where(live, new, t(0))
        ys.append(y[order, rows])
        hs.append(h)
        cs.append(c)
    return _rnn_outputs(ys, [hs, cs], layout, x.dtype, outputs)


# --- inference and attributes -----------------------------------------------------------------
def _recurrent_attrs(node):
    op = node.op_type
    hidden = node.attr("hidden_size")
    if not isinstance(hidden, int) or hidden < 1:
        raise UnsupportedAttributeError(f"{node.describe()} needs a positive hidden_size attribute, got {hidden!r}")
    direction = choice(node, "direction", "forward", ("forward", "reverse", "bidirectional"))
    directions = ("forward", "reverse") if direction == "bidirectional" else (direction,)
    names = node.attr("activations")
    names = (
        [n.decode() if isinstance(n, bytes) else str(n) for n in names]
        if names
        else list(DEFAULTS[op]) * len(directions)
    )
    names = [n.lower() for n in names]
    per = len(DEFAULTS[op])
    if len(directions) == 1 and len(names) == 2 * per and names[:per] == names[per:]:
        # both directions' list on a one-direction op: what RNN's schema default itself is
        # (Tanh, Tanh), written out by exporters that copy defaults; both halves agree, so take one
        names = names[:per]
    if len(names) != per * len(directions) or any(n not in ACTIVATIONS for n in names):
        raise UnsupportedAttributeError(
            f"{node.describe()}: activations {names} must name {len(DEFAULTS[op])} per "
            f"direction from {', '.join(sorted(ACTIVATIONS))}"
        )
    given_alpha, given_beta = list(node.attr("activation_alpha") or []), list(node.attr("activation_beta") or [])
    alphas, betas = [], []
    for n in names:
        uses_alpha, alpha, uses_beta, beta = ACTIVATIONS[n]
        alphas.append(float(given_alpha.pop(0)) if uses_alpha and given_alpha else alpha)
        betas.append(float(given_beta.pop(0)) if uses_beta and given_beta else beta)
    clip = node.attr("clip")
    attrs = {
        "hidden": hidden,
        "directions": directions,
        "layout": int(node.attr("layout", 0)) if node.version >= 14 else 0,
        "activations": tuple(names),
        "alphas": tuple(alphas),
        "betas": tuple(betas),
        "clip": None if clip is None else float(clip),
    }
    if op == "GRU":
        attrs["linear_before_reset"] = int(node.attr("linear_before_reset", 0))
    if op == "LSTM":
        attrs["input_forget"] = int(node.attr("input_forget", 0))
    attrs["outputs"] = len(node.outputs)
    return attrs


def _infer_recurrent(node, inputs):
    op = node.op_type
    need(node, inputs, 3, {"RNN": 3, "GRU": 3, "LSTM": 5}[op])
    x, w, r = inputs[:3]
    want(node, x, ((7, FLOATS),))
    attrs = _recurrent_attrs(node)
    hidden, dirs, gates = attrs["hidden"], len(attrs["directions"]), GATES[op]
    if x.rank != 3:
        raise ShapeInferenceError(f"{node.describe()}: X must be 3-D, got {x}")
    steps, batch = (x.shape[1], x.shape[0]) if attrs["layout"] else (x.shape[0], x.shape[1])
    expected = {"W": (w, (dirs, gates * hidden, x.shape[2])), "R": (r, (dirs, gates * hidden, hidden))}
    extra = list(inputs[3:]) + [None] * 5
    if extra[0] is not None:
        expected["B"] = (extra[0], (dirs, 2 * gates * hidden))
    state = (batch, dirs, hidden) if attrs["layout"] else (dirs, batch, hidden)
    if extra[2] is not None:
        expected["initial_h"] = (extra[2], state)
    if op == "LSTM" and extra[3] is not None:
        expected["initial_c"] = (extra[3], state)
    if op == "LSTM" and extra[4] is not None:
        expected["P"] = (extra[4], (dirs, 3 * hidden))
    for name, (t, shape) in expected.items():
        if (
            t.dtype != x.dtype
            or t.rank != len(shape)
            or any(isinstance(a, int) and isinstance(e, int) and a != e for a, e in zip(t.shape, shape, strict=True))
        ):
            raise ShapeInferenceError(f"{node.describe()}: {name} must be {x.dtype}{list(shape)}, got {t}")
    if extra[1] is not None and (extra[1].dtype != "int32" or extra[1].rank != 1):
        raise ShapeInferenceError(f"{node.describe()}: sequence_lens must be an int32 vector, got {extra[1]}")
    y = (batch, steps, dirs, hidden) if attrs["layout"] else (steps, dirs, batch, hidden)
    final = TensorType(x.dtype, state)
    return [TensorType(x.dtype, y), final] + ([final] if op == "LSTM" else [])


def _recurrent_flops(node, inputs, outputs):
    x = inputs[0]
    attrs = _recurrent_attrs(node)
    gates, hidden = GATES[node.op_type], attrs["hidden"]
    features = x.shape[2] if isinstance(x.shape[2], int) else 1
    per_step = 2 * gates * hidden * (features + hidden) + (TRANSCENDENTAL + 4) * gates * hidden
    return x.numel() // max(features, 1) * len(attrs["directions"]) * per_step


def _recurrent_macs(node, inputs, outputs):
    x = inputs[0]
    attrs = _recurrent_attrs(node)
    features = x.shape[2] if isinstance(x.shape[2], int) else 1
    return (
        x.numel()
        // max(features, 1)
        * len(attrs["directions"])
        * GATES[node.op_type]
        * attrs["hidden"]
        * (features + attrs["hidden"])
    )


ATTRS = {
    "activation_alpha": FLOAT_LIST,
    "activation_beta": FLOAT_LIST,
    "clip": FLOAT,
    "direction": STR,
    "hidden_size": INT,
    "layout": INT,
    "linear_before_reset": INT,
    "input_forget": INT,
}
HELPERS = (_rnn_act, _rnn_steps, _rnn_order, _rnn_state, _rnn_outputs)

OPS = (
    OpDef(
        "RNN",
        (7, 14, 22),
        infer=_infer_recurrent,
        fn=k_rnn,
        flops=_recurrent_flops,
        attrs=_recurrent_attrs,
        helpers=HELPERS,
        ATTRS=ATTRS,
        macs=_recurrent_macs,
    ),
    OpDef(
        "GRU",
        (7, 14, 22),
        infer=_infer_recurrent,
        fn=k_gru,
        flops=_recurrent_flops,
        attrs=_recurrent_attrs,
        helpers=HELPERS,
        ATTRS=ATTRS,
        macs=_recurrent_macs,
    ),
    OpDef(
        "LSTM",
        (7, 14, 22),
        infer=_infer_recurrent,
        fn=k_lstm,
        flops=_recurrent_flops,
        attrs=_recurrent_attrs,
        helpers=HELPERS,
        ATTRS=ATTRS,
        macs=_recurrent_macs,
    ),
)
