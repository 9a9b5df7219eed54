"""Flower's strategies chosen in the federation YAML, wrapped by the per-site package layer.

Each strategy runs through :class:`SitePackages` on real Flower messages and must aggregate exactly as
the bare Flower strategy does on the same replies, round after round (server optimiser state included).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, Metadata, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM, FedProx, FedYogi

from cuvil_edge.config import load_federation
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
from cuvil_edge.coordinator.checkpoints import latest_checkpoint, save_checkpoint
from cuvil_edge.coordinator.server_app import make_strategy
from cuvil_edge.coordinator.server_optimiser import optimiser_state, restore_optimiser
from cuvil_edge.coordinator.strategy import CentralDpFixedClipping, SitePackages, flower_strategy
from cuvil_edge.errors import ConfigError, StateError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from flower_identity import flower_identity  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
NODES = (11, 12, 13)

#: name in the YAML, its parameters, Flower's class
CASES = [
    ("fedavg", {}, FedAvg),
    ("fedprox", {"proximal_mu": 0.5}, FedProx),
    ("fedadam", {"eta": 0.05, "beta_1": 0.8, "beta_2": 0.95, "tau": 1e-2}, FedAdam),
    ("fedyogi", {"eta": 0.02, "tau": 1e-2}, FedYogi),
    ("fedavgm", {"server_learning_rate": 0.7, "server_momentum": 0.9}, FedAvgM),
]


class _Grid:
    """Three connected nodes registered under the shipped sites' names (no QUERY round needed)."""

    def __init__(self, names: dict[int, str]):
        self.names = names

    def get_node_ids(self):
        return list(self.names)

    def get_nodes(self):
        return [SimpleNamespace(node_id=n, name=s) for n, s in self.names.items()]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("strategies")
    sites = load_federation(ROOT / "configs" / "federation.yaml").load_sites()
    init_keys(tmp / "keys")
    graph = load_model(digits_cnn_onnx(0))
    factory = PackageFactory(graph, sites, load_signing_keys(tmp / "keys" / "coordinator.key"),
                             VersionCounter(tmp / "versions.json"), 600)
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    return sites, factory, weights


def _federation(tmp_path: Path, strategy_yaml: str, extra: str = ""):
    text = (ROOT / "configs" / "federation.yaml").read_text().replace("sites/", str(ROOT / "configs" / "sites") + "/")
    text = re.sub(r"(?m)^strategy:\n(?:  .*\n)*", "", text)  # the shipped section out, the test's in
    path = tmp_path / "federation.yaml"
    path.write_text(text.split("local_dp:")[0] + strategy_yaml + extra)  # local_dp and below: defaults
    return load_federation(path)


def _reply(sent: Message, arrays: dict[str, np.ndarray], weight: int) -> Message:
    meta = Metadata(run_id=1, message_id=f"reply-{time.monotonic_ns()}", src_node_id=sent.metadata.dst_node_id,
                    dst_node_id=0, reply_to_message_id=sent.metadata.message_id, group_id="1", created_at=time.time(),
                    ttl=60, message_type=MessageType.TRAIN)
    record = ArrayRecord({k: Array(np.asarray(v, np.float32)) for k, v in arrays.items()})
    return Message(RecordDict({"arrays": record, "metrics": MetricRecord({"num-examples": weight, "loss": 1.0})}),
                   metadata=meta)


