"""Cost model and calibration: correctness only; timing is bench/bench_cost_model.py's."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.cli.main import main
from cuvil_edge.device_targets import load_target
from cuvil_edge.device_targets.cost_model import KIND_FACTORS, predict
from cuvil_edge.device_targets.spec import SPECS_DIR, TargetSpec, list_targets
from cuvil_edge.errors import BuildError, TargetSpecError, UnknownTargetError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir import cost

COST_FIELDS = ("call_overhead_us", "kernel_overhead_us", "numpy_call_us", "run_overhead_us", "gemm_efficiency",
               "gemm_half_dim", "memory_efficiency", "cache_mb", "cache_bandwidth_gbs", "native_gflops",
               "native_plane_us", "transcendental_ns", "row_ns", "transfer_bandwidth_gbs", "transfer_latency_us",
               "kernel_ns")


def small_cnn():
    """x[N, 3, 16, 16] -> Conv 3x3 (8, pad 1) -> Relu -> Conv 1x1 (4) -> GlobalAveragePool -> Flatten -> Gemm (2)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("w3", (8, 3, 3, 3)), ("w1", (4, 8, 1, 1)), ("g", (4, 2)))]
    nodes = [helper.make_node("Conv", ["x", "w3"], ["a"], name="conv3x3", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Conv", ["b", "w1"], ["c"], name="conv1x1", kernel_shape=[1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["d"], name="gap"),
             helper.make_node("Flatten", ["d"], ["e"], name="flatten"),
             helper.make_node("Gemm", ["e", "g"], ["y"], name="gemm")]
    graph = helper.make_graph(nodes, "small_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                 ["N", 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], inits)
    return load_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


@pytest.fixture(scope="module")
def graph():
    return small_cnn()


@pytest.mark.parametrize("target", ["x86-64", "rpi4", "jetson-orin-nano", "ascend-310"])
@pytest.mark.parametrize("batch", [1, 5])
def test_total_is_the_sum_of_the_nodes(graph, target, batch):
    p = predict(graph, target, batch=batch)
    assert [n.node for n in p.nodes] == [n.name for n in graph.nodes]
    assert p.seconds == pytest.approx(sum(n.seconds for n in p.nodes) + p.run_overhead_s + p.transfer_s, rel=1e-12)
    for n in p.nodes:
        assert n.seconds == pytest.approx(n.overhead_s + max(n.compute_s, n.memory_s), rel=0.5) and n.seconds > 0
        assert n.bound in ("compute", "memory", "overhead")
    assert p.peak_memory_bytes > graph.parameter_bytes()


@pytest.mark.parametrize("batch", [1, 4, 16])
def test_flops_match_ir_cost(graph, batch):
    p = predict(graph, "x86-64", batch=batch)
    assert {n.node: n.flops for n in p.nodes} == cost.node_flops(graph, {"N": batch})
    assert p.flops == cost.total_flops(graph, {"N": batch})


def test_static_batch_target_runs_chunks(graph):
    p = predict(graph, "ascend-310", batch=10)  # static batch 4: three chunks
    assert p.chunks == 3
    assert p.flops == 3 * cost.total_flops(graph, {"N": 4})


def test_im2col_scratch_only_where_the_build_does_im2col(graph):
    numpy_only = load_target("x86-64").model_copy(update={"native_kernels": False})
    nodes = {n.node: n for n in predict(graph, numpy_only, batch=2).nodes}
    conv3, conv1 = nodes["conv3x3"], nodes["conv1x1"]
    assert conv3.kernel == "conv im2col" and conv1.kernel == "conv 1x1 gemm"
    im2col = 2 * 3 * 9 * 16 * 16 * 4  # n x c x taps x out pixels, float32
    assert conv3.scratch_bytes >= im2col
    assert conv1.scratch_bytes < im2col // 8  # a 1x1 conv is one matmul over x: no column copy
    assert conv3.bytes_read == (2 * 3 * 16 * 16 + 8 * 3 * 9) * 4 and conv3.bytes_written == 2 * 8 * 16 * 16 * 4
    assert nodes["flatten"].bytes_read == nodes["flatten"].bytes_written == 0  # a view
    low_numpy = load_target("rpi4").model_copy(update={"native_kernels": False})
    low = {n.node: n for n in predict(graph, low_numpy, batch=2).nodes}["conv3x3"]  # 2 GiB: im2col in row blocks
    assert low.kernel == "conv im2col blocks" and 0 < low.scratch_bytes < conv3.scratch_bytes


def test_gemm_shapes_follow_the_kernel(graph):
    nodes = {n.node: n for n in predict(graph, "x86-64", batch=3).nodes}
    assert nodes["conv3x3"].gemm == ((8, 27, 256, 3),)
    assert nodes["conv1x1"].gemm == ((4, 8, 256, 3),)
    assert nodes["gemm"].gemm == ((3, 4, 2, 1),)
    assert nodes["relu"].gemm == ()


def test_accelerator_target_adds_transfer_time_and_cpu_target_does_not(graph):
    npu, cpu = predict(graph, "ascend-310", batch=4), predict(graph, "x86-64", batch=4)
    assert cpu.transfer_s == 0 and cpu.transfer_bytes == 0
    assert npu.transfer_bytes == (4 * 3 * 16 * 16 + 4 * 2) * 4
    spec = load_target("ascend-310")
    assert npu.transfer_s == pytest.approx(npu.transfer_bytes / (spec.transfer_bandwidth_gbs * 1e9)
                                           + 2 * spec.transfer_latency_us * 1e-6)
    gpu = predict(graph, "jetson-orin-nano", batch=4)
    assert gpu.transfer_s > 0


@pytest.mark.parametrize("target", ["x86-64", "rpi4", "ascend-310"])
def test_more_batch_predicts_more_time(graph, target):
    times = [predict(graph, target, batch=b).seconds for b in (1, 8, 64)]
    assert times[0] < times[1] < times[2]


def test_slower_device_predicts_more_time(graph):
    assert predict(graph, "rpi4", batch=8).seconds > predict(graph, "x86-64", batch=8).seconds


def test_fp16_build_moves_half_the_activation_bytes(graph):
    fp32, fp16 = predict(graph, "jetson-orin-nano", batch=2), predict(graph, "jetson-orin-nano", batch=2,
                                                                       precision="fp16")
    assert fp16.nodes[1].bytes_read * 2 == fp32.nodes[1].bytes_read  # the Relu


@pytest.mark.parametrize("target, batch, error", [
    ("no-such-board", 1, UnknownTargetError),
    ("x86-64", 0, BuildError),
    ("x86-64", -3, BuildError),
    ("x86-64", True, BuildError),
    ("x86-64", 2.0, BuildError),
])
def test_bad_input_raises_typed_errors(graph, target, batch, error):
    with pytest.raises(error):
        predict(graph, target, batch=batch)


def test_unsupported_precision_is_a_target_error(graph):
    with pytest.raises(Exception, match="precision") as info:
        predict(graph, "rpi4", precision="fp16")
    assert type(info.value).__name__ == "TargetError"


@pytest.mark.parametrize("name", list_targets())
def test_shipped_specs_set_the_cost_fields_and_old_specs_stay_valid(name, tmp_path):
    data = yaml.safe_load((SPECS_DIR / f"{name}.yaml").read_text())
    assert {"call_overhead_us", "gemm_efficiency", "memory_efficiency"} <= set(data)
    old = {k: v for k, v in data.items() if k not in COST_FIELDS}  # a spec written before the cost model
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(old))
    spec = load_target(name, specs_dir=tmp_path)
    assert spec.call_overhead_us == TargetSpec.model_fields["call_overhead_us"].default
    assert predict(small_cnn(), spec).seconds > 0


def test_accelerator_specs_cite_a_bus():
    for name in list_targets():
        spec = load_target(name)
        if spec.accelerator != "none":
            assert spec.transfer_bandwidth_gbs and spec.transfer_latency_us > 0


def test_kernel_overhead_falls_back_to_scaled_call_overhead(graph):
    spec = load_target("x86-64").model_copy(update={"native_kernels": False})  # the numpy im2col path
    node = {n.node: n for n in predict(graph, spec).nodes}["conv3x3"]
    assert node.overhead_s == pytest.approx(spec.call_overhead_us * KIND_FACTORS["conv im2col"] * 1e-6)
    custom = spec.model_copy(update={"kernel_overhead_us": {"conv im2col": 1000.0}})
    assert {n.node: n for n in predict(graph, custom).nodes}["conv3x3"].overhead_s == pytest.approx(1e-3)


@pytest.mark.parametrize("field, value", [("gemm_efficiency", 1.5), ("call_overhead_us", 0), ("memory_efficiency", 0),
                                          ("kernel_overhead_us", {"gemm": -1.0}), ("transfer_bandwidth_gbs", -2.0),
                                          ("kernel_ns", {"gemm_flop": -1.0})])
def test_invalid_cost_fields_are_rejected(tmp_path, field, value):
    data = yaml.safe_load((SPECS_DIR / "x86-64.yaml").read_text())
    data[field] = value
    (tmp_path / "x86-64.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(TargetSpecError, match=field):
        load_target("x86-64", specs_dir=tmp_path)


def test_calibrate_command_writes_a_spec_load_target_accepts(tmp_path, capsys):
    out = tmp_path / "specs" / "host.yaml"
    assert main(["calibrate", "--quick", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "OpenBLAS environment" in printed and str(out.name) in printed
    text = out.read_text()
    assert text.startswith("# host: measured by `cuvil-edge calibrate --base x86-64`")
    spec = load_target("host", specs_dir=out.parent)
    base = load_target("x86-64")
    assert spec.arch == base.arch and spec.dtypes == base.dtypes and spec.peak_gflops["float32"] > 0
    assert spec.kernel_overhead_us and all(v >= 0 for v in spec.kernel_overhead_us.values())
    from cuvil_edge.device_targets.cost_kernels import DEPTHWISE_KEYS, GEMM_KEYS, MAX_POOL_KEYS, SOFTMAX_TAIL_KEYS
    from cuvil_edge.device_targets.cost_model import NUMPY_PAD, WINDOW_TAP
    assert set(GEMM_KEYS) | {"gather", "gather_strided", "fresh_byte", "reduce_element"} <= set(spec.kernel_ns)
    assert set(DEPTHWISE_KEYS) <= set(spec.kernel_ns) or not spec.native_kernels
    assert {"gemm_batch_call", "gemv_element", "gemv_call"} <= set(spec.kernel_ns)
    assert set(MAX_POOL_KEYS) <= set(spec.kernel_ns) or not spec.native_kernels
    assert {WINDOW_TAP, NUMPY_PAD, "native layer norm"} <= set(spec.kernel_overhead_us)
    assert set(SOFTMAX_TAIL_KEYS) <= set(spec.kernel_ns) or not spec.native_kernels
    assert spec.run_overhead_us > 0  # at least run()'s own checks around the generated _forward
    assert math.isfinite(predict(small_cnn(), spec, batch=2).seconds)
    # the same file, corrupted: a clear error naming it
    out.write_text(text.replace("gemm_efficiency:", "gemm_efficiency: -1 #"))
    with pytest.raises(TargetSpecError, match="host.yaml.*invalid"):
        load_target("host", specs_dir=out.parent)
    out.write_text(text + "\nnot yaml: [")
    with pytest.raises(TargetSpecError, match="cannot read"):
        load_target("host", specs_dir=out.parent)


def test_calibrate_refuses_an_output_name_load_target_cannot_find(tmp_path, capsys):
    assert main(["calibrate", "--output", str(tmp_path / "mine.yaml")]) == 2
    assert "host.yaml" in capsys.readouterr().err
    assert not (tmp_path / "mine.yaml").exists()


def test_calibrate_unknown_base_is_a_typed_error(tmp_path):
    from cuvil_edge.device_targets.calibrate import calibrate

    with pytest.raises(UnknownTargetError, match="no-such"):
        calibrate("no-such", quick=True)


# ---------------------------------------------------------------- per-kernel terms (kernel_ns)

KERNEL_NS = {"gemm_flop": 0.01, "gemm_mk": 0.2, "gemm_kn": 0.2, "gemm_mn": 0.2, "gemm_call": 1000.0,
             "dw_plane": 300.0, "dw_pad": 0.5, "dw_tap": 0.05, "dw_strided_tap": 0.4, "gather": 0.3,
             "gather_strided": 0.6,
             "fresh_byte": 0.1, "reduce_element": 0.3, "reduce_row": 20.0}


def one_node(op, x_shape, w_shape=None, **attrs):
    """A one-node graph: x (and a constant w) -> op -> y."""
    from onnx import shape_inference

    inits = [] if w_shape is None else [numpy_helper.from_array(np.full(w_shape, 0.1, np.float32), "w")]
    node = helper.make_node(op, ["x"] + (["w"] if w_shape else []), ["y"], name="n", **attrs)
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return load_model(model.SerializeToString())


def test_measured_gemm_terms_cost_the_products_the_kernel_makes(graph):
    from cuvil_edge.device_targets.cost_kernels import gemm_ns

    spec = load_target("x86-64").model_copy(update={"kernel_ns": KERNEL_NS})
    node = {n.node: n for n in predict(graph, spec, batch=3).nodes}["conv1x1"]
    m, k, n, count = node.gemm[0]
    assert node.compute_s == pytest.approx(count * gemm_ns(KERNEL_NS, m, k, n) * 1e-9)
    assert gemm_ns(KERNEL_NS, m, k, n) == pytest.approx(0.01 * 2 * m * k * n + 0.2 * (m * k + k * n + m * n) + 1000)
    assert gemm_ns({"gemm_flop": 1.0}, 1, 1, 1) is None  # a partial set: the roofline instead


def test_strided_depthwise_costs_more_per_output_than_stride_one():
    spec = load_target("x86-64").model_copy(update={"kernel_ns": KERNEL_NS})
    same = predict(one_node("Conv", [1, 32, 28, 28], (32, 1, 3, 3), group=32, pads=[1, 1, 1, 1]), spec).nodes[0]
    strided = predict(one_node("Conv", [1, 32, 56, 56], (32, 1, 3, 3), group=32, pads=[1, 1, 1, 1],
                               strides=[2, 2]), spec).nodes[0]
    assert same.kernel == strided.kernel == "conv depthwise native"
    assert same.bytes_written == strided.bytes_written  # the same 32 x 28 x 28 outputs
    # stride 1: 9 taps over the flat 28 x 30 accumulator; stride 2: 9 strided taps per output
    assert same.compute_s == pytest.approx(32 * (300 + 0.5 * 30 * 30 + 0.05 * 9 * 28 * 30) * 1e-9)
    assert strided.compute_s == pytest.approx(32 * (300 + 0.5 * 57 * 57 + 0.4 * 9 * 28 * 28) * 1e-9)
    assert strided.compute_s > 2 * same.compute_s


def test_native_max_pool_is_costed_as_the_strided_plane_loop():
    spec = load_target("x86-64").model_copy(update={"kernel_ns": KERNEL_NS})
    node = predict(one_node("MaxPool", [1, 8, 32, 32], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                   spec).nodes[0]
    assert node.kernel == "native"
    assert node.compute_s == pytest.approx(8 * (300 + 0.5 * 33 * 33 + 0.4 * 9 * 16 * 16) * 1e-9)


def test_im2col_copy_and_fresh_pages_use_their_measured_rates():
    base = load_target("x86-64").model_copy(update={"native_kernels": False})  # the numpy im2col path
    g = one_node("Conv", ["N", 16, 56, 56], (16, 16, 3, 3), pads=[1, 1, 1, 1])

    def node(batch, **terms):
        return predict(g, base.model_copy(update={"kernel_ns": {**KERNEL_NS, **terms}}), batch=batch).nodes[0]

    for batch in (1, 192):
        copied = batch * 16 * 9 * 56 * 56  # every window element of the im2col columns
        assert node(batch).kernel == "conv im2col"
        assert node(batch, gather=1.3).seconds - node(batch).seconds == pytest.approx(copied * 1e-9, rel=1e-6)
    # fresh pages: only arrays past the allocator's mmap limit (batch 192: a 38 MiB output) pay them
    assert node(1, fresh_byte=5.0).seconds == node(1).seconds
    big = node(192)
    assert big.bytes_written >= 32 << 20
    fresh = big.bytes_written + (big.scratch_bytes if big.scratch_bytes >= 32 << 20 else 0)
    assert node(192, fresh_byte=1.1).seconds - big.seconds == pytest.approx(fresh * 1e-9, rel=1e-6)


def test_strided_convolutions_copy_at_the_strided_gather_rate():
    base = load_target("x86-64").model_copy(update={"native_kernels": False})  # the numpy im2col path

    def node(graph, **terms):
        return predict(graph, base.model_copy(update={"kernel_ns": {**KERNEL_NS, **terms}})).nodes[0]

    im2col = one_node("Conv", [1, 8, 32, 32], (16, 8, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2])
    assert node(im2col).kernel == "conv im2col"
    assert node(im2col, gather_strided=1.6).seconds - node(im2col).seconds == pytest.approx(8 * 9 * 256e-9, rel=1e-6)
    assert node(im2col, gather=9.0).seconds == node(im2col).seconds  # the stride-1 rate is not used
    down = one_node("Conv", [1, 8, 32, 32], (16, 8, 1, 1), strides=[2, 2])  # a strided 1x1: its view is copied
    assert node(down).kernel == "conv 1x1 gemm"
    assert node(down, gather_strided=1.6).seconds - node(down).seconds == pytest.approx(8 * 256e-9, rel=1e-6)
    plain = one_node("Conv", [1, 8, 32, 32], (16, 8, 1, 1))  # stride 1: a view, nothing copied
    assert node(plain, gather_strided=1.6).seconds == node(plain).seconds


def test_fit_nonnegative_recovers_terms_and_drops_negative_ones():
    from cuvil_edge.device_targets.cost_kernels import fit_nonnegative

    rng = np.random.default_rng(0)
    rows = rng.uniform(1, 100, (30, 3))
    exact = rows @ np.array([2.0, 0.5, 0.0])
    assert fit_nonnegative(rows, exact) == pytest.approx([2.0, 0.5, 0.0], abs=1e-9)
    coef = fit_nonnegative(rows, rows @ np.array([2.0, 0.5, -0.3]) + 40)
    assert (coef >= 0).all()


def test_gemm_calibration_shapes_are_synthetic_and_fixed():
    from cuvil_edge.device_targets.cost_kernels import gemm_shapes

    shapes = gemm_shapes()
    assert shapes == gemm_shapes() and len(shapes) == 40 and len(set(shapes)) == 40
    assert all(8 <= m <= 2048 and 8 <= k <= 8192 and 1 <= n <= 12544 and 2 * m * k * n <= 2.5e8 for m, k, n in shapes)
