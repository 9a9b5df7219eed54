"""The device-facing gateway (coordinator/fleet_gateway.py) and the coordinator's process layout
(coordinator/superlink.py): devices reach the Fleet API only; the SuperLink listens on loopback."""

from __future__ import annotations

import pytest

from cuvil_edge.coordinator.fleet_gateway import allowed
from cuvil_edge.coordinator.registry import init_home
from cuvil_edge.coordinator.superlink import gateway_command, superexec_command, superlink_command
from cuvil_edge.coordinator.tls import covers_loopback, make_certs
from cuvil_edge.errors import ConfigError


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/fleet/pull-messages"), ("POST", "/v1/fleet/register-node"), ("GET", "/health")])
def test_fleet_calls_and_the_health_check_pass(method, path):
    assert allowed(method, path)


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/control/start-run"),  # `flwr run`: would run the caller's ServerApp on the coordinator
    ("POST", "/v1/control/list-runs"), ("POST", "/v1/control/stop-run"),
    ("POST", "/v1/runtime/acquire-task"),  # the ServerApp executor's API
    ("GET", "/docs"), ("GET", "/openapi.json"),
    ("GET", "/v1/fleet/pull-messages"),  # Fleet calls are POSTs
    ("POST", "/v1/fleet/../control/start-run"), ("POST", "/v1/fleet//x"), ("POST", "/v1/fleet/%2e%2e/control"),
    ("POST", "/v1/fleetx/start-run"), ("POST", "/V1/fleet/x"), ("POST", "/v1/fleet\\..\\control"),
])
def test_everything_else_is_refused(method, path):
    assert not allowed(method, path)


@pytest.fixture
def home(tmp_path):
    home = init_home(tmp_path / "coordinator")
    make_certs(home / "tls", ["coordinator.example"])
    return home


def test_the_superlink_listens_on_loopback_in_process_isolation_with_the_runtime_secret(home):
    command = superlink_command(home, "127.0.0.1:9092")
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--isolation") + 1] == "process"
    secret = command[command.index("--superexec-auth-secret-file") + 1]
    assert (home / "superexec.secret").samefile(secret) and (home / "superexec.secret").stat().st_mode & 0o077 == 0
    executor = superexec_command(home, "127.0.0.1:9092")  # our gate, holding the same secret
    assert "cuvil_edge.coordinator.serverapp_gate" in executor and secret in executor


@pytest.mark.parametrize("operator", ["0.0.0.0:9092", "10.0.0.5:9092", "coordinator.example:9092", "[::]:9092"])
def test_the_superlink_is_never_exposed(home, operator):
    with pytest.raises(ConfigError, match="loopback"):
        superlink_command(home, operator)


def test_the_gateway_cannot_take_the_superlinks_own_port(home):
    with pytest.raises(ConfigError, match="own loopback port"):
        gateway_command(home, "127.0.0.1:9092", "127.0.0.1:9092")
    assert "0.0.0.0:9093" in gateway_command(home, "0.0.0.0:9093", "127.0.0.1:9092")


def test_server_certificates_cover_loopback_and_old_ones_are_refused_with_the_fix(home, tmp_path):
    assert covers_loopback(home / "tls" / "server.crt")  # made for coordinator.example only, 127.0.0.1 added
    from cryptography import x509

    names = x509.load_pem_x509_certificate((home / "tls" / "server.crt").read_bytes()).extensions
    assert "coordinator.example" in str(names)
    (home / "tls" / "server.crt").write_bytes((home / "tls" / "ca.crt").read_bytes())  # no 127.0.0.1 in it
    with pytest.raises(ConfigError, match="certs --force"):
        superlink_command(home, "127.0.0.1:9092")


def _call(home, method: str, path: str, headers: list[tuple[bytes, bytes]], body_chunks: list[bytes]) -> int:
    """Drive the gateway's ASGI interface as uvicorn would, with nothing listening upstream
    (127.0.0.1:1); the status it answers."""
    import asyncio

    from cuvil_edge.coordinator.fleet_gateway import FleetGateway

    async def run() -> int:
        gateway = FleetGateway("https://127.0.0.1:1", cafile=str(home / "tls" / "ca.crt"))
        pending = [{"type": "http.request", "body": c, "more_body": i < len(body_chunks) - 1}
                   for i, c in enumerate(body_chunks)] or [{"type": "http.request", "body": b""}]
        sent: list[dict] = []

        async def receive() -> dict:
            return pending.pop(0)

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": path, "headers": headers, "query_string": b"",
                 "client": ("203.0.113.9", 4242)}
        await gateway(scope, receive, send)
        await gateway.client.aclose()
        return sent[0]["status"]

    return asyncio.run(run())


def test_an_oversized_body_is_refused_before_it_is_read(home):
    from cuvil_edge.coordinator.fleet_gateway import MAX_BODY_BYTES

    declared = [(b"content-length", str(MAX_BODY_BYTES + 1).encode())]
    assert _call(home, "POST", "/v1/fleet/push-object", declared, [b"x"]) == 413


def test_a_body_that_grows_past_the_limit_is_refused(home):
    from cuvil_edge.coordinator import fleet_gateway

    chunk = b"\0" * (1 << 20)
    chunks = [chunk] * (fleet_gateway.MAX_BODY_BYTES // len(chunk) + 1)  # chunked: no length declared
    assert _call(home, "POST", "/v1/fleet/push-object", [], chunks) == 413


def test_a_refused_path_never_reaches_the_superlink(home):
    """The upstream (port 1) is never contacted: the answer is 404, not the 502 of a failed forward."""
    assert _call(home, "POST", "/v1/control/start-run", [], [b"run my app"]) == 404
    assert _call(home, "POST", "/v1/fleet/pull-messages", [], [b""]) == 502  # an allowed path is forwarded