@pytest.mark.usefixtures("flower_identity")
@pytest.mark.parametrize("name, params, flower_cls", CASES, ids=[c[0] for c in CASES])
def test_each_strategy_aggregates_through_the_wrapper_as_the_bare_flower_strategy_does(setup, name, params,
                                                                                      flower_cls):
    sites, factory, weights = setup
    sampling = dict(min_train_nodes=3, min_evaluate_nodes=3, min_available_nodes=3)
    wrapped = SitePackages(factory, flower_strategy(name, params, **sampling))
    bare = flower_cls(**sampling, **params)
    assert type(wrapped.strategy) is flower_cls
    grid = _Grid(dict(zip(NODES, (s.site for s in sites))))
    rng = np.random.default_rng(3)
    current = {k: v.copy() for k, v in weights.items()}
    for server_round in (1, 2, 3):  # several rounds: FedAdam's moments and FedAvgM's momentum carry over
        arrays = ArrayRecord({k: Array(v) for k, v in current.items()})
        sent = list(wrapped.configure_train(server_round, arrays, ConfigRecord(), grid))
        list(bare.configure_train(server_round, arrays, ConfigRecord(), grid))
        assert sorted(m.metadata.dst_node_id for m in sent) == list(NODES)
        for i, message in enumerate(sent):  # what the grid does when it pushes them
            message.metadata.__dict__["_message_id"] = f"m{server_round}-{i}"
            config = message.content["config"]
            assert config["site"] == wrapped.directory.site_of(message.metadata.dst_node_id)
            assert isinstance(config["package"], bytes) and config["server-round"] == server_round
            assert ("proximal-mu" in config) == (name == "fedprox")
            if name == "fedprox":
                assert config["proximal-mu"] == params["proximal_mu"]
        updates = [{k: v + rng.normal(0, 0.01, v.shape).astype(np.float32) for k, v in current.items()}
                   for _ in sent]
        site_weights = [1, 2, 5]
        got, got_metrics = wrapped.aggregate_train(server_round, [_reply(m, u, w) for m, u, w in
                                                                  zip(sent, updates, site_weights)])
        want, _ = bare.aggregate_train(server_round, [_reply(m, u, w) for m, u, w in
                                                      zip(sent, updates, site_weights)])
        assert got.keys() == want.keys() and got_metrics is not None
        for k in want.keys():
            np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-6, atol=1e-7)
            assert got[k].numpy().dtype == weights[k].dtype  # FedAdam computes in float64; packages stay float32
        assert all(s.status == "ok" for s in wrapped.recorder.rounds[server_round].values())
        current = {k: a.numpy() for k, a in got.items()}


@pytest.mark.usefixtures("flower_identity")
def test_an_exhausted_site_is_left_out_before_a_server_optimiser_sees_the_replies(setup):
    sites, factory, weights = setup
    wrapped = SitePackages(factory, FedAdam(min_train_nodes=3, min_available_nodes=3, eta=0.1))
    bare = FedAdam(min_train_nodes=3, min_available_nodes=3, eta=0.1)
    grid = _Grid(dict(zip(NODES, (s.site for s in sites))))
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    sent = list(wrapped.configure_train(1, arrays, ConfigRecord(), grid))
    list(bare.configure_train(1, arrays, ConfigRecord(), grid))
    for i, message in enumerate(sent):
        message.metadata.__dict__["_message_id"] = f"x{i}"
    update = {k: v + 0.01 for k, v in weights.items()}
    exhausted = Message(RecordDict({"arrays": ArrayRecord(), "metrics": MetricRecord(
        {"num-examples": 0, "budget-exhausted": 1, "eps-spent": 8.0, "eps-remaining": 0.0})}),
        metadata=_reply(sent[2], update, 1).metadata)
    got, _ = wrapped.aggregate_train(1, [_reply(sent[0], update, 1), _reply(sent[1], update, 1), exhausted])
    want, _ = bare.aggregate_train(1, [_reply(sent[0], update, 1), _reply(sent[1], update, 1)])
    for k in want.keys():
        np.testing.assert_allclose(got[k].numpy(), want[k].numpy(), rtol=1e-6)
    assert wrapped.recorder.site(1, wrapped.directory.site_of(sent[2].metadata.dst_node_id)).status == "budget exhausted"


@pytest.mark.parametrize("name, params, flower_cls", CASES, ids=[c[0] for c in CASES])
def test_the_federation_yaml_picks_the_strategy_and_its_parameters(tmp_path, name, params, flower_cls):
    lines = "".join(f"  {k}: {v}\n" for k, v in params.items())
    federation = _federation(tmp_path, f"strategy:\n  name: {name}\n{lines}")
    sites, run = make_strategy(federation, factory=None, n=3)
    assert run is sites and isinstance(sites, SitePackages) and type(sites.strategy) is flower_cls
    for key, value in params.items():
        assert getattr(sites.strategy, key) == value
    assert sites.strategy.min_train_nodes == 3


def test_without_a_strategy_section_the_run_is_fedavg(tmp_path):
    sites, _ = make_strategy(_federation(tmp_path, ""), factory=None, n=3)
    assert type(sites.strategy) is FedAvg


