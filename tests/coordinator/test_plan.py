"""The compile plan: per site and precision, package bytes, planned peak memory
and (with a cost model) latency against the site's limits; the most accurate precision that fits is
chosen, a site nothing fits is flagged, and the coordinator pushes nothing to it while the round
goes on with the others."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from cuvil_edge.config import load_federation, load_site
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
from cuvil_edge.coordinator.plan import plan_federation, plan_site
from cuvil_edge.coordinator.report import NOT_PUSHED_STATUS, format_round
from cuvil_edge.coordinator.strategy import SitePackageFedAvg
from cuvil_edge.errors import PlanError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir_serialize import encode_payload
from flower_identity import flower_identity  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
SITE = """\
site: clinic-x
target: rpi4
privacy:
  epsilon_budget: 8.0
  epsilon_per_round: 2.0
"""


def _site(tmp_path, limits: str = ""):
    path = tmp_path / "site.yaml"
    path.write_text(SITE + (f"limits:\n{limits}" if limits else ""))
    return load_site(path)


@pytest.fixture(scope="module")
def graph():
    return load_model(digits_cnn_onnx(0))


def test_without_limits_the_most_accurate_precision_is_chosen(tmp_path, graph):
    half = graph  # a stand-in second variant: the choice must still be the first listed that fits
    plan = plan_site(_site(tmp_path), {"fp32": graph, "fp16": half})
    assert plan.chosen.precision == "fp32" and "within every limit" in plan.reason
    option = plan.options[0]
    assert option.package_bytes == len(encode_payload(graph))
    assert option.peak_bytes > graph.parameter_bytes()  # weights + activations
    assert option.latency_ms is None  # no cost model given


def test_limits_are_checked_and_the_reason_names_them(tmp_path, graph):
    fp32_bytes = len(encode_payload(graph))
    site = _site(tmp_path, f"  download_mb: {(fp32_bytes - 1) / 2**20}\n")
    plan = plan_site(site, {"fp32": graph})
    assert plan.chosen is None and "nothing fits" in plan.reason and "limits.download_mb" in plan.reason
    latency = lambda g, spec, precision, batch: 0.004 * batch  # noqa: E731 - a cost model stand-in
    site = _site(tmp_path, "  latency_ms: 10\n")
    plan = plan_site(site, {"fp32": graph}, latency, steps_per_round=5)
    option = plan.options[0]
    assert option.latency_ms == pytest.approx(4.0) and option.train_batch_ms == pytest.approx(4.0 * 32)
    assert option.round_seconds == pytest.approx(3 * 0.128 * 5) and option.fits
    site = _site(tmp_path, "  latency_ms: 3\n")
    assert "limits.latency_ms" in plan_site(site, {"fp32": graph}, latency).reason


def test_memory_over_the_limit_is_refused(tmp_path, graph):
    plan = plan_site(_site(tmp_path, "  memory_mb: 0.001\n"), {"fp32": graph})
    assert plan.chosen is None and "limits.memory_mb" in plan.reason


def test_a_download_limit_moves_a_site_to_fp16_and_it_is_issued_fp16(tmp_path, graph):
    from cuvil_edge.coordinator.plan import precision_variants
    from cuvil_edge.ir_serialize import describe_package

    fp32_bytes = len(encode_payload(graph))
    site = _site(tmp_path, f"  download_mb: {0.8 * fp32_bytes / 2**20}\n")
    plan = plan_site(site, precision_variants(graph))
    assert plan.chosen.precision == "fp16" and "fp32 breaks" in plan.reason and "limits.download_mb" in plan.reason
    init_keys(tmp_path / "keys")
    factory = PackageFactory(graph, [site], load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                             VersionCounter(tmp_path / "versions.json"), 600, precisions={site.site: "fp16"})
    weights = {k: v for k, v in graph.initializers.items() if v.dtype == np.float32}
    issued = describe_package(factory.issue(site.site, weights).data, max_bytes=1 << 30).graph
    assert any(a.dtype == np.float16 for a in issued.initializers.values())
    assert len(encode_payload(issued)) <= 0.8 * fp32_bytes
    with pytest.raises(PlanError, match="needs calibration samples.*quantization.calibration"):
        PackageFactory(graph, [site], load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                       VersionCounter(tmp_path / "versions.json"), 600, precisions={site.site: "int8"})
    with pytest.raises(PlanError, match="unknown precision"):
        PackageFactory(graph, [site], load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                       VersionCounter(tmp_path / "versions.json"), 600, precisions={site.site: "int4"})


def test_a_refused_site_is_sent_nothing_and_the_others_still_are(tmp_path, graph, flower_identity):
    sites = load_federation(ROOT / "configs" / "federation.yaml").load_sites()
    init_keys(tmp_path / "keys")
    refused = {sites[1].site: "its fp32 package breaks its plan: memory 0.04 MiB > limits.memory_mb 0.001"}
    factory = PackageFactory(graph, sites, load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                             VersionCounter(tmp_path / "versions.json"), 600, refused=refused)
    with pytest.raises(PlanError, match="limits.memory_mb"):
        factory.issue(sites[1].site, {})
    strategy = SitePackageFedAvg(factory, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    for node, site in zip((11, 12, 13), sites):
        strategy.directory.bind(node, site.site)
    arrays = ArrayRecord({k: Array(np.array(v)) for k, v in graph.initializers.items() if v.dtype == np.float32})
    asks = [Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=n,
                    message_type=MessageType.TRAIN) for n in (11, 12, 13)]
    sent = strategy.personalise(asks, arrays, grid=None)
    assert [m.metadata.dst_node_id for m in sent] == [11, 13]
    stats = strategy.recorder.sites(1)[sites[1].site]
    assert stats["status"] == NOT_PUSHED_STATUS and "limits.memory_mb" in stats["train-error"]
    shown = {site: {"target": "x", **entry} for site, entry in strategy.recorder.sites(1).items()}
    assert "not pushed" in format_round({"round": 1, "global_accuracy": 0.5, "sites": shown, "dropped_out": []})


def test_the_shipped_federation_plans_every_site(graph):
    federation = load_federation(ROOT / "configs" / "federation.yaml")
    plans = plan_federation(graph, federation.load_sites(), {"fp32": graph})
    assert [p.chosen.precision for p in plans] == ["fp32"] * len(plans)


# --- int8 in federation runs ---------------------------------------------------------------------
def _calibration(graph):
    from cuvil_edge.datasets import digits

    return [{graph.inputs[0].name: digits.global_test().x[:64]}]  # public samples the coordinator holds


def _int8_limit(graph, variants) -> float:
    """A download limit (MiB) int8 fits and fp16 does not."""
    sizes = {p: len(encode_payload(g)) for p, g in variants.items()}
    assert sizes["int8"] < sizes["fp16"] < sizes["fp32"]
    return (sizes["int8"] + sizes["fp16"]) / 2 / 2**20


def test_int8_is_offered_only_with_calibration_samples_and_chosen_when_only_it_fits(tmp_path, graph):
    from cuvil_edge.coordinator.plan import precision_variants

    variants = precision_variants(graph, _calibration(graph))
    site = _site(tmp_path, f"  download_mb: {_int8_limit(graph, variants)}\n")
    plan = plan_federation(graph, [site], variants)[0]
    assert plan.chosen.precision == "int8"
    assert "fp32 breaks" in plan.reason and "fp16 breaks" in plan.reason
    without = plan_federation(graph, [site], precision_variants(graph))[0]
    assert without.chosen is None and "int8 was not planned" in without.reason
    assert "quantization.calibration" in without.reason


@pytest.fixture()
def mixed(tmp_path, graph):
    """A factory and strategy for three sites planned fp32, fp16 and int8."""
    sites = load_federation(ROOT / "configs" / "federation.yaml").load_sites()
    init_keys(tmp_path / "keys")
    precisions = {sites[1].site: "fp16", sites[2].site: "int8"}
    factory = PackageFactory(graph, sites, load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                             VersionCounter(tmp_path / "versions.json"), 600, precisions=precisions,
                             calibration=_calibration(graph))
    strategy = SitePackageFedAvg(factory, fraction_train=1.0, min_train_nodes=3, min_available_nodes=3)
    for node, site in zip((11, 12, 13), sites):
        strategy.directory.bind(node, site.site)
    weights = {k: np.array(v) for k, v in graph.initializers.items() if v.dtype == np.float32}
    return sites, factory, strategy, weights


def _asks(config=None):
    return [Message(RecordDict({"config": ConfigRecord({"server-round": 1, **(config or {})})}), dst_node_id=n,
                    message_type=MessageType.TRAIN) for n in (11, 12, 13)]


def test_each_site_is_issued_its_precision_and_one_release_serves_every_site_of_a_precision(mixed):
    from cuvil_edge.ir_serialize import describe_package

    sites, factory, _, weights = mixed
    issued = {s.site: describe_package(factory.issue(s.site, weights).data, max_bytes=1 << 30) for s in sites}
    int8 = issued[sites[2].site].graph
    assert {"QuantizeLinear", "DequantizeLinear"} <= set(int8.op_counts())
    assert any(a.dtype == np.int8 for a in int8.initializers.values())
    assert any(a.dtype == np.float16 for a in issued[sites[1].site].graph.initializers.values())
    releases = {site: d.release.release_counter for site, d in issued.items()}
    assert len(set(releases.values())) == 3  # three payloads, three releases
    again = describe_package(factory.issue(sites[2].site, weights).data, max_bytes=1 << 30)
    assert again.release.release_counter == releases[sites[2].site]  # same payload: the same release, a new version
    assert again.manifest.version == issued[sites[2].site].manifest.version + 1


def test_a_phase_encodes_each_precision_once_and_a_later_write_cannot_make_a_package_stale(mixed, monkeypatch):
    """Frozen weights are hashed once per phase; the payload and release of a precision are made
    once and reused for every site; writes to the caller's arrays after freezing change nothing, and
    a plain mapping written in place is hashed again, so it is never served a stale payload."""
    from cuvil_edge.coordinator import packaging
    from cuvil_edge.coordinator.packaging import FrozenWeights
    from cuvil_edge.ir_serialize import describe_package

    sites, factory, _, weights = mixed
    encoded: list = []
    real = packaging.encode_payload
    monkeypatch.setattr(packaging, "encode_payload", lambda graph: encoded.append(graph) or real(graph))
    name = next(k for k, v in weights.items() if v.size > 100)
    mine = {k: v.copy() for k, v in weights.items()}
    frozen = FrozenWeights(mine)
    mine[name] += 1.0  # the caller moves on after the phase started
    with pytest.raises(ValueError, match="read-only"):
        frozen[name][...] = 0
    first = describe_package(factory.issue(sites[0].site, frozen).data, max_bytes=1 << 30)
    second = describe_package(factory.issue(sites[0].site, frozen).data, max_bytes=1 << 30)
    assert len(encoded) == 1  # the phase's fp32 payload is reused, not encoded again
    assert second.release.release_counter == first.release.release_counter
    np.testing.assert_array_equal(second.graph.initializers[name], weights[name])  # not the caller's later write
    plain = {k: v.copy() for k, v in weights.items()}
    before = describe_package(factory.issue(sites[0].site, plain).data, max_bytes=1 << 30)
    plain[name] += 1.0  # written in place: the next package must carry it
    after = describe_package(factory.issue(sites[0].site, plain).data, max_bytes=1 << 30)
    np.testing.assert_array_equal(after.graph.initializers[name], weights[name] + 1.0)
    assert after.release.release_counter == before.release.release_counter + 1


def test_weights_that_come_back_get_a_newer_release_never_an_older_one(mixed):
    """Weights A, then B, then A again: the third package's release counter is above B's, since an
    agent that accepted B's release refuses a lower counter as a rollback."""
    from cuvil_edge.ir_serialize import describe_package

    sites, factory, _, weights = mixed
    moved = {k: v + 0.25 for k, v in weights.items()}
    counters = [describe_package(factory.issue(sites[0].site, w).data, max_bytes=1 << 30).release.release_counter
                for w in (weights, moved, weights)]
    assert counters[0] < counters[1] < counters[2]


