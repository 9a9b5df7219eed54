"""Private inference: verify -> build -> run -> clip rows (L1) -> DP release from the site's ledger."""

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.agent.inference import clip_rows_l1, infer_private
from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.cli.main import main
from cuvil_edge.config import load_site
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.errors import BudgetExhaustedError, ReplayError, SignatureError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir_serialize import write_package

SITES = Path(__file__).resolve().parents[2] / "configs" / "sites"


@pytest.fixture
def setup(tmp_path):
    """A fleet-c site whose budget admits exactly one release at ε = 1.2 (budget 2.0)."""
    private, public = init_keys(tmp_path / "keys")
    text = (SITES / "fleet-c.yaml").read_text()
    text = re.sub(r"epsilon_per_round: [0-9.]+", "epsilon_per_round: 1.0",
                  text.replace("epsilon_budget: 8.0", "epsilon_budget: 2.0"))
    site_path = tmp_path / "fleet-c.yaml"
    site_path.write_text(text)
    graph = load_model(digits_cnn_onnx(3))
    now = int(time.time())
    keys = load_signing_keys(private)
    package = write_package(graph, site="fleet-c", target="ascend-310", version=1, signing_key=keys.coordinator,
                            release_key=keys.release, issued_at=now, expires=now + 600)
    package_path = tmp_path / "model.cpkg"
    package_path.write_bytes(package)
    x = np.random.default_rng(0).random((6, 1, 8, 8), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    return site_path, package_path, public, tmp_path


def test_clip_rows_l1_bounds_every_row_and_keeps_small_rows():
    y = np.array([[3.0, -1.0], [0.2, 0.1]])
    clipped = clip_rows_l1(y, 1.0)
    np.testing.assert_allclose(np.abs(clipped).sum(axis=1), [1.0, 0.3])
    np.testing.assert_allclose(clipped[0], [0.75, -0.25])


def test_each_release_spends_its_epsilon_then_refuses(setup):
    site_path, package_path, public, tmp_path = setup
    agent = AgentRuntime(load_site(site_path), tmp_path / "state", public)
    x = np.load(tmp_path / "x.npy", allow_pickle=False)
    before = agent.ledger().spent()
    out = infer_private(agent, package_path.read_bytes(), x, 1.2, clip_l1=1.0)
    assert out.values.shape == (6, 10)
    assert out.sensitivity == 2.0
    assert agent.ledger().spent() == pytest.approx(before + 1.2)
    assert out.eps_spent == pytest.approx(1.2)
    with pytest.raises(BudgetExhaustedError):
        infer_private(agent, package_path.read_bytes(), x[:5], 1.2)
    assert agent.ledger().spent() == pytest.approx(1.2)
    out = infer_private(agent, package_path.read_bytes(), x, 0.5)  # the same accepted package, ε still left
    assert agent.ledger().spent() == pytest.approx(1.7)


def test_bad_signature_spends_nothing(setup):
    site_path, package_path, _, tmp_path = setup
    _, other_public = init_keys(tmp_path / "other-keys")
    agent = AgentRuntime(load_site(site_path), tmp_path / "state", other_public)
    with pytest.raises(SignatureError):
        infer_private(agent, package_path.read_bytes(), np.zeros((1, 1, 8, 8), np.float32), 1.0)
    assert agent.ledger().spent() == 0.0


def test_cli_writes_the_release_and_refuses_when_exhausted(setup, capsys):
    site_path, package_path, public, tmp_path = setup
    args = ["agent", "infer", str(package_path), "--site", str(site_path), "--input", str(tmp_path / "x.npy"),
            "--epsilon", "1.2", "--state-dir", str(tmp_path / "state"), "--trust-root", str(public)]
    assert main(args + ["--output", str(tmp_path / "y1.npy")]) == 0
    y = np.load(tmp_path / "y1.npy", allow_pickle=False)
    assert y.shape == (6, 10) and np.isfinite(y).all()
    assert "spent ε=1.200" in capsys.readouterr().out
    assert main(args + ["--output", str(tmp_path / "y2.npy")]) == 2  # the same request again
    assert "already claimed" in capsys.readouterr().err
    assert main(args + ["--output", str(tmp_path / "y2.npy"), "--request-id", "second-release"]) == 2
    assert "budget" in capsys.readouterr().err
    assert not (tmp_path / "y2.npy").exists()


def test_cli_refuses_pickled_input(setup, capsys):
    site_path, package_path, public, tmp_path = setup
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    rc = main(["agent", "infer", str(package_path), "--site", str(site_path), "--input", str(tmp_path / "obj.npy"),
               "--epsilon", "1.0", "--state-dir", str(tmp_path / "state"), "--trust-root", str(public)])
    assert rc == 2
    assert "cannot read input" in capsys.readouterr().err


def test_releases_a_conv_feature_map(setup):
    """--feature conv: the graph is cut at the Conv, compiled under its own cache key, clipped per sample."""
    site_path, package_path, public, tmp_path = setup
    agent = AgentRuntime(load_site(site_path), tmp_path / "state", public)
    x = np.load(tmp_path / "x.npy", allow_pickle=False)
    data = package_path.read_bytes()
    out = infer_private(agent, data, x, 1.2, clip_l1=5.0, feature="conv")
    assert out.output_name == "conv"
    assert out.values.shape == (6, 32, 8, 8) and np.isfinite(out.values).all()
    assert out.sensitivity == 10.0
    assert agent.ledger().spent() == pytest.approx(1.2)
    # the feature build is its own cache entry, next to the full model's
    assert len([p for p in (tmp_path / "state" / "build-cache").iterdir() if p.is_dir()]) == 2


def test_feature_graph_is_cut_at_the_value():
    from cuvil_edge.agent.inference import feature_graph
    from cuvil_edge.ir import interpreter

    graph = load_model(digits_cnn_onnx(3))
    cut = feature_graph(graph, "conv")
    assert [n.op_type for n in cut.nodes] == ["Mul", "Add", "Conv"]
    assert [v.name for v in cut.outputs] == ["conv"] and set(cut.initializers) == {
        "input.scale", "input.shift", "conv.weight", "conv.bias"}
    assert graph.nodes[-1].op_type == "Softmax"  # the original is untouched
    # the pooled feature map, pushed through the head by hand, gives the full model's output
    x = np.random.default_rng(1).random((2, 1, 8, 8), dtype=np.float32)
    pool = interpreter.run(feature_graph(graph, "pool"), {"image": x})["pool"]
    assert pool.shape == (2, 32, 4, 4)
    w = graph.initializers
    logits = pool.reshape(2, -1) @ w["fc.weight"].T + w["fc.bias"]
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    np.testing.assert_allclose(probs, interpreter.run(graph, {"image": x})["probs"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["no-such-value", "conv.weight", "image"])
def test_unknown_feature_is_refused_and_nothing_spent(setup, name):
    from cuvil_edge.errors import ConfigError

    site_path, package_path, public, tmp_path = setup
    agent = AgentRuntime(load_site(site_path), tmp_path / "state", public)
    x = np.load(tmp_path / "x.npy", allow_pickle=False)
    with pytest.raises(ConfigError, match="conv, relu"):
        infer_private(agent, package_path.read_bytes(), x, 1.2, feature=name)
    assert agent.ledger().spent() == 0.0


def test_cli_feature_option(setup, capsys):
    site_path, package_path, public, tmp_path = setup
    args = ["agent", "infer", str(package_path), "--site", str(site_path), "--input", str(tmp_path / "x.npy"),
            "--epsilon", "0.5", "--state-dir", str(tmp_path / "state"), "--trust-root", str(public)]
    assert main(args + ["--feature", "pool", "--clip-l1", "3", "--output", str(tmp_path / "f.npy")]) == 0
    assert np.load(tmp_path / "f.npy", allow_pickle=False).shape == (6, 32, 4, 4)
    assert "released pool" in capsys.readouterr().out
    assert main(args + ["--feature", "nope", "--output", str(tmp_path / "g.npy")]) == 2
    assert "nope" in capsys.readouterr().err
    assert not (tmp_path / "g.npy").exists()
    assert AgentRuntime(load_site(site_path), tmp_path / "state", public).ledger().spent() == pytest.approx(0.5)


def test_replayed_request_is_refused_not_released_again(setup):
    """Three identical requests: one release, one charge; the replays get a typed refusal, never
    a fresh noisy output that could be averaged with the first."""
    site_path, package_path, public, tmp_path = setup
    agent = AgentRuntime(load_site(site_path), tmp_path / "state", public)
    x = np.load(tmp_path / "x.npy", allow_pickle=False)
    first = infer_private(agent, package_path.read_bytes(), x, 0.5)
    for _ in range(2):
        with pytest.raises(ReplayError):
            infer_private(agent, package_path.read_bytes(), x, 0.5)
    assert agent.ledger().spent() == pytest.approx(0.5) and len(agent.ledger().history()) == 1
    assert first.values.shape == (6, 10)


def test_two_concurrent_identical_requests_release_once(setup):
    site_path, package_path, public, tmp_path = setup
    agents = [AgentRuntime(load_site(site_path), tmp_path / "state", public) for _ in range(2)]
    x = np.load(tmp_path / "x.npy", allow_pickle=False)
    data = package_path.read_bytes()
    barrier, outcomes = threading.Barrier(2), []

    def deliver(agent):
        barrier.wait()
        try:
            outcomes.append(infer_private(agent, data, x, 0.5))
        except ReplayError as e:
            outcomes.append(e)

    threads = [threading.Thread(target=deliver, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(o).__name__ for o in outcomes) == ["PrivateOutput", "ReplayError"]
    assert agents[0].ledger().spent() == pytest.approx(0.5)


def test_nonfinite_output_rows_are_zeroed_not_refused():
    from cuvil_edge.agent.inference import zero_nonfinite_rows

    y = np.array([[0.5, np.nan], [0.2, 0.8], [np.inf, 0.0]])
    np.testing.assert_array_equal(zero_nonfinite_rows(y), [[0.0, 0.0], [0.2, 0.8], [0.0, 0.0]])
