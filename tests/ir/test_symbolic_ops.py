"""Each shape op on symbolic dims, one small ONNX graph per case: the inferred type is the
expression the case names, and at two bindings the interpreter (which checks every value against
its bound type) and the compiled module (which writes the shape vectors as literals) match
onnxruntime."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.device_targets import build
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import interpreter

I64 = lambda name, *v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
SCALAR = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731


def _dim(name: str, axis: int):
    """Nodes putting x's dim ``axis`` in value ``name`` as a 1-element int64 vector, and their constant."""
    return ([helper.make_node("Shape", ["x"], [f"{name}_s"]),
             helper.make_node("Gather", [f"{name}_s", f"{name}_i"], [name], axis=0)], [I64(f"{name}_i", axis)])


def cases():
    n_nodes, n_inits = _dim("n", 0)
    s_nodes, s_inits = _dim("s", 1)
    shape_nodes = n_nodes + s_nodes
    shape_inits = n_inits + s_inits
    return {
        # Reshape to [n*s, 4] computed from the shape (ViT/Swin attention)
        "reshape_computed": ([*shape_nodes, helper.make_node("Mul", ["n", "s"], ["ns"]),
                              helper.make_node("Concat", ["ns", "four"], ["t"], axis=0),
                              helper.make_node("Reshape", ["x", "t"], ["y"])],
                             [*shape_inits, I64("four", 4)], ["N", "S", 4], ("N*S", 4), [(2, 3, 4), (3, 5, 4)]),
        # Range over the batch (transformers' arange(batch))
        "range_batch": ([*n_nodes, helper.make_node("Squeeze", ["n", "ax0"], ["n0"]),
                         helper.make_node("Range", ["zero", "n0", "one"], ["y"])],
                        [*n_inits, I64("ax0", 0), SCALAR("zero", 0), SCALAR("one", 1)], ["N", 4], ("N",), [(2, 4), (5, 4)]),
        # Range with a step over seq-1: ceil((S-1)/2)
        "range_step": ([*s_nodes, helper.make_node("Squeeze", ["s", "ax0"], ["s0"]),
                        helper.make_node("Sub", ["s0", "one"], ["s1"]),
                        helper.make_node("Range", ["zero", "s1", "two"], ["y"])],
                       [*s_inits, I64("ax0", 0), SCALAR("zero", 0), SCALAR("one", 1), SCALAR("two", 2)],
                       ["N", "S"], ("(S//2)",), [(1, 6), (2, 7)]),
        # Expand to [n, s, 4] (ViT's class token)
        "expand_computed": ([*shape_nodes, helper.make_node("Concat", ["n", "s", "four"], ["t"], axis=0),
                             helper.make_node("Expand", ["c", "t"], ["y"])],
                            [*shape_inits, I64("four", 4), numpy_helper.from_array(np.ones((1, 1, 4), np.float32), "c")],
                            ["N", "S"], ("N", "S", 4), [(1, 2), (3, 4)]),
        # ConstantOfShape [s, s] (a mask built in forward)
        "constant_of_shape": ([*s_nodes, helper.make_node("Concat", ["s", "s"], ["t"], axis=0),
                               helper.make_node("ConstantOfShape", ["t"], ["y"])],
                              s_inits, ["N", "S"], ("S", "S"), [(1, 2), (2, 5)]),
        # Concat along a symbolic axis (a class token before the sequence)
        "concat_symbolic_axis": ([helper.make_node("Concat", ["x", "x"], ["y"], axis=1)], [], ["N", "S"],
                                 ("N", "2*S"), [(1, 2), (2, 3)]),
        # Slice a 16-row table to the sequence (GPT-2's buffer), then x[:, 1:-1]
        "slice_to_seq": ([*s_nodes, helper.make_node("Slice", ["table", "z", "s", "z"], ["rows"]),
                          helper.make_node("Slice", ["rows", "one_v", "minus1", "z"], ["y"])],
                         [*s_inits, I64("z", 0), I64("one_v", 1), I64("minus1", -1),
                          numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(16, 2), "table")],
                         ["N", "S"], ("S-2", 2), [(1, 3), (2, 9)]),
        # Pad to a multiple of 4 computed with Mod (Swin)
        "pad_to_multiple": ([*s_nodes, helper.make_node("Mod", ["s", "four"], ["r"]),
                             helper.make_node("Sub", ["four", "r"], ["p0"]), helper.make_node("Mod", ["p0", "four"], ["p"]),
                             helper.make_node("Concat", ["z", "z", "z", "p"], ["pads"], axis=0),
                             helper.make_node("Pad", ["x", "pads"], ["y"])],
                            [*s_inits, I64("four", 4), I64("z", 0)], ["N", "S"], ("N", "S+(3*S%4)"),
                            [(1, 4), (2, 6)]),
        # Tile the batch twice, Split a symbolic axis in halves (the run checks it is even), Size
        "tile": ([helper.make_node("Tile", ["x", "reps"], ["y"])], [I64("reps", 2, 1)], ["N", "S"], ("2*N", "S"),
                 [(1, 2), (3, 2)]),
        "split_halves": ([helper.make_node("Split", ["x"], ["y", "w"], axis=1)], [], ["N", "S"], ("N", "(S//2)"),
                         [(1, 4), (2, 6)]),
        "size": ([helper.make_node("Size", ["x"], ["sz"]), helper.make_node("Reshape", ["sz", "one_v"], ["szv"]),
                  helper.make_node("Reshape", ["x", "szv"], ["y"])], [I64("one_v", 1)], ["N", "S"], ("N*S",),
                 [(2, 3), (1, 1)]),
        # a patch convolution over a symbolic image side
        "conv_symbolic_side": ([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[4, 4], strides=[4, 4])],
                               [numpy_helper.from_array(np.ones((2, 1, 4, 4), np.float32), "w")],
                               ["N", 1, "H", "W"], ("N", 2, "(H//4)", "(W//4)"), [(1, 1, 8, 12), (2, 1, 9, 16)]),
        # Max/Min/Div/Equal/Where on shape vectors: torch's expand(-1) pattern
        "where_equal": ([*shape_nodes, helper.make_node("Concat", ["n", "minus1"], ["t"], axis=0),
                         helper.make_node("Equal", ["t", "minus1x2"], ["eq"]),
                         helper.make_node("Where", ["eq", "ones", "t"], ["t2"]),
                         helper.make_node("Div", ["t2", "one_one"], ["t3"]),
                         helper.make_node("Max", ["t3", "one_one"], ["t4"]),
                         helper.make_node("Expand", ["c", "t4"], ["y"])],
                        [*shape_inits, I64("minus1", -1), I64("minus1x2", -1, -1), I64("ones", 1, 1),
                         I64("one_one", 1, 1), numpy_helper.from_array(np.ones((1, 3), np.float32), "c")],
                        ["N", "S"], ("N", 3), [(1, 2), (4, 2)]),
    }


CASES = cases()


@pytest.mark.parametrize("name", list(CASES))
def test_symbolic_inference_matches_onnxruntime(name, tmp_path):
    nodes, inits, shape, out_shape, sizes = CASES[name]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.INT64 if name == "range_batch" or name == "range_step"
                                      else TensorProto.FLOAT, [None] * len(out_shape))
    graph = helper.make_graph(nodes, name, [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    data = model.SerializeToString()
    g = load_model(data)
    assert g.types["y"].shape == out_shape
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    compiled = build(SimpleNamespace(graph=g, payload_digest=hashlib.sha256(data).hexdigest()), "x86-64",
                     cache_dir=tmp_path)
    for size in sizes:
        feeds = {"x": np.random.default_rng(0).standard_normal(size).astype(np.float32)}
        want = session.run(None, feeds)[0]
        for how, got in (("interpreter", interpreter.run(g, feeds)["y"]), ("compiled", compiled.run(feeds)["y"])):
            assert got.shape == want.shape, f"{name} {how} at {size}"
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} {how} at {size}")
