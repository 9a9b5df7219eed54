"""A model with a dynamic axis besides the batch (a sequence length) is planned at the size the
site's ``limits.dims`` gives, and without one the plan says which axis needs a size and where."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil_edge.config import load_site
from cuvil_edge.coordinator.plan import default_latency, plan_site
from cuvil_edge.errors import ConfigError, ShapeInferenceError
from cuvil_edge.frontend import load_model
from cuvil_edge.ir.infer import with_sizes
from test_plan import SITE  # the same rpi4 site, without limits



@pytest.fixture(scope="module")
def graph():
    """y = softmax(x @ w) over [batch, seq, 64]: memory grows with seq."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    g = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 64])], [w])
    return load_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


def _site(tmp_path, limits: str = ""):
    path = tmp_path / "site.yaml"
    path.write_text(SITE + (f"limits:\n{limits}" if limits else ""))
    return load_site(path)


def test_without_a_size_the_plan_names_the_axis_and_the_setting(tmp_path, graph):
    plan = plan_site(_site(tmp_path), {"fp32": graph}, default_latency())
    assert plan.chosen is None and "'seq'" in plan.reason and "limits.dims" in plan.reason


def test_the_plan_grows_with_the_size_the_site_gives(tmp_path, graph):
    small = plan_site(_site(tmp_path, "  dims: {seq: 16}\n"), {"fp32": graph}, default_latency())
    large = plan_site(_site(tmp_path, "  dims: {seq: 4096}\n"), {"fp32": graph}, default_latency())
    assert small.chosen is not None and large.chosen is not None
    assert large.chosen.peak_bytes - small.chosen.peak_bytes >= 2 * (4096 - 16) * 64 * 4  # x and y at least
    assert large.chosen.latency_ms > small.chosen.latency_ms
    tight = plan_site(_site(tmp_path, "  dims: {seq: 4096}\n  memory_mb: 1\n"), {"fp32": graph}, default_latency())
    assert tight.chosen is None and "limits.memory_mb" in tight.reason


def test_a_size_for_an_axis_the_model_lacks_is_refused(tmp_path, graph):
    plan = plan_site(_site(tmp_path, "  dims: {tokens: 16}\n"), {"fp32": graph})
    assert plan.chosen is None and "no dynamic axis 'tokens'" in plan.reason and "seq" in plan.reason
    with pytest.raises(ShapeInferenceError, match="positive int"):
        with_sizes(graph, {"seq": 0})


@pytest.mark.parametrize("dims", ["{seq: 0}", "{'bad name': 4}", "{seq: true}", "{seq: 99999999}"])
def test_bad_dims_in_the_site_file_are_refused(tmp_path, dims):
    with pytest.raises(ConfigError, match="limits.dims"):
        _site(tmp_path, f"  dims: {dims}\n")
