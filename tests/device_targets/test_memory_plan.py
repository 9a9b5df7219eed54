"""plan_memory: the planned peak of a compiled run against tracemalloc's measured
peak, on real models and on both a large-scratch (x86-64) and a low-memory (rpi4) target; the
bound weights + two largest simultaneously-live activations + 10 %; liveness attacks, checked
after every node of the generated module."""

from __future__ import annotations

import ast
import hashlib
import io
import itertools
import json
import re
import sys
import tracemalloc
import warnings
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch

from cuvil_edge.device_targets import build, load_target
from cuvil_edge.device_targets.codegen import generate_source
from cuvil_edge.device_targets.memory_plan import OVERHEAD_BYTES, MemoryPlan, plan_memory, release_schedule
from cuvil_edge.device_targets.prune import prune
from cuvil_edge.errors import BuildError, TargetError, UnknownTargetError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.passes import optimize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "architectures"))
from torch_models import MLP, EncoderBlock, MobileNetV2, ResNet18, randomise_batchnorm  # noqa: E402

TARGETS = ("x86-64", "rpi4")  # im2col kernels / the low-memory plan (rpi4 has no TARGET_LARGE_SCRATCH)
TORCH_MODELS = {
    "mlp": (MLP, (32,)),
    "resnet18": (lambda: ResNet18(classes=10), (3, 64, 64)),
    "mobilenetv2": (lambda: MobileNetV2(width=0.5, classes=10), (3, 64, 64)),
    "transformer": (lambda: EncoderBlock(dim=64, heads=4, hidden=256), (32, 64)),
}
MODELS = ("digits", *TORCH_MODELS)

#: Cases where the current kernels' temporaries break weights + two largest live activations + 10 %
#: at batch 1 (the plan names the same steps: MemoryPlan.over_bound). Strict: a fixed kernel fails
#: the test until its row here is removed.
OVER_BOUND = {
    "digits": "k_conv: `y = y + b` and `_activate(y)` each make a new output-sized array beside y, plus numpy's "
              "broadcast buffer (and im2col on x86-64); 8 KiB outputs against 21 KiB of weights",
    "transformer": "the bias Add after each MatMul makes a new array beside its input and buffers 32 KiB "
                   "(numpy's iterator, broadcast operand) while the residual stream is also live",
}


class _Package:
    """Stands in for ir_serialize's VerifiedPackage (build() reads these two)."""

    def __init__(self, graph, data: bytes) -> None:
        self.graph, self.payload_digest = graph, hashlib.sha256(data).hexdigest()


@lru_cache(maxsize=None)
def model(name: str):
    """(optimized graph, package bytes, input shape without the batch) of a test model."""
    if name == "digits":
        data, shape = digits_cnn_onnx(), (1, 8, 8)
    else:
        make, shape = TORCH_MODELS[name]
        torch.manual_seed(0)
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(randomise_batchnorm(make()).eval(), (torch.randn(2, *shape),), buffer, dynamo=False,
                              opset_version=17, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
        data = buffer.getvalue()
    graph, _ = optimize(load_model(data))
    return graph, data, shape


@lru_cache(maxsize=None)
def compiled(name: str, target: str, cache: str):
    graph, data, _ = model(name)
    return build(_Package(graph, data), target, cache_dir=cache)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("builds"))


@contextmanager
def tracing():
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        yield
    finally:
        if started:
            tracemalloc.stop()


def feeds_for(name: str, batch: int) -> dict[str, np.ndarray]:
    graph, _, shape = model(name)
    x = np.random.default_rng(batch).standard_normal((batch, *shape)).astype(np.float32)
    return {graph.inputs[0].name: np.abs(x) * 4 if name == "digits" else x}  # digits: pixel values


def measured_peak(run, feeds: dict[str, np.ndarray], weights_bytes: int) -> int:
    """tracemalloc's peak over one warm run (numpy registers its buffers with tracemalloc).

    The weights and the feeds are allocated before the run, so the traced window does not see them;
    the plan counts them (its weights term, and the inputs as live activations), so they are added
    back: measured = peak - current at the start + weights + the feeds' bytes."""
    run(feeds)  # warm-up: first-call work (native library load, caches) is not the run's memory
    with tracing():
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        run(feeds)
        _, peak = tracemalloc.get_traced_memory()
    return peak - start + weights_bytes + sum(a.nbytes for a in feeds.values())


