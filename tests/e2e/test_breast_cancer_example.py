"""The breast-cancer example: three hospitals train from their own CSV files
under local DP-SGD through `cuvil-edge demo`, and the example's files are what its script writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "configs" / "examples" / "breast-cancer"

pytestmark = pytest.mark.e2e


def test_the_committed_data_is_what_make_example_writes(tmp_path):
    subprocess.run([sys.executable, str(EXAMPLE / "make_example.py"), str(tmp_path)], check=True,
                   capture_output=True, timeout=300)
    for name in ("test.csv", "hospital-1.csv", "hospital-2.csv", "hospital-3.csv"):
        assert (tmp_path / "data" / name).read_bytes() == (EXAMPLE / "data" / name).read_bytes(), name


def test_the_example_federation_learns_from_the_hospitals_own_files(tmp_path):
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr_home"), FLWR_TELEMETRY_ENABLED="0",
               FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "cuvil_edge", "demo", "--rounds", "3", "--run-dir", str(run_dir),
                           "--home", str(tmp_path / "home"), "--federation", str(EXAMPLE / "federation.yaml")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rounds = json.loads((run_dir / "metrics.json").read_text())["rounds"]
    assert rounds[-1]["global_accuracy"] >= 0.85 > rounds[0]["global_accuracy"]  # 113 held-out records
    for site, stats in rounds[-1]["sites"].items():
        assert stats["status"] == "ok", (site, stats)
        assert 0 < stats["eps-spent"] <= 8.0
    # a hospital whose file breaks is named with its file; the others go on
    broken = tmp_path / "broken"
    (broken / "sites").mkdir(parents=True)
    (broken / "data").mkdir()
    for name in ("test.csv", "hospital-1.csv", "hospital-2.csv", "hospital-3.csv"):
        text = (EXAMPLE / "data" / name).read_text()
        if name == "hospital-3.csv":
            text = text.replace(",benign\n", ",healthy\n", 1)  # a class the site YAML does not list
        (broken / "data" / name).write_text(text)
    (broken / "mlp.onnx").write_bytes((EXAMPLE / "mlp.onnx").read_bytes())
    (broken / "federation.yaml").write_text((EXAMPLE / "federation.yaml").read_text()
                                            + "min_sites: 2\n")
    for site in (EXAMPLE / "sites").glob("*.yaml"):
        (broken / "sites" / site.name).write_text(site.read_text())
    proc = subprocess.run([sys.executable, "-m", "cuvil_edge", "demo", "--rounds", "1", "--run-dir",
                           str(tmp_path / "run2"), "--home", str(tmp_path / "home2"), "--federation",
                           str(broken / "federation.yaml")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    stats = json.loads((tmp_path / "run2" / "metrics.json").read_text())["rounds"][-1]["sites"]
    assert stats["hospital-3"]["status"] == "failed"
    assert stats["hospital-3"]["train-error"] == "data-invalid"  # the code only: the file and cell stay on the device
    assert stats["hospital-1"]["status"] == stats["hospital-2"]["status"] == "ok"
    assert "eps-spent" not in stats["hospital-3"]  # refused before anything was reserved or released
