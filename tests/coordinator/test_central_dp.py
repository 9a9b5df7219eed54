"""Central DP wiring: config, Flower's wrapper around our strategy, the agent-side mod, the report."""

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping

from cuvil_edge.agent.client_app import central_dp_clipping_mod
from cuvil_edge.config import load_federation
from cuvil_edge.coordinator.report import format_round
from cuvil_edge.coordinator.server_app import make_strategy
from cuvil_edge.coordinator.strategy import CentralDpFixedClipping, SitePackageFedAvg
from cuvil_edge.errors import ConfigError
from flower_identity import flower_identity  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]


def federation(tmp_path, extra: str):
    text = (ROOT / "configs" / "federation.yaml").read_text().replace("sites/", str(ROOT / "configs" / "sites") + "/")
    path = tmp_path / "federation.yaml"
    path.write_text(text.split("strategy:")[0] + extra)  # no strategy section: FedAvg, central DP's strategy
    return load_federation(path)


def test_shipped_federation_has_local_dp_and_central_dp_off():
    f = load_federation(ROOT / "configs" / "federation.yaml")
    assert f.local_dp is True and f.central_dp.enabled is False


@pytest.mark.parametrize("extra", ["central_dp: {enabled: true, noise_multiplier: 0}\n",
                                   "central_dp: {enabled: true, clipping_norm: -1}\n",
                                   "central_dp: {enabled: true, sigma: 1}\n",
                                   "local_dp: maybe\n"])
def test_bad_dp_settings_are_config_errors(tmp_path, extra):
    with pytest.raises(ConfigError):
        federation(tmp_path, extra)


def test_make_strategy_wraps_in_flowers_client_side_fixed_clipping_with_accountant(tmp_path):
    f = federation(tmp_path, "central_dp: {enabled: true, noise_multiplier: 1.0, clipping_norm: 0.5}\n")
    inner, outer = make_strategy(f, factory=None, n=3)
    assert isinstance(outer, CentralDpFixedClipping)
    assert isinstance(outer, DifferentialPrivacyClientSideFixedClipping)
    assert outer.sites is inner and outer.accountant is not None
    assert (outer.noise_multiplier, outer.clipping_norm, outer.num_sampled_clients) == (1.0, 0.5, 3)
    plain_inner, plain = make_strategy(federation(tmp_path, "local_dp: true\n"), factory=None, n=3)
    assert plain is plain_inner and isinstance(plain, SitePackageFedAvg)


def _train_message(arrays: dict, clipping_norm: float | None) -> Message:
    config = {"server-round": 1, "site": "x", "package": b"pkg"}
    if clipping_norm is not None:
        config["clipping_norm"] = clipping_norm
    record = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    return Message(RecordDict({"arrays": record, "config": ConfigRecord(config)}), dst_node_id=1,
                   message_type=MessageType.TRAIN)