@pytest.mark.parametrize("section, says", [
    ("strategy:\n  name: fedsgd\n", "does not match any of the expected tags"),
    ("strategy:\n  name: fedadam\n  eta_l: 0.1\n", "strategy.fedadam.eta_l: unknown key"),
    ("strategy:\n  name: fedprox\n  mu: 0.1\n", "strategy.fedprox.mu: unknown key"),
    ("strategy:\n  eta: 0.1\n", "strategy.fedavg.eta: unknown key"),
    ("strategy:\n  name: fedadam\n  beta_1: 1.0\n", "strategy.fedadam.beta_1"),
    ("strategy:\n  name: fedprox\n  proximal_mu: -1\n", "strategy.fedprox.proximal_mu"),
    ("strategy:\n  name: fedavgm\n  server_momentum: .nan\n", "strategy.fedavgm.server_momentum"),
])
def test_an_unknown_strategy_or_parameter_is_a_one_line_config_error(tmp_path, section, says):
    with pytest.raises(ConfigError) as error:
        _federation(tmp_path, section)
    assert says in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedavgm"])
def test_central_dp_refuses_a_server_optimiser_in_one_line(tmp_path, name):
    with pytest.raises(ConfigError, match="central_dp needs strategy fedavg or fedprox") as error:
        _federation(tmp_path, f"strategy:\n  name: {name}\n", "central_dp: {enabled: true}\n")
    assert "\n" not in str(error.value)


def test_central_dp_wraps_the_per_site_layer_around_fedprox_and_flower_checks_the_inner_strategy(tmp_path):
    federation = _federation(tmp_path, "strategy:\n  name: fedprox\n  proximal_mu: 0.1\n",
                             "central_dp: {enabled: true}\n")
    sites, outer = make_strategy(federation, factory=None, n=3)
    assert isinstance(outer, CentralDpFixedClipping) and outer.sites is sites and outer.strategy.sites is sites
    assert type(sites.strategy) is FedProx and outer.accountant is not None
    assert sites.weighted_by_key == "num-examples"  # what Flower's equal-weights check reads
    # Flower's own check runs on the Flower strategy inside: FedAdam's aggregate is not FedAvg's mean
    accountant = outer.accountant
    with pytest.raises(ValueError, match="FedAvg.aggregate_train"):
        CentralDpFixedClipping(SitePackages(None, FedAdam()), 1.0, 1.0, 3, accountant=accountant)


# -- resuming a server optimiser ----------------------------------------------------------------------

OPTIMISERS = [c for c in CASES if c[0] in ("fedadam", "fedyogi", "fedavgm")]


def _run_rounds(wrapped: SitePackages, current: dict, rounds: range) -> dict:
    """Flower's rounds 1.. of ``wrapped`` with replies fixed by the *federation* round (offset + r),
    the same whether or not the run was interrupted before it."""
    grid = _Grid(dict(zip(NODES, (s.site for s in wrapped.factory.sites.values()))))
    for federation_round in rounds:
        server_round = federation_round - wrapped.round_offset
        arrays = ArrayRecord({k: Array(v) for k, v in current.items()})
        sent = list(wrapped.configure_train(server_round, arrays, ConfigRecord(), grid))
        for i, message in enumerate(sent):
            message.metadata.__dict__["_message_id"] = f"m{federation_round}-{i}"
        rng = np.random.default_rng(federation_round)
        replies = [_reply(m, {k: v + rng.normal(0, 0.01, v.shape).astype(np.float32) for k, v in current.items()}, w)
                   for m, w in zip(sorted(sent, key=lambda m: m.metadata.dst_node_id), (1, 2, 5))]
        got, _ = wrapped.aggregate_train(server_round, replies)
        current = {k: a.numpy() for k, a in got.items()}
    return current


@pytest.mark.usefixtures("flower_identity")
@pytest.mark.parametrize("name, params, flower_cls", OPTIMISERS, ids=[c[0] for c in OPTIMISERS])
def test_a_resumed_server_optimiser_continues_exactly_where_it_stopped(setup, tmp_path, name, params, flower_cls):
    """Four rounds in one run equal two rounds, a checkpoint, a new coordinator and two more; the
    same resume without the optimiser's state (what --resume did before) lands elsewhere."""
    _, factory, weights = setup
    sampling = dict(min_train_nodes=3, min_evaluate_nodes=3, min_available_nodes=3)
    fresh = lambda: SitePackages(factory, flower_strategy(name, params, **sampling))  # noqa: E731
    straight = _run_rounds(fresh(), dict(weights), range(1, 5))

    first = fresh()
    halfway = _run_rounds(first, dict(weights), range(1, 3))
    save_checkpoint(tmp_path, "f", 2, halfway, optimiser=optimiser_state(first.strategy, weights))
    checkpoint = latest_checkpoint(tmp_path, "f")
    assert checkpoint.optimiser and set(checkpoint.weights) == set(weights)  # the state is not a weight

    resumed, forgetful = fresh(), fresh()
    assert restore_optimiser(resumed.strategy, checkpoint.optimiser, checkpoint.weights)
    resumed.round_offset = forgetful.round_offset = 2
    got = _run_rounds(resumed, checkpoint.weights, range(3, 5))
    lost = _run_rounds(forgetful, checkpoint.weights, range(3, 5))
    for k in weights:
        np.testing.assert_allclose(got[k], straight[k], rtol=1e-6, atol=1e-7)
    assert max(float(np.abs(lost[k] - straight[k]).max()) for k in weights) > 1e-4


