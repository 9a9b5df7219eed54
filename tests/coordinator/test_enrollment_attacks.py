"""Attacks on enrollment, one named test each: keys and targets crafted to count as a second site, to
crash the CLI or its status table, or to leave a half-done registration.

Registration failures are real ones: a stand-in SuperLink that answers its health check but
refuses the Control API, a home whose SuperLink is down, and (one test) a real SuperLink on
127.0.0.1 that refuses a key it already holds. Every process started here is stopped by PID.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cuvil_edge.agent.enroll import init_site
from cuvil_edge.cli.main import main
from cuvil_edge.config import load_site
from cuvil_edge.config.enrollment import Enrollment
from cuvil_edge.config.home import keys_dir
from cuvil_edge.coordinator.registry import SiteRegistry, init_home
from cuvil_edge.coordinator.superlink import free_port, register_enrolled, start_superlink, write_connection
from cuvil_edge.coordinator.tls import make_certs, tls_files
from cuvil_edge.device_targets import list_targets
from cuvil_edge.errors import ConfigError, UnknownTargetError

SITES = Path(__file__).resolve().parents[2] / "configs" / "sites"


@pytest.fixture
def federation(tmp_path):
    home = init_home(tmp_path / "coordinator")
    make_certs(home / "tls", ["127.0.0.1"])
    return home


def _device(tmp_path: Path, federation: Path, name: str):
    """A device set up as hospital-a: its enrollment file as a dict (what the attacker edits)."""
    setup = init_site(load_site(SITES / "hospital-a.yaml"), keys_dir(federation) / "root.json",
                      ca=federation / "tls" / "ca.crt", home=tmp_path / name)
    return json.loads(setup.enrollment_file.read_text())


def _file(tmp_path: Path, doc: dict | str, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return path


def _enroll(path: Path, home: Path) -> int:
    return main(["coordinator", "enroll", str(path), "--home", str(home)])


def _old_registry(home: Path, sites: dict[str, dict]) -> None:
    """sites.json as an older version wrote it: entries stored as they came."""
    (home / "sites.json").write_text(json.dumps({"format": 1, "sites": sites}), encoding="utf-8")


def _entry(doc: dict, **changes) -> dict:
    return {"target": doc["target"], "node_public_key": doc["node_public_key"], "seal_public_key":
            doc["seal_public_key"], "enrolled_at": 1, **changes}


@pytest.mark.parametrize("suffix", [" laptop-of-mallory", " ", "\t"], ids=["comment", "space", "tab"])
def test_one_key_with_a_comment_is_not_a_second_site(tmp_path, federation, capsys, suffix):
    doc = _device(tmp_path, federation, "dev")
    assert _enroll(_file(tmp_path, doc, "first"), federation) == 0
    before = (federation / "sites.json").read_bytes()
    again = {**doc, "site": "factory-b", "node_public_key": doc["node_public_key"] + suffix}

    code = _enroll(_file(tmp_path, again, "again"), federation)

    assert code == 2 and "already enrolled as site 'hospital-a'" in capsys.readouterr().err
    assert (federation / "sites.json").read_bytes() == before


def test_a_key_stored_with_a_comment_by_an_older_version_is_still_one_site(tmp_path, federation):
    doc = _device(tmp_path, federation, "dev")
    _old_registry(federation, {"hospital-a": _entry(doc, node_public_key=doc["node_public_key"] + " old\u2003")})
    registry = SiteRegistry(federation)

    with pytest.raises(ConfigError, match="already enrolled as site 'hospital-a'"):
        registry.enroll(Enrollment.from_json(json.dumps({**doc, "site": "factory-b"}), "enrollment.json"))
    registry.enroll(Enrollment.from_json(json.dumps(doc), "enrollment.json"))  # the same device again, no --replace
    assert registry.sites()["hospital-a"]["node_public_key"] == doc["node_public_key"]  # stored canonical now


@pytest.mark.parametrize("where", ["end", "middle"])
def test_non_ascii_space_in_key_is_refused(tmp_path, federation, capsys, where):
    doc = _device(tmp_path, federation, "dev")
    kind, blob = doc["node_public_key"].split()
    key = f"{kind} {blob}\u2003" if where == "end" else f"{kind}\u2003{blob}"
    before = (federation / "sites.json").read_bytes()

    with pytest.raises(ConfigError, match="non-ASCII"):
        Enrollment.from_json(json.dumps({**doc, "node_public_key": key}), "enrollment.json")
    assert _enroll(_file(tmp_path, {**doc, "node_public_key": key}, "e"), federation) == 2
    assert "non-ASCII" in capsys.readouterr().err and (federation / "sites.json").read_bytes() == before


def test_a_stored_non_ascii_key_is_registered_canonical_not_a_crash(tmp_path, federation):
    """An older version stored the key with a trailing U+2003; `serve` crashed on UnicodeEncodeError."""
    doc = _device(tmp_path, federation, "dev")
    _old_registry(federation, {"hospital-a": _entry(doc, node_public_key=doc["node_public_key"] + "\u2003")})
    write_connection(federation, f"127.0.0.1:{free_port()}")  # a SuperLink that is down

    added, failed = register_enrolled(federation)

    assert added == {} and "unavailable" in failed["hospital-a"]  # a reported failure, not an exception
    assert (federation / "flwr" / "hospital-a.pub").read_text() == doc["node_public_key"] + "\n"


@pytest.mark.parametrize("target", ["not-a-device", "x" * 8030, "rpi4\x1b[2J\x1b[31m", "rpi4\n"],
                         ids=["unknown", "8030-characters", "ansi-escapes", "newline"])
def test_unknown_target_is_refused(tmp_path, federation, capsys, target):
    doc = {**_device(tmp_path, federation, "dev"), "target": target}
    before = (federation / "sites.json").read_bytes()

    with pytest.raises(UnknownTargetError, match="known targets: " + ", ".join(list_targets())) as caught:
        Enrollment.from_json(json.dumps(doc), "enrollment.json")
    assert _enroll(_file(tmp_path, doc, "e"), federation) == 2

    assert len(str(caught.value)) < 400 and "\x1b" not in str(caught.value) and "\x1b" not in capsys.readouterr().err
    assert (federation / "sites.json").read_bytes() == before


def test_markup_in_target_does_not_crash_or_write(tmp_path, federation, capsys):
    doc = {**_device(tmp_path, federation, "dev"), "target": "[/x]"}
    before = (federation / "sites.json").read_bytes()

    code = _enroll(_file(tmp_path, doc, "e"), federation)  # was: rich.errors.MarkupError after writing

    assert code == 2 and "unknown device target '[/x]'" in capsys.readouterr().err
    assert (federation / "sites.json").read_bytes() == before


def test_markup_and_escapes_in_a_stored_target_are_shown_inert_by_status(tmp_path, federation, capsys):
    doc = _device(tmp_path, federation, "dev")
    _old_registry(federation, {"hospital-a": _entry(doc, target="[/x]\x1b[2J[bold]")})

    code = main(["status", "--home", str(federation)])  # was: rich.errors.MarkupError

    out = capsys.readouterr().out
    assert code == 0 and "[/x]" in out and "\x1b" not in out


def test_duplicate_site_key_is_refused(tmp_path, federation):
    doc = _device(tmp_path, federation, "dev")
    text = json.dumps(doc).replace("{", '{"site": "factory-b", ', 1)  # json.loads would keep the last one

    with pytest.raises(ConfigError, match="'site' appear twice"):
        Enrollment.from_json(text, "enrollment.json")


class _RefusingSuperLink(BaseHTTPRequestHandler):
    """Answers the health check as a SuperLink does, refuses every Control API call."""

    def do_GET(self):  # noqa: N802 - the http.server interface
        self._answer(200 if self.path == "/health" else 503)

    def do_POST(self):  # noqa: N802
        self._answer(503)

    def _answer(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


@pytest.fixture
def refusing_superlink(federation):
    """A stand-in SuperLink on 127.0.0.1 with the home's certificate, written as the connection."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingSuperLink)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls = tls_files(federation / "tls")
    context.load_cert_chain(tls.server_cert, tls.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    write_connection(federation, f"127.0.0.1:{server.server_address[1]}")
    yield federation
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_failed_registration_writes_nothing(tmp_path, refusing_superlink, capsys):
    home = refusing_superlink
    doc = _device(tmp_path, home, "dev")
    before = (home / "sites.json").read_bytes()

    code = _enroll(_file(tmp_path, doc, "e"), home)

    assert (home / "sites.json").read_bytes() == before  # was: the entry stayed, and `serve` then exited 2
    assert code == 2 and "Nothing was enrolled" in capsys.readouterr().err


def test_one_failing_site_does_not_stop_the_others(tmp_path, federation, caplog):
    """A real SuperLink; the registry an older version left after the attack: one key as two sites
    (the second with a comment), then an honest site. The SuperLink refuses the key the second time."""
    first, honest = _device(tmp_path, federation, "dev1"), _device(tmp_path, federation, "dev2")
    _old_registry(federation, {"site-a": _entry(first), "site-b": _entry(first, node_public_key=first[
        "node_public_key"] + " copy"), "site-c": _entry(honest)})
    caplog.set_level(logging.WARNING, logger="cuvil_edge.coordinator.superlink")

    link = start_superlink(federation, f"127.0.0.1:{free_port()}", log_file=tmp_path / "superlink.log",
                           operator_address=f"127.0.0.1:{free_port()}")
    try:
        sites = SiteRegistry(federation).sites()
    finally:
        link.terminate()  # by PID; `serve` started, which is the point

    assert set(link.unregistered) == {"site-b"}  # what `serve` prints

    assert sites["site-a"].get("node_id") and sites["site-c"].get("node_id") and not sites["site-b"].get("node_id")
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "'site-b'" in warning and "already in use" in warning
