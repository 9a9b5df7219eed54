"""Coordinator home, TLS material, device set-up and enrollment."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from cuvil_edge.agent.enroll import init_site
from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.cli.main import main
from cuvil_edge.config import load_site
from cuvil_edge.config.enrollment import Enrollment
from cuvil_edge.config.home import keys_dir, site_state_dir
from cuvil_edge.coordinator.keys import load_signing_keys
from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
from cuvil_edge.coordinator.registry import SiteRegistry, init_home
from cuvil_edge.coordinator.tls import make_certs
from cuvil_edge.errors import ConfigError, KeyFileError, StateError, WrongSealKeyError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx

SITES = Path(__file__).resolve().parents[2] / "configs" / "sites"


def _private(path: Path) -> bool:
    return stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_coordinator_init_makes_a_durable_home_once(tmp_path):
    home = init_home(tmp_path / "home")
    assert (keys_dir(home) / "root.json").exists() and (home / "sites.json").exists()
    assert (home / "versions.json").read_text() == "{}" and (home / "checkpoints").is_dir()
    root = (keys_dir(home) / "root.json").read_bytes()
    with pytest.raises(KeyFileError, match="--force"):
        init_home(home)
    assert (keys_dir(home) / "root.json").read_bytes() == root  # nothing replaced


def test_certs_chain_to_the_ca_and_name_the_hosts(tmp_path):
    files = make_certs(tmp_path / "tls", ["127.0.0.1", "coordinator.example"])
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(files.server_cert.read_bytes())
    ca.public_key().verify(server.signature, server.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["coordinator.example"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert _private(files.ca_key) and _private(files.server_key)
    with pytest.raises(KeyFileError):
        make_certs(tmp_path / "tls", ["127.0.0.1"])  # an existing server certificate is kept
    again = make_certs(tmp_path / "tls", ["10.0.0.5"], force=True)  # same CA, new server certificate
    assert again.ca_cert.read_bytes() == files.ca_cert.read_bytes()
    with pytest.raises(ConfigError):
        make_certs(tmp_path / "other", ["bad host/name"])


@pytest.fixture
def federation(tmp_path):
    home = init_home(tmp_path / "coordinator")
    make_certs(home / "tls", ["127.0.0.1"])
    return home


def _device(tmp_path: Path, federation: Path, name: str, site_file: str = "hospital-a.yaml"):
    site = load_site(SITES / site_file)
    setup = init_site(site, keys_dir(federation) / "root.json", ca=federation / "tls" / "ca.crt",
                      home=tmp_path / name)
    return site, setup


def test_agent_init_pins_trust_and_writes_only_public_material(tmp_path, federation):
    site, setup = _device(tmp_path, federation, "device")
    assert setup.state_dir == site_state_dir(site, tmp_path / "device")
    text = setup.enrollment_file.read_text()
    assert "PRIVATE" not in text and Enrollment.from_json(text, "x") == setup.enrollment
    assert _private(setup.node_key) and _private(setup.state_dir / "keys" / "seal.key")
    assert (setup.state_dir / "ca.crt").read_bytes() == (federation / "tls" / "ca.crt").read_bytes()
    state = json.loads((setup.state_dir / "anti_rollback.json").read_text())
    assert state["root"] == json.loads((keys_dir(federation) / "root.json").read_bytes())
    with pytest.raises(KeyFileError, match="already set up"):
        _device(tmp_path, federation, "device")


def test_one_site_one_device_one_device_one_site(tmp_path, federation):
    registry = SiteRegistry(federation)
    _, first = _device(tmp_path, federation, "dev1")
    _, second = _device(tmp_path, federation, "dev2")  # another device claiming hospital-a
    registry.enroll(first.enrollment)
    with pytest.raises(ConfigError, match="another node key"):
        registry.enroll(second.enrollment)
    stolen = Enrollment("factory-b", "rpi4", first.enrollment.node_public_key, second.enrollment.seal_public_key)
    with pytest.raises(ConfigError, match="already enrolled as site 'hospital-a'"):
        registry.enroll(stolen)
    registry.enroll(second.enrollment, replace=True)  # the device was replaced
    assert registry.sites()["hospital-a"]["node_public_key"] == second.enrollment.node_public_key


@pytest.mark.parametrize("change, match", [
    (lambda d: d.update(extra=1), "exactly the fields"),
    (lambda d: d.update(site="../etc"), "site id"),
    (lambda d: d.update(node_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBtZ3kT5Y6mVv0fW0aV0aV0aV0aV0aV0aV0aV0aV0aV0"),
     "P-384|OpenSSH"),
    (lambda d: d.update(seal_public_key="zz" * 32), "64 lowercase hex"),
    (lambda d: d.update(format=2), "format"),
])
def test_malformed_enrollment_is_refused_with_a_named_field(tmp_path, federation, change, match):
    _, setup = _device(tmp_path, federation, "dev")
    doc = json.loads(setup.enrollment_file.read_text())
    change(doc)
    with pytest.raises(ConfigError, match=match):
        Enrollment.from_json(json.dumps(doc), "enrollment.json")


def test_packages_for_an_enrolled_site_are_sealed_for_it(tmp_path, federation):
    site, setup = _device(tmp_path, federation, "dev")
    _, other = _device(tmp_path, federation, "thief")
    assert main(["coordinator", "enroll", str(setup.enrollment_file), "--home", str(federation)]) == 0
    registry = SiteRegistry(federation)
    factory = PackageFactory(load_model(digits_cnn_onnx(0)), [site], load_signing_keys(keys_dir(federation) /
                             "coordinator.key"), VersionCounter(federation / "versions.json"), 600,
                             seal_keys=registry.seal_keys())
    graph = factory.graph
    package = factory.issue(site.site, {k: v for k, v in graph.initializers.items() if v.dtype.kind == "f"}).data
    assert b"CUVLIRC" not in package  # the payload is sealed, not in the clear
    agent = AgentRuntime(site, setup.state_dir, keys_dir(federation) / "root.json", clock=time.time)
    assert agent.activate(package).package.manifest.site == site.site
    intruder = AgentRuntime(site, other.state_dir, keys_dir(federation) / "root.json")  # another device's keys
    with pytest.raises(WrongSealKeyError):
        intruder.activate(package)


def test_a_replaced_devices_registration_is_queued_for_withdrawal(tmp_path, federation):
    registry = SiteRegistry(federation)
    _, first = _device(tmp_path, federation, "dev1")
    _, second = _device(tmp_path, federation, "dev2")
    registry.enroll(first.enrollment)
    registry.set_node_id("hospital-a", "101")
    registry.enroll(first.enrollment)  # the same device again: still registered
    assert registry.sites()["hospital-a"]["node_id"] == "101"
    registry.enroll(second.enrollment, replace=True)
    entry = registry.sites()["hospital-a"]
    assert "node_id" not in entry and entry["unregister"] == ["101"]  # `serve` withdraws it, then registers
    registry.set_node_id("hospital-a", "202")
    assert registry.sites()["hospital-a"]["node_id"] == "202" and "unregister" not in registry.sites()["hospital-a"]


def test_status_shows_enrolled_sites_their_epsilon_and_an_unreachable_superlink(tmp_path, federation):
    from cuvil_edge.coordinator.status import federation_status

    _, setup = _device(tmp_path, federation, "dev")
    SiteRegistry(federation).enroll(setup.enrollment)
    run = federation / "runs" / "run-20261130-000000"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"rounds": [{"round": 3, "sites": {
        "hospital-a": {"status": "ok", "eps-spent": 2.5, "eps-remaining": 5.5}}}]}))
    st = federation_status(federation)
    assert st.last_round == 3 and st.run_dir == run and "not started" in st.superlink
    [site] = st.sites
    assert (site.site, site.registered, site.online, site.eps_spent) == ("hospital-a", False, None, 2.5)
    assert main(["status", "--home", str(federation)]) == 0


def test_a_crash_while_enrolling_leaves_the_registry_as_it_was(tmp_path, federation, monkeypatch):
    registry = SiteRegistry(federation)
    _, first = _device(tmp_path, federation, "dev1")
    registry.enroll(first.enrollment)
    before = (federation / "sites.json").read_bytes()
    other = Enrollment("factory-b", "rpi4", _device(tmp_path, federation, "dev2", "factory-b.yaml")[1]
                       .enrollment.node_public_key, first.enrollment.seal_public_key)

    def crash(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StateError):
        registry.enroll(other)
    monkeypatch.undo()
    assert (federation / "sites.json").read_bytes() == before
