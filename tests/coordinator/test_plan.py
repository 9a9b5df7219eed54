"""The compile plan (issue 13, item 5): per site and precision, package bytes, planned peak memory
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
    with pytest.raises(PlanError, match="cannot issue yet"):
        PackageFactory(graph, [site], load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                       VersionCounter(tmp_path / "versions.json"), 600, precisions={site.site: "int8"})


def test_a_refused_site_is_sent_nothing_and_the_others_still_are(tmp_path, graph, flower_identity):
    sites = load_federation(ROOT / "configs" / "federation.yaml").load_sites()
    init_keys(tmp_path / "keys")
    refused = {sites[1].site: "its fp32 package breaks its plan: memory 0.04 MiB > limits.memory_mb 0.001"}
    factory = PackageFactory(graph, sites, load_signing_keys(tmp_path / "keys" / "coordinator.key"),
                             VersionCounter(tmp_path / "versions.json"), 600, refused=refused)
    with pytest.raises(PlanError, match="limits.memory_mb"):
        factory.issue(sites[1].site, {})
    strategy = SitePackageFedAvg(factory, fraction_train=1.0, min_train_nodes=2, min_available_nodes=2)
    strategy.node_to_site = {11: sites[0].site, 12: sites[1].site, 13: sites[2].site}
    arrays = ArrayRecord({k: Array(np.array(v)) for k, v in graph.initializers.items() if v.dtype == np.float32})
    asks = [Message(RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=n,
                    message_type=MessageType.TRAIN) for n in (11, 12, 13)]
    sent = strategy._personalise(asks, arrays, grid=None)
    assert [m.metadata.dst_node_id for m in sent] == [11, 13]
    stats = strategy.rounds[1][sites[1].site]
    assert stats["status"] == NOT_PUSHED_STATUS and "limits.memory_mb" in stats["train-error"]
    shown = {site: {"target": "x", **entry} for site, entry in strategy.rounds[1].items()}
    assert "not pushed" in format_round({"round": 1, "global_accuracy": 0.5, "sites": shown, "dropped_out": []})


def test_the_shipped_federation_plans_every_site(graph):
    federation = load_federation(ROOT / "configs" / "federation.yaml")
    plans = plan_federation(graph, federation.load_sites(), {"fp32": graph})
    assert [p.chosen.precision for p in plans] == ["fp32"] * len(plans)
