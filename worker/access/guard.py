"""``Guard``: the ASGI middleware in front of both HTTP servers (``memworker serve``,
``memworker mcp --http``): a static bearer token on every path but the open ones, and a limit
on the request body. Its refusals are JSON ``{"error": "<one line>"}`` like every error."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
"""Asked by probes, Prometheus and API clients: no token (a proxy may restrict them)."""


async def send_error(send: Send, status: int, message: str, *headers: tuple[bytes, bytes]) -> None:
    """A JSON error response: ``{"error": message}``."""
    body = orjson.dumps({"error": message})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    """Refuse a request without ``Authorization: Bearer <token>`` (401; when ``token`` is
    set) or with a body over ``max_bytes`` (413), before the app reads it."""

    def __init__(
        self,
        app: App,
        *,
        token: str | None,
        max_bytes: int,
        open_paths: frozenset[str] = OPEN_PATHS,
    ) -> None:
        self.app = app
        self.expected = None if token is None else f"Bearer {token}".encode()
        self.max_bytes = max_bytes
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        if self.expected is not None and scope["path"] not in self.open_paths:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                what = "a wrong bearer token" if given else "no bearer token"
                await send_error(
                    send,
                    401,
                    f"unauthorized: {what}; send Authorization: Bearer <MEMWORKER_API_TOKEN>",
                    (b"www-authenticate", b"Bearer"),
                )
                return
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await send_error(send, 413, self._too_large())
            return
        if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        body, rest = bytearray(), None
        while True:  # read the body here, at most max_bytes, then hand it on in one piece
            message = await receive()
            if message["type"] != "http.request":
                rest = message
                break
            body += message.get("body", b"")
            if len(body) > self.max_bytes:
                await send_error(send, 413, self._too_large())
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if rest is not None:
                    return rest
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return (
            f"request body over {self.max_bytes:,} bytes (MEMWORKER_API_MAX_REQUEST_BYTES): "
            "send less"
        )
