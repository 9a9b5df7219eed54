"""`cuvil-edge compile MODEL --report` without --site: import, optimize, report; writes nothing."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper

from cuvil_edge.cli.main import main
from cuvil_edge.coordinator.compile import optimize_model

from pass_helpers import w


def _model_file(tmp_path):
    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 4] x) => (float[N, 3] y) {
        i = Identity(x)
        h = MatMul(i, W)
        a = Add(h, b)
        y = Relu(a)
    }""")
    model.graph.initializer.extend([numpy_helper.from_array(w(4, 3), "W"), numpy_helper.from_array(w(3), "b")])
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def test_optimize_model_reports_passes_flops_and_parameters(tmp_path):
    graph, report = optimize_model(_model_file(tmp_path))
    assert [n.op_type for n in graph.nodes] == ["CuvilFusedGemm"]
    assert (report.nodes_before, report.nodes_after) == (4, 1)
    # 2*1*4*3 matmul + 3 bias + 3 relu; 12 MACs; W and b float32
    assert report.flops == 24 + 3 + 3 and report.macs == 12 and report.parameter_bytes == (12 + 3) * 4
    # a memory plan per target at batch 1: the 60 weight bytes, then the input row and the output
    plans = {target: (peak, weights) for target, peak, weights, _ in report.memory}
    assert set(plans) == {"ascend-310", "jetson-orin-nano", "rpi4", "x86-64"}
    assert all(weights == 60 and peak > weights for peak, weights in plans.values())
    assert plans["ascend-310"][0] > plans["x86-64"][0]  # its static batch of 4 runs padded


def test_cli_compile_report_without_site_writes_nothing(tmp_path, capsys, monkeypatch):
    path = _model_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["compile", str(path), "--report"]) == 0
    out = capsys.readouterr().out
    assert "fuse-activation" in out and "fuse-bias" in out and "4 -> 1" in out
    assert "30 FLOPs" in out and "parameter bytes" in out
    assert "memory plan" in out and "rpi4" in out and "planned peak" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_compiled_model_reports_its_memory_plan(tmp_path):
    from cuvil_edge.device_targets import build

    graph, _ = optimize_model(_model_file(tmp_path))

    class Package:
        payload_digest = "12" * 32

    Package.graph = graph
    compiled = build(Package(), "rpi4", cache_dir=tmp_path / "cache")
    one, sixteen = compiled.memory_plan(), compiled.memory_plan(batch=16)
    assert one.target == "rpi4" and one.weights_bytes == 60
    assert one.largest_live == (("x", 16), ("y", 12))  # a row of 4 float32 inputs, 3 outputs
    assert sixteen.largest_live == (("x", 16 * 16), ("y", 16 * 12)) and sixteen.peak_bytes > one.peak_bytes


def test_cli_compile_site_without_output_is_an_error(tmp_path, capsys):
    assert main(["compile", str(_model_file(tmp_path)), "--site", "s.yaml"]) == 2
    assert "--output" in capsys.readouterr().err
