"""The ClientApp in a fresh process per message, as on Flower's deployment engine (issue 10 item 8):
the evaluation path imports neither torch nor onnx, and the next round's package (same model, new
weights) is not built again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.cli.local_federation import set_up
from cuvil_edge.config import load_federation
from cuvil_edge.config.home import versions_file
from cuvil_edge.coordinator.keys import load_signing_keys
from cuvil_edge.coordinator.model import load_federation_model
from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
from cuvil_edge.coordinator.registry import SiteRegistry

ROOT = Path(__file__).resolve().parents[2]
ONE_MESSAGE = Path(__file__).with_name("one_message.py")


@pytest.fixture
def device(tmp_path):
    """An enrolled device of the demo federation's first site and a way to send it a new round."""
    root = tmp_path
    fed_path = ROOT / "configs" / "federation.yaml"
    home, devices = set_up(root, fed_path)
    federation = load_federation(fed_path)
    graph = load_federation_model(federation.model, federation.seed)
    factory = PackageFactory(graph, federation.load_sites(), load_signing_keys(home / "keys" / "coordinator.key"),
                             VersionCounter(versions_file(home)), 3600, seal_keys=SiteRegistry(home).seal_keys())
    site_file, device_home = devices[0]
    site = federation.load_sites()[0].site
    rng = np.random.default_rng(0)

    def send(kind: str, server_round: int) -> dict:
        weights = {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype)
                   for k, v in graph.initializers.items() if v.dtype == np.float32}
        package = root / f"round-{server_round}-{kind}.cpkg"
        package.write_bytes(factory.issue(site, weights).data)
        proc = subprocess.run([sys.executable, str(ONE_MESSAGE), kind, str(package), str(site_file),
                               str(device_home), str(server_round)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    return send, device_home


def test_rounds_in_fresh_processes_build_once_and_evaluation_imports_no_torch_or_onnx(device):
    send, device_home = device
    first_eval, train, second_eval = send("evaluate", 1), send("train", 2), send("evaluate", 3)
    assert train["error"] is None and train["metrics"]["eps-round"] > 0
    for reply in (first_eval, second_eval):  # the second reads a ledger holding a DP-SGD round
        assert reply["error"] is None and "noisy-correct" in reply["metrics"]
        assert not {"torch", "onnx", "onnxruntime", "opacus"} & set(reply["heavy_modules"]), reply["heavy_modules"]
    assert not {"sklearn", "scipy"} & set(second_eval["heavy_modules"])  # the site's partition is kept
    builds = list(device_home.glob("agents/*/build-cache/*/module.py"))
    assert len(builds) == 1  # every later round's weights reused the first round's module
