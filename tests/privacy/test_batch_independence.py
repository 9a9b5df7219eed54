"""Graphs that mix samples across the batch axis are refused before DP-SGD training; row-wise
graphs (the demo CNN, torch-exported MLP / ResNet block / U-Net / transformer block) pass.

Each refusal case is one attack on per-sample clipping. The empirical check is the trusted
reference for the static table: every graph refused statically is also caught when probed,
and every graph that passes statically passes the probe."""

from __future__ import annotations

import io
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import onnx.parser
import pytest

from cuvil_edge.errors import BatchMixingError, PrivacyError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.privacy import _batch_rules, batch_independence
from cuvil_edge.privacy.batch_independence import batch_axes, check_batch_independent, probe_batch_independence

I64 = np.int64
F32 = np.float32


def graph(*nodes, x=("batch", 4), inits=None, opset=13, outputs=("y",), inputs=None, dtype="float32"):
    """A graph of ``(name, op, inputs, outputs[, attrs])`` nodes over input ``x`` (or ``inputs``)."""
    values = inputs or [Value("x", TensorType(dtype, tuple(x)))]
    built = [Node(n[0], n[1], tuple(n[2]), tuple(n[3]), n[4] if len(n) > 4 else {}, version=opset) for n in nodes]
    return build_graph("probe", values, list(outputs), built, inits or {}, opset)


def onnx_text(text: str):
    return load_model(onnx.parser.parse_model(text).SerializeToString())


def batch_size_reshape():
    """[batch, 4] -> [2, batch, 2]: the batch symbol survives but rows interleave."""
    return graph(("shape", "Shape", ["x"], ["s"]), ("first", "Gather", ["s", "zero"], ["b"]),
                 ("target", "Concat", ["two", "b", "two"], ["t"], {"axis": 0}),
                 ("interleave", "Reshape", ["x", "t"], ["y"]),
                 inits={"zero": np.array([0], I64), "two": np.array([2], I64)})


