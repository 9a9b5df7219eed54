"""The device-facing port: a TLS reverse proxy that forwards Flower's Fleet API and nothing else.

Flower 1.42 serves its Fleet (devices), Control (`flwr run`, `ls`, `stop`) and Runtime (ServerApp)
APIs on one port, and the open-source Control API authenticates nobody (without Flower's enterprise
plugins it falls back to ``NoOpControlAuthnPlugin``; ``--enable-supernode-auth`` covers the Fleet API only).
So `coordinator serve` binds the SuperLink to 127.0.0.1 (the operator's side) and puts this
gateway on the address devices reach: uvicorn (the server Flower itself runs on) with the
federation's server certificate, forwarding ``POST /v1/fleet/...`` and ``GET /health`` to the
SuperLink over TLS pinned to the federation's CA, and answering 404 to every other path before
a byte of it reaches the SuperLink. Node authentication is unchanged: Flower's signed headers pass
through as they are.

Run as ``python -m cuvil_edge.coordinator.fleet_gateway --listen HOST:PORT --upstream 127.0.0.1:PORT
--certfile --keyfile --cafile`` (started and stopped by `coordinator serve`).
"""

from __future__ import annotations

import argparse
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)

#: What devices may call: the Fleet API (every SuperNode call is under it) and the health check.
FLEET_PREFIX = "/v1/fleet/"
HEALTH_PATH = "/health"
#: Headers that describe one hop, not the request (RFC 9110 §7.6.1); never forwarded.
#: The largest request body forwarded. Fleet calls are small: a message travels as content-addressed
#: objects, arrays in 5 MiB chunks; anyone can send to this port before
#: node authentication, so nothing larger is buffered.
MAX_BODY_BYTES = 64 * 1024 * 1024
#: Connections served at once; more get 503 (uvicorn's limit_concurrency).
MAX_CONNECTIONS = 512
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def allowed(method: str, path: str) -> bool:
    """Whether a device-facing request may reach the SuperLink: Fleet API calls and the health check.

    The path is the decoded request path uvicorn hands over; a path with ``..`` or ``//`` could be
    normalised differently upstream, so it is refused outright.
    """
    if ".." in path or "//" in path or "\\" in path or "%" in path:
        return False
    return (method == "POST" and path.startswith(FLEET_PREFIX)) or (method == "GET" and path == HEALTH_PATH)


class FleetGateway:
    """An ASGI app forwarding allowed requests to ``upstream`` (``https://127.0.0.1:PORT``)."""

    def __init__(self, upstream: str, cafile: str) -> None:
        import httpx

        context = ssl.create_default_context(cafile=cafile)
        self.upstream = upstream.rstrip("/")
        self.client = httpx.AsyncClient(verify=context, timeout=httpx.Timeout(30.0, read=None), follow_redirects=False)

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets and anything else: not served
        method, path = scope["method"], scope["path"]
        if not allowed(method, path):
            log.warning(
                "refused %s %s from %s: only the Fleet API is served on this port",
                method,
                path[:200],
                (scope.get("client") or ("?",))[0],
            )
            await _respond(send, 404, b"not found: this port serves only Flower's Fleet API\n")
            return
        await self._forward(scope, receive, send)

    async def _forward(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        import httpx

        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.decode("latin-1").lower() not in HOP_BY_HOP
        ]
        query = scope.get("query_string", b"").decode("latin-1")
        url = self.upstream + scope["path"] + (f"?{query}" if query else "")
        body = await _read_body(receive, scope, MAX_BODY_BYTES)
        if body is None:
            log.warning(
                "refused a %s body over %d bytes from %s",
                scope["path"][:200],
                MAX_BODY_BYTES,
                (scope.get("client") or ("?",))[0],
            )
            await _respond(send, 413, b"request body too large\n")
            return
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as e:
            log.warning("the SuperLink did not answer %s: %s", scope["path"], e)
            await _respond(send, 502, b"the SuperLink is not reachable\n")
            return
        try:
            out = [
                (k.encode("latin-1"), v.encode("latin-1"))
                for k, v in response.headers.multi_items()
                if k.lower() not in HOP_BY_HOP
            ]
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _read_body(receive: Receive, scope: dict[str, Any], limit: int) -> bytes | None:
    """The request body, or None once it is over ``limit`` bytes (declared or received)."""
    declared = dict(scope["headers"]).get(b"content-length", b"0")
    if not declared.isdigit() or int(declared) > limit:
        return None
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> None:
    """Serve the gateway until SIGTERM (uvicorn's own handling)."""
    import uvicorn

    parser = argparse.ArgumentParser(description="cuvil-edge's device-facing Fleet API gateway")
    parser.add_argument("--listen", required=True, help="HOST:PORT devices connect to")
    parser.add_argument("--upstream", required=True, help="the SuperLink's loopback HOST:PORT")
    for name in ("--certfile", "--keyfile", "--cafile"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fleet-gateway %(levelname)s %(message)s")
    uvicorn.run(
        FleetGateway(f"https://{args.upstream}", args.cafile),
        host=host.strip("[]"),
        port=int(port),
        ssl_certfile=args.certfile,
        ssl_keyfile=args.keyfile,
        log_level="warning",
        access_log=False,
        lifespan="on",
        limit_concurrency=MAX_CONNECTIONS,
    )


if __name__ == "__main__":
    main()