def test_what_a_site_starts_from_is_its_package_after_the_load_fold(mixed):
    from cuvil_edge.passes.quantize import dequantize_at_load

    sites, factory, _, weights = mixed
    assert factory.shipped(sites[0].site, weights).keys() == weights.keys()
    for site in sites[1:]:
        shipped = factory.shipped(site.site, weights)
        loaded = dequantize_at_load(factory.variant(site.site, weights)).initializers
        assert shipped.keys() == weights.keys()
        assert all(np.array_equal(shipped[k], loaded[k]) for k in weights)
        assert any(not np.array_equal(shipped[k], weights[k]) for k in weights)  # rounded
    moved = {k: v + 0.5 for k, v in weights.items()}  # the next round's weights: quantized again
    assert not np.array_equal(factory.shipped(sites[2].site, moved)[next(iter(weights))],
                              factory.shipped(sites[2].site, weights)[next(iter(weights))])


def _train_reply(sent: Message, arrays: dict) -> Message:
    from flwr.app import Metadata, MetricRecord

    meta = Metadata(run_id=1, message_id=f"r{sent.metadata.dst_node_id}", src_node_id=sent.metadata.dst_node_id,
                    dst_node_id=0, reply_to_message_id=sent.metadata.message_id, group_id="", created_at=0.0,
                    ttl=600, message_type=MessageType.TRAIN)
    record = ArrayRecord({k: Array(np.asarray(v, np.float32)) for k, v in arrays.items()})
    return Message(RecordDict({"arrays": record, "metrics": MetricRecord({"num-examples": 10})}), metadata=meta)


