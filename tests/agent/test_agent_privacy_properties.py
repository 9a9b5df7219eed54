"""A site's records never cost more ε than its ledger says. Each test tries to break it."""

from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import cuvil_edge.privacy.dpsgd as dpsgd
from cuvil_edge.agent.client_app import DATA_INDEPENDENT_MEASUREMENTS, train_metrics
from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.agent.training import train_round
from cuvil_edge.config import load_site
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.datasets import digits
from cuvil_edge.errors import BatchMixingError, ReplayError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.ir_serialize import write_package
from cuvil_edge.privacy import PrivacyLedger

SITES = Path(__file__).resolve().parents[2] / "configs" / "sites"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _site(tmp_path: Path, epochs: int = 1):
    """hospital-a with one local epoch (fast), its own state directory."""
    text = re.sub(r"local_epochs: \d+", f"local_epochs: {epochs}", (SITES / "hospital-a.yaml").read_text())
    path = tmp_path / "hospital-a.yaml"
    path.write_text(text)
    return load_site(path)


def _ledger(site, directory: Path) -> PrivacyLedger:
    p = site.privacy
    return PrivacyLedger(directory / "ledger.sqlite", site=site.site, epsilon_budget=p.epsilon_budget, delta=p.delta)


@pytest.fixture
def counted(monkeypatch):
    """Counts DP-SGD runs (the computation a replay must never repeat)."""
    calls = []
    original = dpsgd.train_dp_sgd  # train_round imports it at call time

    def spy(*args, **kwargs):
        calls.append(time.monotonic())
        return original(*args, **kwargs)

    monkeypatch.setattr(dpsgd, "train_dp_sgd", spy)
    return calls


# --- a replayed or duplicated message trains once and is charged once -------------------------------------
def test_three_sequential_deliveries_train_once_and_charge_once(tmp_path, counted):
    site, graph = _site(tmp_path), load_model(digits_cnn_onnx(0))
    ledger, data = _ledger(site, tmp_path), digits.site_partition(0, 3)
    first = train_round(graph, site, data, ledger, server_round=1, package_version=7)
    for _ in range(2):
        with pytest.raises(ReplayError):
            train_round(graph, site, data, ledger, server_round=1, package_version=7)
    assert len(counted) == 1 and len(ledger.history()) == 1
    assert ledger.spent() == pytest.approx(first.epsilon_round, rel=1e-9)


def test_two_concurrent_deliveries_train_once(tmp_path, counted):
    site, graph = _site(tmp_path), load_model(digits_cnn_onnx(0))
    data = digits.site_partition(0, 3)
    ledgers = [_ledger(site, tmp_path) for _ in range(2)]  # two handlers, one ledger file
    barrier, outcomes = threading.Barrier(2), []

    def deliver(ledger):
        barrier.wait()
        try:
            outcomes.append(train_round(graph, site, data, ledger, server_round=2, package_version=9))
        except ReplayError as e:
            outcomes.append(e)

    threads = [threading.Thread(target=deliver, args=(led,)) for led in ledgers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(o).__name__ for o in outcomes) == ["ReplayError", "TrainOutcome"]
    assert len(counted) == 1 and len(ledgers[0].history()) == 1


# --- a model that mixes samples is refused before anything is reserved ------------------------------------
def test_softmax_over_the_batch_is_refused_before_reserving(tmp_path, counted):
    site = _site(tmp_path)
    rng = np.random.default_rng(0)
    nodes = [Node("fc", "Gemm", ("x", "w", "b"), ("logits",), {"transB": 1}),
             Node("sm", "Softmax", ("logits",), ("probs",), {"axis": 0})]
    graph = build_graph("mixing", [Value("x", TensorType("float32", ("batch", 64)))], ["probs"], nodes,
                        {"w": rng.standard_normal((10, 64)).astype(np.float32),
                         "b": np.zeros(10, np.float32)}, 13)
    data = digits.site_partition(0, 3)
    data = dataclasses.replace(data, x=data.x.reshape(len(data.x), -1))
    ledger = _ledger(site, tmp_path)
    with pytest.raises(BatchMixingError, match="'sm'"):
        train_round(graph, site, data, ledger, server_round=1, package_version=1)
    assert ledger.history() == [] and counted == []


# --- one record more or less changes no un-noised reply field; an un-noised update says ε is infinite -----
def _reply_metrics(tmp_path: Path, name: str, data) -> dict:
    """Verify, build and train as the train handler does, and return the reply's metrics."""
    site = _site(tmp_path)
    keys_dir = tmp_path / "keys"
    if not (keys_dir / "root.json").exists():
        init_keys(keys_dir)
    keys = load_signing_keys(keys_dir / "coordinator.key")
    now = int(time.time())
    package = write_package(load_model(digits_cnn_onnx(0)), site=site.site, target=site.target, version=3,
                            signing_key=keys.coordinator, release_key=keys.release, issued_at=now,
                            expires=now + 600)
    agent = AgentRuntime(site, tmp_path / name, keys_dir / "root.json")
    activated = agent.activate(package)
    ledger = agent.ledger()
    outcome = train_round(activated.package.graph, site, data, ledger, server_round=1, package_version=3)
    return train_metrics(site, outcome, ledger, activated, central=False)


def test_one_more_record_changes_no_unnoised_field_of_the_reply(tmp_path):
    data = digits.site_partition(0, 3)
    smaller = dataclasses.replace(data, x=data.x[:-1], y=data.y[:-1])
    a, b = _reply_metrics(tmp_path, "with", data), _reply_metrics(tmp_path, "without", smaller)
    assert set(a) == set(b)
    public = {k for k in a if k not in DATA_INDEPENDENT_MEASUREMENTS}
    assert {k: a[k] for k in public} == {k: b[k] for k in public}
    assert a["num-examples"] == 1  # the site's public weight, not len(data)


def test_without_local_dp_an_update_reports_infinite_epsilon(tmp_path):
    site = _site(tmp_path)
    ledger = _ledger(site, tmp_path)
    outcome = train_round(load_model(digits_cnn_onnx(0)), site, digits.site_partition(0, 3), ledger,
                          server_round=1, package_version=1, local_dp=False)
    assert math.isinf(outcome.epsilon_round) and ledger.history() == []
