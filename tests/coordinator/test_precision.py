"""Package precisions from the coordinator: calibration files are plain
npz arrays (never pickles) that must fit the model, int8 without samples says what it calibrated
on, and `compile --target` proves the target builds the package before it writes it."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from cuvil_edge.coordinator.compile import compile_for_target, optimize_model
from cuvil_edge.coordinator.precision import load_calibration, synthetic_calibration, with_precision
from cuvil_edge.errors import ConfigError


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(16 * 8 * 8, 10)).eval()
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.randn(2, 3, 8, 8),), buffer, dynamo=False, opset_version=17, input_names=["image"],
                      output_names=["y"], dynamic_axes={"image": {0: "batch"}, "y": {0: "batch"}})
    path = tmp_path_factory.mktemp("model") / "net.onnx"
    path.write_bytes(buffer.getvalue())
    return path


def test_calibration_files_must_fit_the_model(tmp_path, model_file):
    graph, _ = optimize_model(model_file)
    good = tmp_path / "good.npz"
    np.savez(good, image=np.random.default_rng(0).standard_normal((70, 3, 8, 8)).astype(np.float32))
    batches = load_calibration(good, graph)
    assert [len(b["image"]) for b in batches] == [32, 32, 6]
    anonymous = tmp_path / "anon.npz"
    np.savez(anonymous, np.zeros((4, 3, 8, 8), np.float32))  # a single-input model may name it anything
    assert load_calibration(anonymous, graph)[0]["image"].shape == (4, 3, 8, 8)
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, pixels=np.zeros((4, 3, 8, 8), np.float32), extra=np.zeros(4, np.float32))
    with pytest.raises(ConfigError, match="model's inputs are"):
        load_calibration(wrong, graph)
    empty = tmp_path / "empty.npz"
    np.savez(empty, image=np.zeros((0, 3, 8, 8), np.float32))
    with pytest.raises(ConfigError, match="non-zero number of samples"):
        load_calibration(empty, graph)
    with pytest.raises(ConfigError, match="not found"):
        load_calibration(tmp_path / "missing.npz", graph)


def test_a_pickled_calibration_file_is_refused_unread(tmp_path, model_file):
    graph, _ = optimize_model(model_file)
    pickled = tmp_path / "objects.npz"
    np.savez(pickled, image=np.array([{"a": 1}], dtype=object))  # an object array is stored as a pickle
    with pytest.raises(ConfigError, match="plain arrays"):
        load_calibration(pickled, graph)
    not_npz = tmp_path / "text.npz"
    not_npz.write_text("hello")
    with pytest.raises(ConfigError, match="plain arrays"):
        load_calibration(not_npz, graph)


def test_precisions_shrink_the_payload_and_say_how(tmp_path, model_file):
    sizes, notes = {}, {}
    for precision in ("fp32", "fp16", "int8"):
        result = compile_for_target(model_file, "rpi4", tmp_path / f"{precision}.cpkg", precision)
        sizes[precision], notes[precision] = result.size, result.precision_note
        assert (tmp_path / f"{precision}.cpkg").stat().st_size == result.size
    assert sizes["fp16"] < 0.6 * sizes["fp32"] and sizes["int8"] < 0.4 * sizes["fp32"]
    assert "standard-normal" in notes["int8"] and "once at load" in notes["int8"]
    graph, _ = optimize_model(model_file)
    with pytest.raises(ConfigError, match="not one of"):
        with_precision(graph, "int4")
    assert len(synthetic_calibration(graph)) == 4


def test_the_seeds_command_line_writes_an_int8_payload(tmp_path, model_file, capsys, monkeypatch):
    from cuvil_edge.cli.main import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "net.cpkg"
    assert main(["compile", "--model", str(model_file), "--target", "rpi4", "--enable-quantization", "int8",
                 "--output", str(out)]) == 0
    assert "payload for target rpi4" in capsys.readouterr().out and out.stat().st_size > 0
    assert main(["compile", str(model_file), "--target", "x86-64", "--report"]) == 0
    shown = capsys.readouterr().out
    assert "predicted cost on x86-64" in shown and "predicted total" in shown and "memory plan" in shown
    assert main(["compile", "--model", str(model_file), "--output", str(out)]) == 2  # neither --site nor --target
    assert "--site SITE.yaml" in capsys.readouterr().err
    assert main(["compile", str(model_file), "--model", str(tmp_path / "other.onnx")]) == 2
    assert main(["compile", "--model", str(model_file), "--target", "rpi4", "--enable-quantization", "int4",
                 "--output", str(out)]) == 2


def test_plan_command_shows_every_site_and_its_choice(capsys):
    from cuvil_edge.cli.main import main

    root = Path(__file__).resolve().parents[2]
    assert main(["plan", "--federation", str(root / "configs" / "federation.yaml")]) == 0
    shown = capsys.readouterr().out
    assert "compile plan" in shown and all(site in shown for site in ("hospital-a", "factory-b", "fleet-c"))
    assert "most accurate precision" in shown


def test_plan_command_offers_int8_with_the_federations_calibration_file(tmp_path, capsys):
    from cuvil_edge.cli.main import main
    from cuvil_edge.datasets import digits

    from cuvil_edge.coordinator.model import load_federation_model
    from cuvil_edge.coordinator.plan import precision_variants
    from cuvil_edge.ir_serialize import encode_payload

    root = Path(__file__).resolve().parents[2]
    graph = load_federation_model("builtin:digits-cnn", 0)
    sizes = {p: len(encode_payload(g)) for p, g in
             precision_variants(graph, [{graph.inputs[0].name: digits.global_test().x[:64]}]).items()}
    (tmp_path / "sites").mkdir()
    for site in (root / "configs" / "sites").glob("*.yaml"):  # fleet-c: int8 fits, fp16 does not
        limit = f"limits:\n  download_mb: {(sizes['int8'] + sizes['fp16']) / 2 / 2**20}\n" if site.stem == "fleet-c" else ""
        (tmp_path / "sites" / site.name).write_text(site.read_text() + limit)
    federation = tmp_path / "federation.yaml"
    federation.write_text((root / "configs" / "federation.yaml").read_text())
    assert main(["plan", "--federation", str(federation)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "fleet-c (ascend-310): NOT PUSHED" in shown and "quantization.calibration" in shown
    np.savez(tmp_path / "calibration.npz", digits.global_test().x[:64])
    federation.write_text(federation.read_text() + "quantization:\n  calibration: calibration.npz\n")
    assert main(["plan", "--federation", str(federation)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "fleet-c (ascend-310): int8" in shown
    federation.write_text(federation.read_text().replace("calibration.npz", "missing.npz"))
    assert main(["plan", "--federation", str(federation)]) == 2
    assert "calibration file" in capsys.readouterr().err