def measured_per_node(graph, target: str, feeds: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """(peak during, bytes alive after) each node of the generated module, as the plan's
    ``peak_bytes`` and ``after_bytes``: the unpruned source gets a probe before every node and
    before ``return``, then is pruned for the target as build() prunes it."""
    lines, inside = [], False
    for line in generate_source(graph).splitlines():
        inside = line.startswith("def _forward(") or (inside and not line.startswith("def "))
        if inside and (re.match(r"    # \S+ node ", line) or line.startswith("    return {")):
            lines.append("    __probe()")
        lines.append(line)
    current, peak = np.zeros((2, len(graph.nodes) + 1), np.int64)  # allocated before tracing starts
    counter = [itertools.count()]

    def probe() -> None:
        index = next(counter[0])
        current[index], peak[index] = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()

    namespace = {"__name__": "probed", "__probe": probe}
    exec(compile(prune("\n".join(lines) + "\n", load_target(target).capabilities()), "probed", "exec"), namespace)
    namespace["run"](graph.initializers, feeds)
    counter[0] = itertools.count()
    with tracing():
        start, _ = tracemalloc.get_traced_memory()
        namespace["run"](graph.initializers, feeds)
    inputs = sum(a.nbytes for a in feeds.values())
    return [(int(p) - start + inputs, int(c) - start + inputs) for p, c in zip(peak[1:], current[1:])]


# --- the plan against tracemalloc on real models -----------------------------------------------
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", MODELS)
def test_planned_peak_matches_measured(name, target, cache_dir):
    graph, _, _ = model(name)
    plan = plan_memory(graph, target)
    # weights and their packed copies (made by the warm-up call) are held outside the run
    measured = measured_peak(compiled(name, target, cache_dir).run, feeds_for(name, 1),
                             plan.weights_bytes + plan.packed_weights_bytes)
    assert abs(measured - plan.peak_bytes) <= 0.10 * plan.peak_bytes, plan.describe() + f"\nmeasured {measured}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=OVER_BOUND[n]))
                                  if n in OVER_BOUND else n for n in MODELS])
def test_measured_peak_within_weights_and_two_largest_activations(name, target, cache_dir):
    graph, _, _ = model(name)
    plan = plan_memory(graph, target)
    # weights and their packed copies (made by the warm-up call) are held outside the run
    measured = measured_peak(compiled(name, target, cache_dir).run, feeds_for(name, 1),
                             plan.weights_bytes + plan.packed_weights_bytes)
    assert measured <= 1.10 * plan.bound_bytes, plan.describe() + f"\nmeasured {measured}"
    assert not plan.over_bound(), plan.describe()


@pytest.mark.parametrize("target", TARGETS)
def test_batch_16_plans_more_and_still_matches(target, cache_dir):
    graph, _, _ = model("mobilenetv2")
    one, sixteen = plan_memory(graph, target), plan_memory(graph, target, batch=16)
    held = lambda plan: plan.weights_bytes + plan.packed_weights_bytes  # noqa: E731
    measured = measured_peak(compiled("mobilenetv2", target, cache_dir).run, feeds_for("mobilenetv2", 16),
                             held(sixteen))
    assert sixteen.peak_bytes - held(sixteen) > 8 * (one.peak_bytes - held(one))
    assert abs(measured - sixteen.peak_bytes) <= 0.10 * sixteen.peak_bytes, sixteen.describe()


