"""The agent's inference path: verify -> accept -> build -> run, against onnxruntime."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.config import load_site
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.errors import PackageError, PackageSizeError, RollbackError, SignatureError, WrongSiteError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir_serialize import write_package

SITES = Path(__file__).resolve().parents[2] / "configs" / "sites"


@pytest.fixture
def setup(tmp_path):
    private, public = init_keys(tmp_path / "keys")
    site = load_site(SITES / "fleet-c.yaml")
    agent = AgentRuntime(site, tmp_path / "state", public)
    graph = load_model(digits_cnn_onnx(3))

    def package(version, site_id="fleet-c", target="ascend-310", key=private):
        now = int(time.time())
        keys = load_signing_keys(key)
        return write_package(graph, site=site_id, target=target, version=version, signing_key=keys.coordinator,
                             release_key=keys.release, issued_at=now, expires=now + 60)

    return agent, package, tmp_path


def test_activated_package_matches_onnxruntime(setup):
    agent, package, _ = setup
    activated = agent.activate(package(1))
    x = np.random.default_rng(0).random((7, 1, 8, 8), dtype=np.float32)
    ours = activated.model.run({"image": x})["probs"]
    ref = ort.InferenceSession(digits_cnn_onnx(3)).run(None, {"image": x})[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
    assert activated.model.target.name == "ascend-310"


def test_quantized_packages_are_widened_once_at_load(tmp_path):
    """An int8 or fp16 package: the agent folds its weight dequantization before it builds (the
    module computes in fp32 without expanding the weights on every run), and a new round's
    quantized weights reuse the cached build."""
    from cuvil_edge.passes import optimize
    from cuvil_edge.passes.quantize import calibrate_ranges, quantize_int8, store_fp16

    private, public = init_keys(tmp_path / "keys")
    keys = load_signing_keys(private)
    agent = AgentRuntime(load_site(SITES / "factory-b.yaml"), tmp_path / "state", public)
    graph, _ = optimize(load_model(digits_cnn_onnx(3)))
    x = np.random.default_rng(0).random((16, 1, 8, 8), dtype=np.float32)
    now = int(time.time())
    ref = ort.InferenceSession(digits_cnn_onnx(3)).run(None, {"image": x})[0]
    variants = [store_fp16(graph), quantize_int8(graph, calibrate_ranges(graph, x)),
                quantize_int8(graph, calibrate_ranges(graph, x * 0.9))]  # the last: other ranges, same structure
    hits = []
    for version, variant in enumerate(variants, start=1):
        activated = agent.activate(write_package(variant, site="factory-b", target="rpi4", version=version,
                                                 signing_key=keys.coordinator, release_key=keys.release,
                                                 issued_at=now, expires=now + 60))
        # the weights' DequantizeLinear / Cast were folded into float32 initializers; activation pairs remain
        assert not any(n.op_type == "Cast" or (n.op_type == "DequantizeLinear" and n.inputs[0] in variant.initializers)
                       for n in activated.model.graph.nodes)
        assert all(a.dtype != np.int8 or a.size == 1 for a in activated.model.graph.initializers.values())
        np.testing.assert_allclose(activated.model.run({"image": x})["probs"], ref, atol=0.02)
        hits.append(activated.model.cache_hit)
    assert hits == [False, False, True]


def test_redelivery_is_idempotent_and_older_is_refused(setup):
    agent, package, _ = setup
    first = package(1)
    agent.activate(first)
    agent.activate(first)  # same version, same manifest digest: accepted again (PACKAGE_SPEC §11)
    agent.activate(package(2))
    with pytest.raises(RollbackError):
        agent.activate(first)


def test_rejections_accept_nothing(setup):
    agent, package, tmp_path = setup
    other_private, _ = init_keys(tmp_path / "other-keys")
    with pytest.raises(SignatureError):
        agent.activate(package(5, key=other_private))
    with pytest.raises(WrongSiteError):
        agent.activate(package(5, site_id="hospital-a"))
    assert agent.rollback.last_accepted("fleet-c") is None
    assert agent.kept_packages() == []  # rejected bytes never touch the disk
    agent.activate(package(1))  # nothing above was accepted, so version 1 is still new


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def test_oversize_blob_refused_before_anything_touches_the_disk(setup):
    agent, package, tmp_path = setup
    before = _files(tmp_path / "state")
    with pytest.raises(PackageSizeError):
        agent.activate(bytes(agent.max_package_bytes + 1))
    garbage = b"CUVLSPK\0" + bytes(10_000)
    with pytest.raises(PackageError):
        agent.activate(garbage)
    assert _files(tmp_path / "state") == before  # no package file, no state change


def test_only_the_newest_verified_packages_are_kept(setup):
    agent, package, _ = setup
    keep = agent.site.agent.keep_packages
    for version in range(1, keep + 3):
        agent.activate(package(version))
    kept = agent.kept_packages()
    assert [int(p.name[1:21]) for p in kept] == list(range(3, keep + 3))
    assert kept[-1].read_bytes()[:8] == b"CUVLSPK\0"


def test_inference_path_imports_neither_torch_nor_onnx(setup):
    agent, package, tmp_path = setup
    (tmp_path / "p.cpkg").write_bytes(package(1))
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from cuvil_edge.agent.runtime import AgentRuntime
        from cuvil_edge.config import load_site
        agent = AgentRuntime(load_site({str(SITES / 'fleet-c.yaml')!r}), {str(tmp_path / 'state2')!r},
                             {str(tmp_path / 'keys' / 'root.json')!r})
        activated = agent.activate(open({str(tmp_path / 'p.cpkg')!r}, 'rb').read())
        activated.model.run({{"image": np.zeros((2, 1, 8, 8), np.float32)}})
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'onnx', 'opacus', 'flwr'))
        print('HEAVY', heavy)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_a_site_trains_on_its_fp16_package_and_returns_every_float32_weight(tmp_path):
    """The agent trains the graph as loaded (fp16 weights widened), and answers with the same weight
    names the coordinator sent (the fp32 model's float32 initializers)."""
    from cuvil_edge.agent.training import train_round
    from cuvil_edge.datasets.records import Records
    from cuvil_edge.passes.quantize import store_fp16
    from cuvil_edge.privacy import PrivacyLedger

    private, public = init_keys(tmp_path / "keys")
    keys = load_signing_keys(private)
    site = load_site(SITES / "factory-b.yaml")
    site = site.model_copy(update={"training": site.training.model_copy(update={"local_epochs": 1,
                                                                                "sample_rate": 0.25})})
    agent = AgentRuntime(site, tmp_path / "state", public)
    graph = load_model(digits_cnn_onnx(3))
    now = int(time.time())
    activated = agent.activate(write_package(store_fp16(graph), site="factory-b", target="rpi4", version=1,
                                             signing_key=keys.coordinator, release_key=keys.release, issued_at=now,
                                             expires=now + 60))
    rng = np.random.default_rng(0)
    data = Records(rng.random((128, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, 128))
    ledger = PrivacyLedger(tmp_path / "ledger.sqlite", site=site.site, epsilon_budget=site.privacy.epsilon_budget,
                           delta=site.privacy.delta)
    outcome = train_round(activated.model.graph, site, data, ledger, 1, 1, seed=0)
    sent = {k for k, v in graph.initializers.items() if v.dtype == np.float32}
    assert set(outcome.weights) == sent
    assert any(not np.allclose(outcome.weights[k], graph.initializers[k], atol=1e-3) for k in sent)  # it trained
