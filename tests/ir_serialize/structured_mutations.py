"""Mutations of a payload header's ``graph`` object and its initializers (for fuzz_structured.py).

Each mutator takes ``(rng, graph_dict, arrays)``, edits them in place and returns a short
description.  Values favour edges: int64 limits and just past them, float extremes,
inf/nan tensors, empty and long lists, mixed types, huge-but-legal dims.  The graph
dict stays JSON-encodable (finite floats only); arrays stay numpy arrays of a
supported dtype so the container can be re-encoded with a consistent tensor table.
"""

from __future__ import annotations

import math
import random
import warnings
from typing import Any, Callable

import numpy as np

from cuvil_edge.ir import ops

EDGE_INTS = [0, -1, 1, 2, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -2**63, -2**63 - 1, 10**18]
EDGE_FLOATS = [1e308, -1e308, 1e-320, -0.0, 65504.0, 1e5, 0.0, 0.5, -1.5, 2.0**63]
ARRAY_FLOATS = [math.inf, -math.inf, math.nan, 1e308, -1e308, 65504.0, 1e5, 1e-320, -0.0, 2.0**63, -2.0**63,
                2.0**31, 2.0**31 - 1, -1.0, 0.0, 0.5]
DTYPES = ["bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "uint16", "uint32", "uint64"]
BAD_DTYPES = ["bfloat16", "string", "complex64", "", "float", "int4"]
STRINGS = ["", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "nearest", "linear", "cubic", "half_pixel",
           "align_corners", "asymmetric", "round_prefer_floor", "floor", "ceil", "tanh", "none", "batch",
           "x" * 300, "\u00e9\u00df", "relu", "stretch", "not_larger"]
SYMBOLS = ["batch", "N", "seq", "dyn_0"]
ATTR_NAMES = sorted(set("""
axis kernel_shape axes auto_pad starts start pads output_dtype mode group ends end ceil_mode alpha value to
strides storage_order perm output_shape num_outputs keepdims epsilon dilations beta antialias allowzero
training_mode stash_type split spatial precision output_padding noop_with_empty_axes nearest_mode momentum
min max keep_aspect_ratio_policy extrapolation_value exclude_outside cubic_coeff_a count_include_pad
coordinate_transformation_mode block_size approximate activation transA transB seed fmod
""".split()))
#: Largest initializer (elements) a mutation creates.
MAX_NEW_ELEMENTS = 4096


def op_names() -> list[str]:
    return sorted(ops.registry())


# --- value generators ----------------------------------------------------------


def edge_int(rng: random.Random) -> int:
    return rng.choice(EDGE_INTS) if rng.random() < 0.6 else rng.randint(-3, 8)


def edge_float(rng: random.Random) -> float:
    return rng.choice(EDGE_FLOATS) if rng.random() < 0.7 else rng.uniform(-4, 4)


def int_list(rng: random.Random) -> list[int]:
    r = rng.random()
    if r < 0.1:
        return []
    if r < 0.15:
        return [rng.randint(-2, 3) for _ in range(rng.choice((65, 300)))]
    return [edge_int(rng) for _ in range(rng.randint(1, 6))]


def tweak_list(rng: random.Random, value: list) -> list:
    out = list(value)
    r = rng.random()
    if out and r < 0.4:
        out[rng.randrange(len(out))] = edge_int(rng) if rng.random() < 0.8 else edge_float(rng)
    elif r < 0.55:
        out.append(edge_int(rng))
    elif out and r < 0.7:
        out.pop(rng.randrange(len(out)))
    elif out and r < 0.8:
        out.append(out[rng.randrange(len(out))])
    elif r < 0.9:
        out = [-v if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in out]
    else:
        out = out * rng.randint(2, 4)
    return out


def inline_tensor(rng: random.Random) -> dict[str, Any]:
    dtype = rng.choice(DTYPES) if rng.random() < 0.9 else rng.choice(BAD_DTYPES)
    shape = rng.choice([[], [1], [0], [2], [3], [2, 2], [1, 1, 1], [2**31 - 1], [0, 2**31 - 1]])
    n = math.prod(shape) if math.prod(shape) <= 16 else rng.randint(0, 3)
    if rng.random() < 0.1:
        n += rng.choice((-1, 1))
    pick = edge_float if dtype.startswith("float") and rng.random() < 0.7 else edge_int
    values: list[Any] = [pick(rng) for _ in range(max(0, n))]
    if values and rng.random() < 0.05:
        values[0] = rng.choice([True, "1", None, [1]])
    return {"tensor": {"dtype": dtype, "shape": shape, "values": values}}


def json_value(rng: random.Random, current: Any = None) -> Any:
    """A new attribute value: edge scalars, lists, mixed lists, dicts, inline tensors."""
    if isinstance(current, list) and current and rng.random() < 0.5:
        return tweak_list(rng, current)
    if isinstance(current, dict) and "tensor" in current and rng.random() < 0.5:
        return tweak_tensor(rng, current)
    r = rng.random()
    if r < 0.25:
        return edge_int(rng)
    if r < 0.35:
        return edge_float(rng)
    if r < 0.45:
        return rng.choice(STRINGS)
    if r < 0.48:
        return rng.choice([True, False])
    if r < 0.75:
        return int_list(rng)
    if r < 0.8:
        return [edge_float(rng) for _ in range(rng.randint(0, 4))]
    if r < 0.85:
        return [edge_int(rng), rng.choice(STRINGS), edge_float(rng), True][: rng.randint(1, 4)]
    if r < 0.88:
        return rng.choice([[[1, 2]], {"a": 1}, None, [None], {"tensor": 1}, {"tensor": {}}])
    if r < 0.92:
        return [rng.choice(STRINGS) for _ in range(rng.randint(1, 3))]
    return inline_tensor(rng)


def tweak_tensor(rng: random.Random, attr: dict) -> dict:
    t = dict(attr["tensor"]) if isinstance(attr.get("tensor"), dict) else {}
    key = rng.choice(["dtype", "shape", "values"])
    if key == "dtype":
        t["dtype"] = rng.choice(DTYPES + BAD_DTYPES[:2])
    elif key == "shape":
        t["shape"] = tweak_list(rng, t.get("shape", []))
    else:
        values = t.get("values", [])
        t["values"] = tweak_list(rng, values) if rng.random() < 0.6 else [edge_float(rng)] * max(1, len(values))
    return {"tensor": t}


def edge_array(rng: random.Random, dtype: str, n: int) -> np.ndarray:
    """``n`` values of ``dtype`` mixing edge values (limits, inf, nan, huge) and small ones."""
    np_dtype = np.dtype(dtype)
    if np_dtype.kind == "b":
        return np.array([rng.random() < 0.5 for _ in range(n)], dtype=bool)
    if np_dtype.kind == "f":
        raw = [rng.choice(ARRAY_FLOATS) if rng.random() < 0.5 else rng.uniform(-3, 3) for _ in range(n)]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            return np.array(raw, dtype=np.float64).astype(np_dtype)
    info = np.iinfo(np_dtype)
    edges = [info.min, info.max, 0, 1, -1, 2, 2**31 - 1, 2**31, 2**62, -2**31]
    raw = [rng.choice(edges) if rng.random() < 0.5 else rng.randint(-3, 8) for _ in range(n)]
    return np.array([min(max(v, info.min), info.max) for v in raw], dtype=np_dtype)


def shape_vector(rng: random.Random) -> np.ndarray:
    """A 1-D int64/int32 vector that a shape input would take: huge dims, -1, 0, int64 limits."""
    dtype = rng.choice(["int64", "int64", "int64", "int32"])
    choices = [2**31 - 1, 2**31 - 1, 2**31, 2**40, 2**62, 2**63 - 1, -2**63, -1, -2, 0, 1, 2, 3, 4, 10**6]
    values = [rng.choice(choices) for _ in range(rng.randint(0, 6))]
    if dtype == "int32":
        values = [min(max(v, -2**31), 2**31 - 1) for v in values]
    return np.array(values, dtype=dtype)


def new_shape(rng: random.Random, shape: tuple[int, ...]) -> tuple[int, ...]:
    r = rng.random()
    if r < 0.2:
        return ()
    if r < 0.35:
        return (0,) + tuple(shape)
    if r < 0.5 and shape:
        return tuple(shape[:-1])
    if r < 0.65:
        return tuple(shape) + (1,)
    if r < 0.75:
        return (0, 2**31 - 1)
    if r < 0.85:
        return (rng.randint(1, 6),)
    return tuple(rng.randint(0, 4) for _ in range(rng.randint(1, 4)))


def random_array(rng: random.Random, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape)
    if n > MAX_NEW_ELEMENTS:
        shape, n = (MAX_NEW_ELEMENTS,), MAX_NEW_ELEMENTS
    return edge_array(rng, dtype, n).reshape(shape)


# --- graph mutators ------------------------------------------------------------


def _node(rng, g) -> dict | None:
    nodes = g.get("nodes") or []
    return rng.choice(nodes) if nodes else None


def value_names(g: dict, arrays: dict) -> list[str]:
    names = [v["name"] for v in g.get("inputs", [])] + list(arrays)
    for n in g.get("nodes", []):
        names += [o for o in n.get("outputs", []) if o]
    return names


def m_attr_set(rng, g, arrays):
    n = _node(rng, g)
    if n is None:
        return "attr: no nodes"
    keys = list(n["attrs"])
    key = rng.choice(keys) if keys and rng.random() < 0.65 else rng.choice(ATTR_NAMES)
    n["attrs"][key] = json_value(rng, n["attrs"].get(key))
    return f"attr {n['name']}.{key}={str(n['attrs'][key])[:60]}"


def m_attr_delete(rng, g, arrays):
    n = _node(rng, g)
    if n is None or not n["attrs"]:
        return "attr-del: none"
    key = rng.choice(list(n["attrs"]))
    del n["attrs"][key]
    return f"del attr {n['name']}.{key}"


def m_op(rng, g, arrays):
    n = _node(rng, g)
    if n is None:
        return "op: no nodes"
    n["op"] = rng.choice(op_names()) if rng.random() < 0.97 else rng.choice(["Loop", "", "relu", "Relu\u0000"])
    return f"op {n['name']}={n['op']}"


def m_version(rng, g, arrays):
    n = _node(rng, g)
    target = n if n is not None and rng.random() < 0.85 else g
    key = "version" if target is n else "opset"
    target[key] = rng.choice([1, 5, 6, 7, 9, 10, 11, 12, 13, 14, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                              0, -1, 999, 1000, 1001, 2**63])
    return f"{key}={target[key]}"


def m_node_io(rng, g, arrays):
    n = _node(rng, g)
    if n is None:
        return "io: no nodes"
    key = "inputs" if rng.random() < 0.75 else "outputs"
    names, pool = n[key], value_names(g, arrays)
    r = rng.random()
    if names and r < 0.45:
        names[rng.randrange(len(names))] = rng.choice(pool) if rng.random() < 0.85 else rng.choice(["", "nope"])
    elif r < 0.7:
        names.append(rng.choice(pool) if key == "inputs" else f"{n['name']}_extra")
    elif names and r < 0.9:
        names.pop(rng.randrange(len(names)))
    else:
        names.extend([""] * rng.randint(1, 3))
    return f"{key} {n['name']}={names}"[:120]


def m_graph_value(rng, g, arrays):
    key = "inputs" if rng.random() < 0.75 else "outputs"
    values = g.get(key) or []
    if not values:
        return f"{key}: none"
    v = rng.choice(values)
    shape, r = v["shape"], rng.random()
    if r < 0.2:
        v["dtype"] = rng.choice(DTYPES) if rng.random() < 0.9 else rng.choice(BAD_DTYPES)
    elif shape and r < 0.55:
        shape[rng.randrange(len(shape))] = (edge_int(rng) if rng.random() < 0.5
                                            else rng.choice([2**31 - 1, 2**31 - 1, 2**30, 65536, 0, 1]))
    elif shape and r < 0.65:
        shape[rng.randrange(len(shape))] = rng.choice(SYMBOLS + ["", 1.5, True])
    elif r < 0.8:
        shape.insert(rng.randint(0, len(shape)), rng.choice([1, 0, 2**31 - 1, "batch", 3]))
    elif shape and r < 0.92:
        shape.pop(rng.randrange(len(shape)))
    else:
        v["shape"] = [] if rng.random() < 0.6 else [1] * 65
    return f"{key} {v['name']} {v['dtype']}{v['shape']}"[:120]


def m_node_dup_or_drop(rng, g, arrays):
    n = _node(rng, g)
    if n is None:
        return "dup: no nodes"
    if rng.random() < 0.3 and len(g["nodes"]) > 1:
        g["nodes"].remove(n)
        return f"drop node {n['name']}"
    clone = {**n, "name": n["name"] + "_dup", "inputs": list(n["inputs"]), "attrs": dict(n["attrs"]),
             "outputs": [o + "_dup" if o else o for o in n["outputs"]]}
    clone["op"] = rng.choice(op_names())
    pool = value_names(g, arrays)
    clone["inputs"] = [rng.choice(pool) for _ in range(rng.randint(1, 4))] if rng.random() < 0.5 else clone["inputs"]
    g["nodes"].append(clone)
    return f"new node {clone['name']} {clone['op']}{clone['inputs']}"[:120]


def m_init_values(rng, g, arrays):
    if not arrays:
        return "init: none"
    name = rng.choice(sorted(arrays))
    a = np.array(arrays[name])
    if a.size:
        flat = a.reshape(-1)
        edge = edge_array(rng, a.dtype.name, flat.size if rng.random() < 0.3 else 1)
        if edge.size == flat.size:
            flat[:] = edge
        else:
            flat[rng.randrange(flat.size)] = edge[0]
    arrays[name] = a
    return f"init {name} values"


def m_init_dtype(rng, g, arrays):
    if not arrays:
        return "init: none"
    name = rng.choice(sorted(arrays))
    dtype = rng.choice(DTYPES)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        a = arrays[name].astype(dtype)
    if dtype == "bool" or rng.random() < 0.3:
        a = edge_array(rng, dtype, a.size).reshape(a.shape)
    arrays[name] = a
    return f"init {name} as {dtype}"


def m_init_shape(rng, g, arrays):
    if not arrays:
        return "init: none"
    name = rng.choice(sorted(arrays))
    a = arrays[name]
    shape = new_shape(rng, a.shape)
    arrays[name] = a.reshape(shape) if math.prod(shape) == a.size else random_array(rng, a.dtype.name, shape)
    return f"init {name} shape {arrays[name].shape}"


def m_init_shape_vector(rng, g, arrays):
    """Replace an integer initializer (or wire a new one into a node) with a huge-dims shape vector."""
    ints = [k for k, a in arrays.items() if a.dtype.kind in "iu"]
    vec = shape_vector(rng)
    if ints and rng.random() < 0.5:
        name = rng.choice(sorted(ints))
        arrays[name] = vec
        return f"init {name}={vec.tolist()}"
    return _wire(rng, g, arrays, vec, shape_input=True)


def m_wire_new(rng, g, arrays):
    """A new initializer (edge values, any dtype and small shape) as some node's input
    (half the time one of the inputs whose value inference reads)."""
    dtype = rng.choice(DTYPES if rng.random() < 0.5 else ["int64", "int64", "float32", "float32", "float16"])
    shape = rng.choice([(), (1,), (2,), (3,), (4,), (0,), (1, 1), (2, 3), (8,)])
    return _wire(rng, g, arrays, random_array(rng, dtype, shape), shape_input=rng.random() < 0.5)


def _const_inputs(op: str) -> tuple[int, ...]:
    module = ops.registry().get(op)
    return tuple(getattr(module, "CONST_INPUTS", ())) if module is not None else ()


def _wire(rng, g, arrays, array: np.ndarray, shape_input: bool = False) -> str:
    """``array`` as a new initializer feeding some node; ``shape_input`` prefers an input whose
    value the op's inference reads (CONST_INPUTS: shapes, axes, pads, scales, sizes...)."""
    nodes = g.get("nodes") or []
    if not nodes:
        return "wire: no nodes"
    wanting = [n for n in nodes if _const_inputs(n["op"])]
    n = rng.choice(wanting if shape_input and wanting and rng.random() < 0.8 else nodes)
    name = f"fz_{len(arrays)}_{rng.randrange(1000)}"
    arrays[name] = array
    ins = n["inputs"]
    consts = _const_inputs(n["op"])
    index = rng.choice(consts) if shape_input and consts and rng.random() < 0.8 else rng.randint(0, len(ins))
    while len(ins) < index:
        ins.append("")
    if index == len(ins):
        ins.append(name)
    else:
        ins[index] = name
    return f"wire {n['name']}.in{index}={array.dtype}{list(array.shape)}{array.reshape(-1)[:6].tolist()}"[:160]


def m_misc(rng, g, arrays):
    r = rng.random()
    if r < 0.3 and arrays:
        name = rng.choice(sorted(arrays))
        arrays[f"{name}_2"] = arrays.pop(name)
        return f"rename init {name}"
    if r < 0.5:
        g["outputs"] = list(reversed(g.get("outputs", [])))[: rng.randint(0, 2)]
        return "outputs reordered/cut"
    if r < 0.7 and g.get("nodes"):
        rng.shuffle(g["nodes"])
        return "nodes shuffled"
    if r < 0.85:
        g["name"] = rng.choice(STRINGS)
        return "graph name"
    for n in g.get("nodes", []):
        n["version"] = rng.choice([1, 7, 11, 13, 18, 21])
    return "all versions"


MUTATORS: list[tuple[float, Callable]] = [
    (18, m_attr_set), (3, m_attr_delete), (7, m_op), (6, m_version), (8, m_node_io), (9, m_graph_value),
    (3, m_node_dup_or_drop), (10, m_init_values), (6, m_init_dtype), (6, m_init_shape), (12, m_init_shape_vector),
    (8, m_wire_new), (2, m_misc),
]


def mutate(rng: random.Random, g: dict, arrays: dict) -> list[str]:
    """Apply 1-4 weighted mutations; the descriptions of what changed."""
    weights = [w for w, _ in MUTATORS]
    count = rng.choices((1, 2, 3, 4), (50, 30, 12, 8))[0]
    return [rng.choices([m for _, m in MUTATORS], weights)[0](rng, g, arrays) for _ in range(count)]