# name -> (builder, the node the message must name)
REFUSED = {
    "softmax_axis0": (lambda: graph(("sm", "Softmax", ["x"], ["y"], {"axis": 0})), "'sm' (Softmax axis=0"),
    "softmax_axis0_opset11": (lambda: onnx_text("""
        <ir_version: 6, opset_import: ["" : 11]> g (float[batch, 4] x) => (float[batch, 4] y)
        { y = Softmax <axis = 0> (x) }"""), "(Softmax axis=0, opset 11)"),
    "logsoftmax_flattened_opset11": (lambda: graph(("lsm", "LogSoftmax", ["x"], ["y"], {"axis": -2}), opset=11),
                                     "'lsm' (LogSoftmax axis=-2, opset 11)"),
    "softmax_after_transpose": (lambda: graph(("t", "Transpose", ["x"], ["xt"], {"perm": [1, 0]}),
                                              ("sm", "Softmax", ["xt"], ["y"], {"axis": -1})), "'sm'"),
    "reshape_to_one_row": (lambda: graph(("r", "Reshape", ["x", "s"], ["y"]), x=(4, 4),
                                         inits={"s": np.array([1, -1], I64)}), "'r' (Reshape"),
    "reshape_interleaves_batch": (batch_size_reshape, "'interleave' (Reshape"),
    "flatten_axis0": (lambda: graph(("f", "Flatten", ["x"], ["y"], {"axis": 0}), x=(4, 3)), "'f' (Flatten axis=0"),
    "batchnorm_training": (lambda: graph(("bn", "BatchNormalization", ["x", "one", "zero", "zero", "one"], ["y"],
                                          {"training_mode": 1}), x=("batch", 3, 2), opset=15,
                                         inits={"one": np.ones(3, F32), "zero": np.zeros(3, F32)}),
                           "'bn' (BatchNormalization"),
    "reduce_mean_axis0": (lambda: graph(("m", "ReduceMean", ["x"], ["y"], {"axes": [0]})), "'m' (ReduceMean axes=[0]"),
    "reduce_mean_axis0_input": (lambda: graph(("m", "ReduceMean", ["x", "a"], ["y"]), opset=18,
                                              inits={"a": np.array([-2], I64)}), "'m' (ReduceMean, opset 18"),
    "reduce_mean_all": (lambda: graph(("m", "ReduceMean", ["x"], ["y"], {"keepdims": 0})), "'m' (ReduceMean"),
    "reduce_sum_all": (lambda: graph(("s", "ReduceSum", ["x"], ["y"])), "'s' (ReduceSum"),
    "concat_axis0": (lambda: graph(("c", "Concat", ["x", "x"], ["y"], {"axis": 0}), x=(4, 3)), "'c' (Concat axis=0"),
    "gather_rows": (lambda: graph(("g", "Gather", ["x", "i"], ["y"], {"axis": 0}), inits={"i": np.array([0], I64)}),
                    "'g' (Gather axis=0"),
    "gather_indices_from_samples": (lambda: graph(("ids", "Cast", ["x"], ["i"], {"to": 7}),
                                                  ("g", "Gather", ["x", "i"], ["y"], {"axis": 1})), "'g' (Gather"),
    "slice_rows": (lambda: graph(("s", "Slice", ["x", "b", "e", "a"], ["y"]), x=(4, 3),
                                 inits={"b": np.array([1], I64), "e": np.array([4], I64), "a": np.array([0], I64)}),
                   "'s' (Slice"),
    "slice_reverses_rows": (lambda: graph(("s", "Slice", ["x", "b", "e", "a", "st"], ["y"]), x=(4, 3),
                                          inits={"b": np.array([-1], I64), "e": np.array([-9], I64),
                                                 "a": np.array([0], I64), "st": np.array([-1], I64)}), "'s' (Slice"),
    "split_rows": (lambda: graph(("sp", "Split", ["x"], ["y", "z"], {"axis": 0}), x=(4, 3), outputs=("y", "z")),
                   "'sp' (Split axis=0"),
    "pad_rows": (lambda: graph(("p", "Pad", ["x", "pads"], ["y"], {"mode": "edge"}), x=(4, 3),
                               inits={"pads": np.array([1, 0, 0, 0], I64)}), "'p' (Pad mode=edge"),
    "matmul_gram": (lambda: graph(("t", "Transpose", ["x"], ["xt"], {"perm": [1, 0]}),
                                  ("mm", "MatMul", ["x", "xt"], ["y"])), "'mm' (MatMul"),
    "gemm_gram": (lambda: graph(("gm", "Gemm", ["x", "x"], ["y"], {"transB": 1})), "'gm' (Gemm transB=1"),
    "outer_sum": (lambda: graph(("t", "Transpose", ["x"], ["xt"]), ("add", "Add", ["x", "xt"], ["y"]),
                                x=("batch", 1)), "'add' (Add"),
    "divide_by_batch_size": (lambda: graph(("shape", "Shape", ["x"], ["s"]), ("n", "Gather", ["s", "zero"], ["b"]),
                                           ("f", "Cast", ["b"], ["bf"], {"to": 1}), ("div", "Div", ["x", "bf"], ["y"]),
                                           inits={"zero": np.array(0, I64)}), "'div' (Div"),
    "layernorm_over_batch": (lambda: graph(("ln", "LayerNormalization", ["x", "w"], ["y"], {"axis": 0}), opset=17,
                                           inits={"w": np.ones(4, F32)}), "'ln' (LayerNormalization axis=0"),
    "conv_kernels_from_samples": (lambda: graph(("conv", "Conv", ["x", "x"], ["y"]), x=(4, 1, 3, 3)),
                                  "'conv' (Conv"),
    "maxpool_indices": (lambda: graph(("mp", "MaxPool", ["x"], ["y", "idx"], {"kernel_shape": [2, 2]}),
                                      x=("batch", 1, 2, 2), opset=12, outputs=("y", "idx")), "'mp' (MaxPool"),
    "expand_sample_to_batch_width": (lambda: graph(
        ("shape", "Shape", ["x"], ["s"]), ("first", "Gather", ["s", "zero"], ["b"]),
        ("target", "Concat", ["b", "b"], ["t"], {"axis": 0}), ("wide", "Expand", ["x", "t"], ["w"]),
        ("sum", "ReduceSum", ["w", "one"], ["y"]), x=("batch", 1),
        inits={"zero": np.array([0], I64), "one": np.array([1], I64)}), "'wide' (Expand"),
    "output_is_batch_size": (lambda: graph(("shape", "Shape", ["x"], ["s"]), ("f", "Cast", ["s"], ["y"], {"to": 1})),
                             "'f' (Cast"),
    # allow-list rows where the batch moved off axis 0 into what they normalise over
    "instancenorm_over_batch": (lambda: graph(("t", "Transpose", ["x"], ["xt"], {"perm": [1, 2, 0]}),
                                              ("in", "InstanceNormalization", ["xt", "s", "b"], ["y"]), x=(4, 3, 2),
                                              inits={"s": np.ones(2, F32), "b": np.zeros(2, F32)}),
                                "'in' (InstanceNormalization"),
    "groupnorm_groups_of_samples": (lambda: graph(("t", "Transpose", ["x"], ["xt"], {"perm": [1, 0, 2]}),
                                                  ("gn", "GroupNormalization", ["xt", "s", "b"], ["y"], {"num_groups": 2}),
                                                  x=(4, 3, 2), opset=21,
                                                  inits={"s": np.ones(4, F32), "b": np.zeros(4, F32)}),
                                    "'gn' (GroupNormalization"),
    "resize_rows": (lambda: graph(("rs", "Resize", ["x", "", "sc"], ["y"], {"mode": "linear"}), x=(4, 1, 2),
                                  inits={"sc": np.array([2, 1, 1], F32)}), "'rs' (Resize"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_mixing_graph_is_refused_naming_the_node(name):
    build, node = REFUSED[name]
    g = build()
    with pytest.raises(BatchMixingError) as caught:
        batch_axes(g)
    message = str(caught.value)
    assert node in message and "DP-SGD" in message
    with pytest.raises(BatchMixingError, match="DP-SGD"):
        check_batch_independent(g)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_empirical_check_alone_catches_every_refused_graph(name):
    """The interpreter is the reference: each statically refused graph really mixes samples."""
    g = REFUSED[name][0]()
    with pytest.raises(BatchMixingError, match="output '(y|z|idx)'"):
        probe_batch_independence(g)


def test_softmax_message_says_what_to_do():
    with pytest.raises(BatchMixingError) as caught:
        check_batch_independent(REFUSED["softmax_axis0"][0]())
    assert "softmax over the class axis" in str(caught.value)
    assert isinstance(caught.value, PrivacyError)


def test_concat_of_a_sample_free_operand_is_refused_statically():
    """[batch, 4] joined to a constant [1, 2] runs only at batch 1 (the probe's batch run fails);
    the static check refuses it rather than guess how its rows line up."""
    g = graph(("c", "Concat", ["x", "k"], ["y"], {"axis": 1}), inits={"k": np.ones((1, 2), F32)})
    with pytest.raises(BatchMixingError, match="'c' .* holds no sample"):
        check_batch_independent(g)


def test_op_missing_from_the_allow_list_is_refused(monkeypatch):
    import dataclasses

    from cuvil_edge.ir import ops

    # Relu's rule is its OpDef's batch facet: without it, nothing says Relu keeps rows apart
    monkeypatch.setitem(ops.registry(), "Relu", dataclasses.replace(ops.get("Relu"), batch=None))
    with pytest.raises(BatchMixingError, match="op 'Relu' at node 'act' .* not known to keep samples independent"):
        check_batch_independent(graph(("act", "Relu", ["x"], ["y"])))


def test_naive_table_is_backed_by_the_probe(monkeypatch):
    """A table that wrongly calls Softmax row-wise lets axis=0 through; the probe still refuses it."""
    import dataclasses

    from cuvil_edge.ir import ops

    monkeypatch.setitem(ops.registry(), "Softmax", dataclasses.replace(ops.get("Softmax"), batch="same"))
    g = REFUSED["softmax_axis0"][0]()
    assert batch_axes(g)["y"] == 0
    with pytest.raises(BatchMixingError, match="output 'y' row 0 run alone differs"):
        check_batch_independent(g)


def test_static_batch_is_probed_by_replacing_one_row():
    g = graph(("sm", "Softmax", ["x"], ["y"], {"axis": 0}), x=(4, 3))
    with pytest.raises(BatchMixingError, match="output 'y' row 1 changes when only row 0 of the inputs changes"):
        probe_batch_independence(g)
    probe_batch_independence(graph(("sm", "Softmax", ["x"], ["y"], {"axis": 1}), x=(4, 3)))


def test_graph_without_batched_input_is_not_probed(monkeypatch):
    def fail(*_args):
        raise AssertionError("probed")

    monkeypatch.setattr(batch_independence.interpreter, "run", fail)
    check_batch_independent(graph(("sm", "Softmax", ["x"], ["y"], {"axis": 0}), x=(1, 4)))


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_axis_inputs": ["nope"]}, "names 'nope'"),
    ({"probe_rows": 1}, "probe_rows must be an int >= 2"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(PrivacyError, match=match):
        check_batch_independent(graph(("act", "Relu", ["x"], ["y"])), **kwargs)


def test_input_sharing_the_batch_dim_must_be_listed():
    two = [Value("x", TensorType("float32", ("batch", 4))), Value("m", TensorType("float32", ("batch", 4)))]
    with pytest.raises(PrivacyError, match="input 'm' .* not in batch_axis_inputs"):
        check_batch_independent(graph(("add", "Add", ["x", "m"], ["y"]), inputs=two), batch_axis_inputs=["x"])


# --- graphs that must pass ------------------------------------------------------------
def mlp_softmax():
    rng = np.random.default_rng(0)
    return graph(("fc1", "Gemm", ["x", "w1", "b1"], ["h"], {"transB": 1}), ("act", "Relu", ["h"], ["a"]),
                 ("fc2", "Gemm", ["a", "w2"], ["z"]), ("sm", "Softmax", ["z"], ["y"], {"axis": 1}),
                 inits={"w1": rng.standard_normal((3, 4)).astype(F32), "b1": rng.standard_normal(3).astype(F32),
                        "w2": rng.standard_normal((3, 2)).astype(F32)})


def class_token():
    """Expand a constant token to [batch, 1, 4] (via Shape/Gather/Concat) and join it to the samples."""
    return graph(("shape", "Shape", ["x"], ["s"]), ("first", "Gather", ["s", "zero"], ["b"]),
                 ("target", "Concat", ["b", "tail"], ["t"], {"axis": 0}), ("tok", "Expand", ["cls", "t"], ["c"]),
                 ("row", "Unsqueeze", ["x", "one"], ["u"]), ("cat", "Concat", ["c", "u"], ["y"], {"axis": 1}),
                 inits={"zero": np.array([0], I64), "one": np.array([1], I64), "tail": np.array([1, 4], I64),
                        "cls": np.arange(4, dtype=F32).reshape(1, 1, 4)})


PASSING = {
    "demo_cnn": lambda: load_model(digits_cnn_onnx(channels=4)),
    "mlp_softmax_axis1": mlp_softmax,
    "softmax_axis1_opset11": lambda: graph(("sm", "Softmax", ["x"], ["y"], {"axis": 1}), x=("batch", 3, 4), opset=11),
    "class_token_expand": class_token,
    "slice_opset1_without_axes": lambda: graph(("s", "Slice", ["x"], ["y"], {"starts": [0, 1],
                                                                          "ends": [2**63 - 1, 3]}), opset=1),
    "within_sample_attention": lambda: graph(("t", "Transpose", ["x"], ["xt"], {"perm": [0, 2, 1]}),
                                             ("mm", "MatMul", ["x", "xt"], ["s"]),
                                             ("sm", "Softmax", ["s"], ["y"], {"axis": -1}), x=("batch", 3, 4)),
    "embedding_lookup": lambda: graph(("emb", "Gather", ["table", "x"], ["y"]), x=("batch", 3), dtype="int64",
                                      inits={"table": np.arange(40, dtype=F32).reshape(10, 4)}),
    "per_sample_reduce_slice_pad": lambda: graph(
        ("m", "ReduceMean", ["x"], ["m1"], {"axes": [1], "keepdims": 0}), ("noop", "ReduceSum", ["x"], ["m2"],
                                                                          {"noop_with_empty_axes": 1}),
        ("s", "Slice", ["m2", "b", "e", "a"], ["m3"]), ("p", "Pad", ["m3", "pads"], ["m4"]),
        ("sq", "Unsqueeze", ["m1", "a"], ["m5"]), ("add", "Add", ["m4", "m5"], ["y"]), x=("batch", 4, 3),
        inits={"b": np.array([1], I64), "e": np.array([3], I64), "a": np.array([1], I64),
               "pads": np.array([0, 1, 0, 0, 0, 0], I64)}),
}


@pytest.mark.parametrize("name", sorted(PASSING))
def test_row_wise_graph_passes(name):
    g = PASSING[name]()
    check_batch_independent(g)
    assert all(batch_axes(g)[v.name] == 0 for v in g.outputs)


# --- torch-exported architectures (as tests/architectures exports them) ---------------------
torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "architectures"))
from torch_models import MLP, BasicBlock, EncoderBlock, SmallUNet, randomise_batchnorm  # noqa: E402


class Views(torch.nn.Module):
    """The ways torch code flattens a batch: view(size(0), -1), flatten(x, 1), reshape(-1, n), mean over
    per-sample axes, log_softmax(dim=-1)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.Linear(64, 3)

    def forward(self, x):
        h = self.conv(x)
        flat = h.view(h.size(0), -1) + torch.flatten(h, 1) + h.reshape(-1, 64)
        tokens = h.flatten(2).transpose(1, 2)
        return torch.softmax(self.fc(flat), dim=1) + tokens.mean((1, 2)).unsqueeze(1), \
            torch.log_softmax(h.mean((2, 3)), -1)


class BatchMean(torch.nn.Module):
    """Subtracts the batch mean: the classic leak."""

    def forward(self, x):
        return x - x.mean(0, keepdim=True)


TORCH = {
    "mlp": (lambda: MLP(features=8, hidden=16), (8,)),
    "resnet_blocks": (lambda: torch.nn.Sequential(BasicBlock(4, 8, 2), BasicBlock(8, 8, 1)), (4, 8, 8)),
    "unet": (lambda: SmallUNet(), (3, 16, 16)),
    "transformer": (lambda: EncoderBlock(), (6, 32)),
    "views": (Views, (2, 4, 4)),
}


def export(model, shape) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, *shape),), buffer, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return buffer.getvalue()


@pytest.mark.parametrize("name", sorted(TORCH))
def test_torch_exported_architecture_passes(name):
    torch.manual_seed(0)
    make, shape = TORCH[name]
    g = load_model(export(randomise_batchnorm(make()).eval(), shape))
    assert isinstance(g.inputs[0].type.shape[0], str), "batch must stay symbolic"
    check_batch_independent(g)


def test_torch_batch_mean_is_refused():
    g = load_model(export(BatchMean().eval(), (4,)))
    with pytest.raises(BatchMixingError, match=r"\(ReduceMean .*the batch axis 0"):
        check_batch_independent(g)


def test_demo_check_is_fast():
    g = load_model(digits_cnn_onnx())
    start = time.perf_counter()
    check_batch_independent(g)
    assert time.perf_counter() - start < 5.0


def test_check_imports_neither_torch_nor_onnx():
    code = ("import sys, cuvil_edge.privacy.batch_independence; "
            "sys.exit(sorted({'torch', 'onnx', 'opacus'} & set(sys.modules)) or 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
