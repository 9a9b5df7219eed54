"""The SuperLink's Control API, asked from this process: what `flwr ls`, `flwr stop` and
`flwr supernode list/register/unregister` ask, without starting `flwr` for each question.

Each `flwr` command is a new Python process that imports Flower's CLI: about 1.5 CPU-seconds
before it sends one request. `cuvil-edge run` asks several times per run (the runs before and
after, the sites online), and whatever waits on a federation asks every few seconds, so on a small
coordinator these start-ups cost more CPU than the SuperLink itself. Here the same requests go over
the same connection (the ``[superlink.NAME]`` entry `coordinator serve` writes in the home's
``flwr/config.toml``: address, and the CA to pin or ``insecure``), and the answers are turned into
the very dicts the CLI prints with ``--format json``, by Flower's own formatters, so callers read
one shape whichever way they asked. Flower's errors keep Flower's words.

`flwr run` stays a command: it builds and uploads the app and streams the run's log.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cuvil_edge.errors import DeploymentError

#: Seconds one request may take (`flwr`'s own client waits 30 s).
TIMEOUT_S = 30.0


class ControlAPIError(DeploymentError):
    """The SuperLink did not answer, or refused, a Control API request."""


def config_file(home: Path) -> Path:
    """Where the `flwr` connections of ``home`` are (what ``FLWR_HOME`` is for Flower's CLI)."""
    return Path(home) / "flwr" / "config.toml"


def _connection(home: Path, name: str) -> tuple[str, bool, bytes | None]:
    """(address, insecure, CA certificate) of connection ``name`` in ``home``'s `flwr` config."""
    path = config_file(home)
    try:
        entry = tomllib.loads(path.read_text(encoding="utf-8"))["superlink"][name]
        address = str(entry["address"])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError) as e:
        raise ControlAPIError(
            f"no SuperLink connection {name!r} in {path} ({type(e).__name__}); `cuvil-edge coordinator serve` writes it"
        ) from None
    insecure = entry.get("insecure") is True
    ca = None
    if not insecure:
        ca_path = Path(str(entry.get("root-certificates", "")))
        try:
            ca = ca_path.read_bytes()
        except OSError as e:
            raise ControlAPIError(f"the CA of connection {name!r} cannot be read ({ca_path}: {e.strerror})") from None
    return address, insecure, ca


@contextmanager
def _client(home: Path, name: str, what: str) -> Iterator[Any]:
    """A Control API client for connection ``name``; Flower's errors become :class:`ControlAPIError`
    with Flower's message (the one `flwr` would print), naming the command ``what`` stands for."""
    import click
    from flwr.cli.cli_client_interceptor import CliClientHttpInterceptor
    from flwr.cli.utils import flwr_cli_exc_handler
    from flwr.supercore.control import ControlHttpClient
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor

    address, insecure, ca = _connection(home, name)
    try:
        client = ControlHttpClient.from_server_address(
            server_address=address,
            insecure=insecure,
            root_certificates=ca,
            # the headers `flwr` sends: the SuperLink checks the caller's Flower version
            interceptors=[CliClientHttpInterceptor(), RuntimeVersionHttpInterceptor(component_name="flwr CLI")],
        )
    except (ValueError, OSError) as e:  # a CA that is not a certificate
        raise ControlAPIError(f"cannot connect to the SuperLink at {address}: {e}") from None
    try:
        with flwr_cli_exc_handler():
            yield client
    except click.ClickException as e:
        raise ControlAPIError(f"the SuperLink did not answer `{what}`: {' '.join(e.message.split())[:300]}") from None
    except OSError as e:  # below httpx: a TLS or socket failure it did not wrap
        raise ControlAPIError(f"the SuperLink did not answer `{what}`: {e}") from None
    finally:
        client.close()


def _ask(home: Path, name: str, what: str, call: Callable[[Any], Any]) -> Any:
    with _client(home, name, what) as client:
        return call(client)


def runs(home: Path, connection: str) -> list[dict]:
    """The SuperLink's runs, newest first, as `flwr ls --format json` lists them ("run-id",
    "status", "status-details", "fab-id", "pending-at", ...).

    Raises:
        ControlAPIError: no such connection, or the SuperLink did not answer.
    """
    from flwr.cli.ls import _to_json
    from flwr.cli.run_utils import format_runs
    from flwr.common.serde import run_from_proto
    from flwr.proto.control_pb2 import ListRunsRequest

    answer = _ask(home, connection, "flwr ls", lambda c: c.ListRuns(ListRunsRequest()))
    rows = format_runs([run_from_proto(proto) for proto in answer.run_dict.values()], answer.now)
    return list(json.loads(_to_json(rows))["runs"])


def nodes(home: Path, connection: str) -> list[dict]:
    """The SuperNodes registered with the SuperLink, as `flwr supernode list --format json` lists
    them ("node-id" as a string, "status" "online" / "offline" / ..., "owner-name", ...).

    Raises:
        ControlAPIError: no such connection, or the SuperLink did not answer.
    """
    from flwr.cli.supernode.ls import _format_nodes, _to_json
    from flwr.proto.control_pb2 import ListNodesRequest

    answer = _ask(home, connection, "flwr supernode list", lambda c: c.ListNodes(ListNodesRequest()))
    return list(json.loads(_to_json(_format_nodes(list(answer.nodes_info), answer.now), verbose=False))["nodes"])


def register_node(home: Path, connection: str, public_key: bytes, name: str) -> str:
    """Register a SuperNode's public key (OpenSSH format, as `flwr supernode register KEY_FILE` reads it) under
    ``name``; the node id the SuperLink assigned.

    Raises:
        ControlAPIError: the SuperLink refused (a key registered already) or did not answer.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.proto.control_pb2 import RegisterNodeRequest
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes, uses_nist_ec_curve

    # what `flwr supernode register` checks (it exits the process on a bad key) and how it encodes it
    try:
        key = serialization.load_ssh_public_key(public_key)
    except (ValueError, UnsupportedAlgorithm) as e:
        raise ControlAPIError(f"the node key of {name!r} is not an OpenSSH public key ({e})") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not uses_nist_ec_curve(key):
        raise ControlAPIError(f"the node key of {name!r} is not an elliptic-curve key on a NIST curve")
    encoded = public_key_to_bytes(key)
    request = RegisterNodeRequest(public_key=encoded, name=name)
    answer = _ask(home, connection, "flwr supernode register", lambda c: c.RegisterNode(request=request))
    if not answer.node_id:
        raise ControlAPIError("`flwr supernode register` answered no node id")
    return str(answer.node_id)


def unregister_node(home: Path, connection: str, node_id: str | int) -> None:
    """Withdraw a registration: that node's key stops working.

    Raises:
        ControlAPIError: no such node, or the SuperLink did not answer.
    """
    from flwr.proto.control_pb2 import UnregisterNodeRequest

    request = UnregisterNodeRequest(node_id=int(node_id))
    _ask(home, connection, "flwr supernode unregister", lambda c: c.UnregisterNode(request=request))


def stop_run(home: Path, connection: str, run_id: str | int) -> None:
    """Ask the SuperLink to stop a run.

    Raises:
        ControlAPIError: the SuperLink refused (no such run, finished already) or did not answer.
    """
    from flwr.proto.control_pb2 import StopRunRequest

    request = StopRunRequest(run_id=int(run_id))
    answer = _ask(home, connection, "flwr stop", lambda c: c.StopRun(request=request))
    if not answer.success:
        raise ControlAPIError(f"the SuperLink did not stop run {run_id}")