def test_a_plain_round_sends_no_weights_beside_the_package_and_names_the_reply_keys(mixed, flower_identity):
    sites, factory, strategy, weights = mixed
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    for message in strategy.personalise(_asks(), arrays, grid=None):
        assert len(message.content["arrays"]) == 0
        assert list(message.content["config"]["reply-keys"]) == list(weights)


def test_central_dp_clips_each_site_against_the_weights_it_was_sent(mixed, flower_identity):
    sites, factory, strategy, weights = mixed
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    sent = strategy.personalise(_asks({"clipping_norm": 1.0}), arrays, grid=None)
    for message, site in zip(sent, sites):
        got = {k: a.numpy() for k, a in message.content["arrays"].items()}
        expected = factory.shipped(site.site, weights)
        assert got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in got)


def test_updates_from_rounded_packages_land_on_the_exact_weights(mixed, flower_identity):
    """reply = shipped + Δ  ⇒  aggregated = weights + mean Δ: the int8/fp16 rounding stays out."""
    sites, factory, strategy, weights = mixed
    arrays = ArrayRecord({k: Array(v) for k, v in weights.items()})
    sent = strategy.personalise(_asks(), arrays, grid=None)
    for i, message in enumerate(sent):  # the grid gives each message its id
        message.metadata.__dict__["_message_id"] = f"m{i}"
    rng = np.random.default_rng(0)
    deltas = [{k: rng.normal(0, 0.01, v.shape).astype(np.float32) for k, v in weights.items()} for _ in sites]
    replies = [_train_reply(m, {k: factory.shipped(s.site, weights)[k] + d[k] for k in weights})
               for m, s, d in zip(sent, sites, deltas)]
    aggregated, _ = strategy.aggregate_train(1, replies)
    for k, v in weights.items():
        expected = v + np.mean([d[k] for d in deltas], axis=0)
        np.testing.assert_allclose(aggregated[k].numpy(), expected, atol=1e-6)