@pytest.mark.usefixtures("flower_identity")
def test_optimiser_state_that_does_not_fit_the_run_is_refused_or_left_out(setup, tmp_path, caplog):
    _, factory, weights = setup
    adam = SitePackages(factory, flower_strategy("fedadam", {}, min_train_nodes=3, min_available_nodes=3))
    _run_rounds(adam, dict(weights), range(1, 2))
    state = optimiser_state(adam.strategy, weights)
    assert {k.split("/")[1] for k in state} == {"m_t", "v_t"}
    # another strategy now: its optimiser starts from zero, with a warning, the weights still resume
    momentum = FedAvgM(server_momentum=0.9)
    assert not restore_optimiser(momentum, state, weights) and momentum.momentum_vector is None
    assert "FedAdam optimiser state" in caplog.text
    # a state whose shapes are not the model's would corrupt the next step
    name = max(weights, key=lambda k: weights[k].size)
    bad = {k: (v[..., :1] if k.endswith("/" + name) else v) for k, v in state.items()}
    with pytest.raises(StateError, match="does not match the model's weights"):
        restore_optimiser(FedAdam(), bad, weights)
    missing = {k: v for k, v in state.items() if not k.endswith("/" + name)}
    with pytest.raises(StateError, match="does not match"):
        restore_optimiser(FedAdam(), missing, weights)
    # a weight may not masquerade as optimiser state
    with pytest.raises(StateError, match="reserve"):
        save_checkpoint(tmp_path, "f", 1, {"__server_optimiser__/FedAdam/m_t/w": np.ones(2)})


@pytest.mark.usefixtures("flower_identity")
def test_central_dp_takes_the_train_replies_once_and_keeps_an_exhausted_sites_zero_update(setup, monkeypatch):
    """The wrapper records the replies before Flower validates them; the aggregate Flower asks for
    must not record them a second time, and all three replies (one a zero update) reach the mean."""
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    sites, factory, weights = setup
    wrapped = SitePackages(factory, FedAvg(min_train_nodes=3, min_available_nodes=3))
    accountant = RdpAccountant(PrivacyConfig(target_delta=1e-5, population_size=3,
                                             neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                             sampling_method=SamplingMethod.NO_AMPLIFICATION))
    outer = CentralDpFixedClipping(wrapped, noise_multiplier=1.0, clipping_norm=1.0, num_sampled_clients=3,
                                   accountant=accountant)
    recorded, averaged = [], []
    record = wrapped.recorder.record_replies
    monkeypatch.setattr(wrapped.recorder, "record_replies", lambda *a, **k: recorded.append(a[1]) or record(*a, **k))
    mean = wrapped.strategy.aggregate_train
    monkeypatch.setattr(wrapped.strategy, "aggregate_train", lambda r, replies: averaged.append(len(replies))
                        or mean(r, replies))
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    sent = list(outer.configure_train(1, arrays, ConfigRecord(), _Grid(dict(zip(NODES, (s.site for s in sites))))))
    assert all(m.content["config"]["clipping_norm"] == 1.0 for m in sent)
    for i, message in enumerate(sent):
        message.metadata.__dict__["_message_id"] = f"dp{i}"

    def reply(message, exhausted):  # equal weights and one set of metric keys, as Flower's accountant needs
        return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in weights.items()}),
                                   "metrics": MetricRecord({"num-examples": 1, "budget-exhausted": exhausted,
                                                            "eps-spent": 8.0, "eps-remaining": 0.0})}),
                       metadata=_reply(message, weights, 1).metadata)

    got, _ = outer.aggregate_train(1, [reply(sent[0], 0), reply(sent[1], 0), reply(sent[2], 1)])
    assert got is not None and recorded == ["train"] and averaged == [3]
    central = wrapped.recorder.central[1]
    assert central["released"] and central["releases"] == 1 and central["epsilon"] > 0
    statuses = {site: s.status for site, s in wrapped.recorder.rounds[1].items()}
    assert sorted(statuses.values()) == ["budget exhausted", "ok", "ok"]
