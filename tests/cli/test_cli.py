"""The CLI: keys, compile, inspect, and one-line errors with a non-zero exit."""

from pathlib import Path

import pytest

from cuvil_edge.cli.main import main
from cuvil_edge.frontend.demo_model import digits_cnn_onnx

SITE = Path(__file__).resolve().parents[2] / "configs" / "sites" / "factory-b.yaml"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.onnx").write_bytes(digits_cnn_onnx(0))
    return tmp_path


def test_keys_compile_inspect(workdir, capsys):
    assert main(["keys", "init"]) == 0
    assert (workdir / ".cuvil/keys/coordinator.key").stat().st_mode & 0o077 == 0
    assert main(["compile", "model.onnx", "--site", str(SITE), "-o", "out.cpkg"]) == 0
    assert main(["compile", "model.onnx", "--site", str(SITE), "-o", "out2.cpkg"]) == 0
    capsys.readouterr()
    assert main(["inspect", "out2.cpkg", "--key", ".cuvil/keys/coordinator.pub"]) == 0
    out = capsys.readouterr().out
    assert "factory-b" in out and "rpi4" in out and "valid" in out
    assert "Conv" in out and "Gemm" in out and "FLOPs" in out
    assert "version" in out and " 2" in out  # second compile for the site got version 2


def test_keys_init_refuses_to_overwrite(workdir, capsys):
    assert main(["keys", "init"]) == 0
    assert main(["keys", "init"]) == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.parametrize("site_text, fragment", [
    ("site: x\n", "target: missing required key; privacy: missing required key"),
    ("site: x\ntarget: vax\nprivacy: {epsilon_budget: 1, epsilon_per_round: 1}\n", "target:"),
    ("site: x\ntarget: rpi4\nprivacy: {epsilon_budget: 1, epsilon_per_round: 1}\nextra: 1\n", "extra: unknown key"),
])
def test_config_error_is_one_line_and_exit_2(workdir, capsys, site_text, fragment):
    main(["keys", "init"])
    (workdir / "bad.yaml").write_text(site_text)
    code = main(["compile", "model.onnx", "--site", "bad.yaml", "-o", "out.cpkg"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: bad.yaml: ")
    assert fragment in err
    assert not (workdir / "out.cpkg").exists()


def test_missing_model_file(workdir, capsys):
    main(["keys", "init"])
    assert main(["compile", "nope.onnx", "--site", str(SITE), "-o", "o.cpkg"]) == 2
    assert "nope.onnx" in capsys.readouterr().err


def test_inspect_rejects_garbage(workdir, capsys):
    (workdir / "junk.cpkg").write_bytes(b"not a package at all" * 10)
    assert main(["inspect", "junk.cpkg"]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_compile_report_refuses_what_could_not_be_packaged(workdir, capsys):
    """The report runs the package writer's name checks, so it never says a model is fine that
    `compile --site` then cannot package (a TensorFlow-style input name ``x:0``)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x:0"], ["y"])], "g",
                              [helper.make_tensor_value_info("x:0", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    (workdir / "tf.onnx").write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert main(["compile", "tf.onnx", "--report"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'x:0'" in err and "drive letter" in err


def test_compile_report_plans_another_dynamic_axis_at_a_given_size(workdir, capsys):
    """A sequence model's memory plan needs the sequence length: --dim gives it, a bad one is one line."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])], [w])
    (workdir / "seq.onnx").write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert main(["compile", "seq.onnx", "--report"]) == 0
    assert "limits.dims" in capsys.readouterr().out  # no size: each target's row says what to give
    assert main(["compile", "seq.onnx", "--report", "--dim", "seq=4096"]) == 0
    assert "limits.dims" not in capsys.readouterr().out
    for bad in ("seq", "seq=0", "tokens=4"):
        assert main(["compile", "seq.onnx", "--report", "--dim", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: ")
