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


def test_cli_compile_report_without_site_writes_nothing(tmp_path, capsys, monkeypatch):
    path = _model_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["compile", str(path), "--report"]) == 0
    out = capsys.readouterr().out
    assert "fuse-activation" in out and "fuse-bias" in out and "4 -> 1" in out
    assert "30 FLOPs" in out and "parameter bytes" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_cli_compile_site_without_output_is_an_error(tmp_path, capsys):
    assert main(["compile", str(_model_file(tmp_path)), "--site", "s.yaml"]) == 2
    assert "--output" in capsys.readouterr().err