def test_low_memory_target_plans_im2col_one_block_at_a_time():
    graph, _, _ = model("resnet18")
    # the numpy paths (the native GEMM packs one block of columns on either target)
    large, small = plan_memory(graph, "x86-64", batch=16, native=False), plan_memory(graph, "rpi4", batch=16, native=False)
    assert small.low_memory and not large.low_memory
    stem = 0  # the 7x7 stride-2 stem convolution: im2col copies 3*49 values per output position
    im2col = 3 * 7 * 7 * 32 * 32 * 4  # one image's
    assert large.steps[stem].scratch_bytes >= 16 * im2col  # all 16 images' columns at once
    # one block of one image's rows instead (the rest of both: the padded input, the activation's copy)
    assert large.steps[stem].scratch_bytes - small.steps[stem].scratch_bytes >= 14 * im2col
    assert small.peak_bytes < large.peak_bytes


@pytest.mark.parametrize("target", ["ascend-310", "jetson-orin-nano"])
def test_static_batch_and_float16_wrappers_match(target, cache_dir):
    # ascend-310 runs chunks of 4 rows (batch 6: one padded chunk); jetson builds in float16, whose
    # module casts the weights and the inputs each run
    graph, data, _ = model("digits")
    precision = "fp16" if target == "jetson-orin-nano" else "fp32"
    plan = plan_memory(graph, target, precision=precision, batch=6)
    module = build(_Package(graph, data), target, cache_dir=cache_dir, precision=precision)
    measured = measured_peak(module.run, feeds_for("digits", 6), plan.weights_bytes + plan.packed_weights_bytes)
    assert abs(measured - plan.peak_bytes) <= 0.10 * plan.peak_bytes, plan.describe()
    assert plan.runtime_weights_bytes == (plan.weights_bytes // 2 if precision == "fp16" else 0)


# --- the plan follows the generated module's deletions --------------------------------------------
def generated_deletions(graph) -> list[list[str]]:
    """Per node, the value names the generated ``_forward`` deletes after it (read from its source)."""
    names: dict[str, str] = {}
    deleted: list[list[str]] = []
    body = generate_source(graph).split("def _forward(", 1)[1].split("\ndef ", 1)[0].splitlines()
    nodes = iter(graph.nodes)
    for index, line in enumerate(body):
        if fed := re.match(r"    (v\d+) = (?:feeds|W)\[(.+)\]$", line):
            names[fed[1]] = ast.literal_eval(fed[2])
        elif re.match(r"    # \S+ node ", line):
            node = next(nodes)
            targets = body[index + 1].strip().split(" = ", 1)[0].split(", ")
            names.update((t, o) for t, o in zip(targets, node.outputs) if o)
            deleted.append([])
        elif line.startswith("    del "):
            deleted[-1] = [names[v] for v in line[len("    del "):].split(", ")]
    return deleted


@pytest.mark.parametrize("name", ["resnet18", "transformer"])
def test_release_schedule_is_the_generated_modules(name):
    graph, _, _ = model(name)
    assert release_schedule(graph) == generated_deletions(graph)


# --- liveness attacks, measured after every node ---------------------------------------------------
ROW = 1 << 15  # 128 KiB per float32 row: Python's own objects are noise beside it


def _graph(nodes, outputs, initializers=None, shape=("batch", ROW)):
    return build_graph("attack", [Value("x", TensorType("float32", shape))], outputs, nodes, initializers or {}, 17)


def _plan_and_measure(graph, batch: int = 1):
    x = np.random.default_rng(0).standard_normal((batch, ROW)).astype(np.float32)
    plan = plan_memory(graph, "rpi4", batch=batch)
    return plan, measured_per_node(graph, "rpi4", {"x": x}), x.nbytes


def _assert_steps(plan: MemoryPlan, measured, peaks: list[int], after: list[int]) -> None:
    """The plan's (peak, after) per node are ``peaks``/``after`` and tracemalloc agrees (4 KiB of
    Python objects aside)."""
    assert [s.peak_bytes for s in plan.steps] == peaks and [s.after_bytes for s in plan.steps] == after
    for step, (peak, current) in zip(plan.steps, measured):
        assert abs(peak - step.peak_bytes) <= 4096 + 0.02 * step.peak_bytes, (step, peak)
        assert abs(current - step.after_bytes) <= 4096 + 0.02 * step.after_bytes, (step, current)


def test_value_read_by_two_later_nodes_lives_until_the_second():
    graph = _graph([Node("n0", "Relu", ("x",), ("a",)), Node("n1", "Neg", ("a",), ("b",)),
                    Node("n2", "Neg", ("b",), ("c",)), Node("n3", "Add", ("a", "c"), ("y",))], ["y"])
    plan, measured, row = _plan_and_measure(graph)
    # a stays after n1 and n2 (x, a, b, c alive during n2) and goes after n3
    _assert_steps(plan, measured, [2 * row, 3 * row, 4 * row, 4 * row], [2 * row, 3 * row, 3 * row, 2 * row])


def test_output_that_is_also_an_intermediate_is_never_freed():
    graph = _graph([Node("n0", "Relu", ("x",), ("a",)), Node("n1", "Neg", ("a",), ("b",)),
                    Node("n2", "Neg", ("b",), ("c",))], ["a", "c"])
    plan, measured, row = _plan_and_measure(graph)
    _assert_steps(plan, measured, [2 * row, 3 * row, 4 * row], [2 * row, 3 * row, 3 * row])  # a outlives reader n1


def test_a_view_keeps_its_input_buffer_alive():
    shape = np.array([-1, ROW // 2, 2], np.int64)
    graph = _graph([Node("n0", "Relu", ("x",), ("a",)), Node("n1", "Reshape", ("a", "shape"), ("r",)),
                    Node("n2", "Neg", ("r",), ("y",))], ["y"], {"shape": shape})
    plan, measured, row = _plan_and_measure(graph)
    # r is a view: n1 allocates nothing, and a's buffer lives on after its name is deleted at n1
    _assert_steps(plan, measured, [2 * row, 2 * row, 3 * row], [2 * row, 2 * row, 2 * row])


def test_dead_output_is_freed_after_its_node():
    graph = _graph([Node("n0", "Relu", ("x",), ("unused",)), Node("n1", "Neg", ("x",), ("y",))], ["y"])
    plan, measured, row = _plan_and_measure(graph)
    _assert_steps(plan, measured, [2 * row, 2 * row], [row, 2 * row])  # it exists during its own call only


# --- bad inputs --------------------------------------------------------------------------------------
def test_symbolic_dim_other_than_the_batch_is_refused():
    graph = build_graph("seq", [Value("x", TensorType("float32", ("batch", "tokens")))], ["y"],
                        [Node("n0", "Relu", ("x",), ("y",))], {}, 17)
    with pytest.raises(BuildError, match=r"'x'.*fixed"):
        plan_memory(graph, "x86-64")


@pytest.mark.parametrize("batch", [0, -1, True, 1.5])
def test_bad_batch_is_refused(batch):
    with pytest.raises(BuildError, match="batch"):
        plan_memory(model("digits")[0], "x86-64", batch=batch)


def test_fixed_batch_graph_refuses_another_batch():
    graph = _graph([Node("n0", "Relu", ("x",), ("y",))], ["y"], shape=(2, 8))
    assert plan_memory(graph, "x86-64").steps[0].live_bytes == 2 * 2 * 8 * 4
    with pytest.raises(BuildError, match="no symbolic batch"):
        plan_memory(graph, "x86-64", batch=4)


def test_unknown_target_and_unsupported_precision_are_refused():
    with pytest.raises(UnknownTargetError):
        plan_memory(model("digits")[0], "no-such-board")
    with pytest.raises(TargetError, match="fp16"):
        plan_memory(model("digits")[0], "rpi4", precision="fp16")


def test_report_forms():
    plan = plan_memory(model("resnet18")[0], "rpi4")
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["peak_bytes"] == plan.peak_bytes and data["bound_bytes"] == plan.bound_bytes
    assert len(data["steps"]) == len(plan.steps) and len(plan.largest_live) == 2
    assert plan.peak_bytes == (plan.weights_bytes + plan.packed_weights_bytes + plan.steps[plan.peak_step].peak_bytes
                               + OVERHEAD_BYTES)
    text = plan.describe()
    assert "rpi4" in text and "low-memory" in text and plan.steps[plan.peak_step].node in text