def _fake_train(update: float):
    def call_next(msg: Message, context) -> Message:
        sent = {k: a.numpy() for k, a in msg.content["arrays"].items()}
        out = ArrayRecord({k: Array(v + update) for k, v in sent.items()})
        return Message(RecordDict({"arrays": out, "metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)
    return call_next


@pytest.mark.parametrize("clip, expected_norm", [(0.5, 0.5), (None, 2.0)])
def test_agent_mod_clips_the_update_only_under_central_dp(flower_identity, clip, expected_norm):
    sent = {"w": np.zeros(4, np.float32), "b": np.zeros(0, np.float32)}
    msg = _train_message(sent, clip)
    reply = central_dp_clipping_mod(msg, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                                                 run_config={}), _fake_train(1.0))
    assert not reply.has_error(), reply.error if reply.has_error() else None
    update = np.concatenate([a.numpy().ravel() for a in reply.content["arrays"].values()])
    assert np.linalg.norm(update) == pytest.approx(expected_norm, rel=1e-5)


def test_round_table_shows_dropped_sites_and_central_epsilon():
    entry = {"round": 2, "global_accuracy": 0.8, "dropped_out": ["fleet-c"],
             "central_dp": {"epsilon": 7.08, "delta": 1e-5, "noise_multiplier": 1.0, "clipping_norm": 1.0,
                            "released": True},
             "sites": {"fleet-c": {"target": "ascend-310", "status": "budget exhausted", "eps-spent": 3.7,
                                   "eps-remaining": 0.1}}}
    text = format_round(entry)
    assert "budget exhausted" in text and "fleet-c: privacy budget exhausted" in text
    assert "central DP" in text and "ε = 7.080" in text


def _one_release_epsilon(noise_multiplier: float, n: int, delta: float, releases: int) -> float:
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting import GaussianPrivacyEvent
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    acc = RdpAccountant(PrivacyConfig(target_delta=delta, population_size=n,
                                      neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                                      sampling_method=SamplingMethod.NO_AMPLIFICATION))
    for _ in range(releases):
        acc.compose(GaussianPrivacyEvent(noise_multiplier=noise_multiplier, sample_size=n, population_size=n))
    return acc.get_privacy_spent().epsilon


def test_max_epsilon_is_optional_positive_and_reaches_flowers_accountant(tmp_path):
    assert federation(tmp_path, "central_dp: {enabled: true}\n").central_dp.max_epsilon is None
    for bad in ("0", "-1", ".inf", "nan"):
        with pytest.raises(ConfigError):
            federation(tmp_path, f"central_dp: {{enabled: true, max_epsilon: {bad}}}\n")
    _, outer = make_strategy(federation(tmp_path, "central_dp: {enabled: true, max_epsilon: 9.5}\n"), None, 3)
    assert outer.accountant.config.max_epsilon == 9.5


def test_max_epsilon_stops_the_run_cleanly_after_the_last_affordable_round(tmp_path):
    """A cap between the ε of one and two releases: round 1 runs, round 2 is refused before any site trains."""
    from cuvil_edge.coordinator.report import STOPPED_CENTRAL_BUDGET, RunReport
    from cuvil_edge.coordinator.server_app import start_rounds

    one, two = (_one_release_epsilon(2.0, 3, 1e-5, k) for k in (1, 2))
    cap = (one + two) / 2
    f = federation(tmp_path, f"central_dp: {{enabled: true, noise_multiplier: 2.0, max_epsilon: {cap}}}\n")
    inner, outer = make_strategy(f, factory=None, n=3)
    asked: list[int] = []

    def configure_train(server_round, arrays, config, grid):  # the sites' messages (only their number counts)
        asked.append(server_round)
        return [object()] * 3

    inner.configure_train = configure_train
    # round 1: Flower admits it; a released aggregate composes one Gaussian event
    assert len(list(outer.configure_train(1, ArrayRecord(), ConfigRecord(), None))) == 3
    outer._compose_release(outer._pop_pending_event(1))
    assert outer.privacy_spent().epsilon == pytest.approx(one) and one <= cap

    # round 2 via start_rounds: the strategy's own start() reaches configure_train and Flower refuses
    sites = f.load_sites()
    (tmp_path / "run").mkdir()
    report = RunReport(tmp_path / "run", sites)
    report.add_round(0, 0.1, {})
    report.add_round(1, 0.5, {}, central={"released": True, "epsilon": one, "delta": 1e-5,
                                          "noise_multiplier": 2.0, "clipping_norm": 1.0})

    def start(grid, arrays, num_rounds, timeout, evaluate_fn):
        outer.configure_train(2, arrays, ConfigRecord(), grid)
        raise AssertionError("round 2 should have been refused")

    outer.start = start
    start_rounds(outer, report, None, ArrayRecord(), num_rounds=3, timeout=1.0, evaluate_fn=None)
    assert asked == [1, 2] and outer.privacy_spent().epsilon == pytest.approx(one)  # nothing more spent
    metrics = __import__("json").loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["stopped_early"]["reason"] == STOPPED_CENTRAL_BUDGET
    assert metrics["stopped_early"]["completed_rounds"] == 1 and metrics["stopped_early"]["requested_rounds"] == 3
    assert "max_epsilon" in metrics["stopped_early"]["detail"]
    assert report.plot().exists()


def test_launcher_accepts_a_central_budget_stop_and_nothing_else(tmp_path):
    import json

    from cuvil_edge.coordinator.launcher import RunFailedError, completed_metrics
    from cuvil_edge.coordinator.report import STOPPED_CENTRAL_BUDGET

    rounds = [{"round": r, "global_accuracy": 0.5, "sites": {}} for r in range(2)]
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    with pytest.raises(RunFailedError):
        completed_metrics(tmp_path, 3)
    stopped = {"reason": STOPPED_CENTRAL_BUDGET, "detail": "x", "completed_rounds": 1, "requested_rounds": 3}
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds, "stopped_early": stopped}))
    assert completed_metrics(tmp_path, 3)["stopped_early"]["completed_rounds"] == 1
    stopped["reason"] = "something else"
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds, "stopped_early": stopped}))
    with pytest.raises(RunFailedError):
        completed_metrics(tmp_path, 3)
    (tmp_path / "metrics.json").write_text(json.dumps({"rounds": rounds}))
    assert completed_metrics(tmp_path, 1)["rounds"] == rounds  # complete
    with pytest.raises(RunFailedError, match="exit 1"):  # complete on disk, but the engine reported a failure
        completed_metrics(tmp_path, 1, RuntimeError("flwr run exit 1"))
