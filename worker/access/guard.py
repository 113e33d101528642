"""``Guard``: the ASGI middleware in front of both HTTP servers (``memworker serve``,
``memworker mcp --http``): the ``Host`` a request names (an allow-list against DNS rebinding:
421 otherwise), the ``Origin`` a browser sends (the server's own, or one allowed by
``MEMWORKER_API_ALLOWED_ORIGINS``: 403 otherwise), a static bearer token on every path but
the open ones (the scheme in any case, the token compared in constant time; wrong tokens
limited per client address: ``guesses``), and limits on the request body (its bytes; its
JSON structure, counted before any parser builds it: ``body_shape``). Its refusals are JSON
``{"error": "<one line>"}`` like every error."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from worker.access.body_shape import shape_problem
from worker.access.guesses import GuessLimiter, client_address

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


LOCAL_HOSTS = frozenset({"localhost"})
"""Names always served; so is every IP address (a browser sends one only when the page
itself came from that address: no rebinding)."""


def host_name(header: bytes) -> str:
    """The name in a ``Host`` header, without its port, lower case (``[::1]:8080`` → ``::1``)."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:].split("]", 1)[0]
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


DEFAULT_PORTS = {"http": 80, "https": 443}


def host_and_port(header: bytes) -> tuple[str, int | None]:
    """The name and port a ``Host`` header names (``localhost:8080`` → ``('localhost', 8080)``;
    no port, or one that is not a number: None)."""
    text = header.decode("latin-1").strip().lower()
    if text.startswith("["):
        name, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        name, _, port = text.partition(":")
    else:
        name, port = text, ""
    return name, int(port) if port.isdigit() and len(port) <= 5 else None


def parse_origin(text: str) -> tuple[str, str, int] | None:
    """An origin (``https://app.example.com:8443``) as its scheme, host and port (the
    scheme's default when none is said), or None: not an http(s) origin (``null``, a path)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, name = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not name or parts.username or parts.password:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return scheme, name, port if port is not None else DEFAULT_PORTS[scheme]


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


_CHECKED = (b"host", b"origin", b"authorization")
"""The headers the guard judges a request by: each at most once."""


def _repeated(raw: list[tuple[bytes, bytes]]) -> str | None:
    """The name of a checked header ``raw`` holds more than once, or None."""
    names = [name for name, _ in raw]
    for name in _CHECKED:
        if names.count(name) > 1:
            return name.decode()
    return None


class Guard:
    """Refuse a request naming a ``Host`` not served (421; ``allowed_hosts`` None: any), sent
    by a page of another origin (its ``Origin`` neither the server's own, the host and port
    its ``Host`` names, nor one of ``allowed_origins``: 403), without ``Authorization: Bearer
    <token>`` (401; when ``token`` is set; a wrong one from an address that sent too many:
    429, ``guesses``), with a body over ``max_bytes`` (413), not received whole within
    ``body_timeout_s`` (408) or holding more JSON structure than ``body_shape`` allows (413),
    before the app reads it."""

    def __init__(
        self,
        app: App,
        *,
        token: str | None,
        max_bytes: int,
        open_paths: frozenset[str] = OPEN_PATHS,
        allowed_hosts: frozenset[str] | None = LOCAL_HOSTS,
        body_timeout_s: float = 30.0,
        guesses: GuessLimiter | None = None,
        allowed_origins: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.allowed_origins = frozenset(filter(None, map(parse_origin, allowed_origins)))
        self.guesses = guesses if guesses is not None else GuessLimiter()
        self.body_timeout_s = body_timeout_s
        self.expected = token.encode() if token else None
        self.max_bytes = max_bytes
        self.open_paths = open_paths
        self.allowed_hosts = (
            None
            if allowed_hosts is None
            else frozenset(h.strip().lower().strip("[]") for h in allowed_hosts) | LOCAL_HOSTS
        )

    def host_allowed(self, header: bytes | None) -> bool:
        """Whether a request naming ``header`` as its ``Host`` is served."""
        if self.allowed_hosts is None or header is None:  # HTTP/1.0 without Host: no browser
            return True
        name = host_name(header)
        if name in self.allowed_hosts or _is_address(name) or name.endswith(".localhost"):
            return True
        return any(h.startswith(".") and name.endswith(h) for h in self.allowed_hosts)

    def origin_allowed(self, origin: bytes, host: bytes | None) -> bool:
        """A browser's ``Origin``: the server's own (the host and port of its ``Host``, the
        origin's scheme's default port when it names none) or one of ``allowed_origins``.
        Another port of the same host is another origin: a page of another local app (a dev
        server on localhost:3000) may not call this server. The scheme is not compared with
        the connection's: behind a TLS proxy the page is https, the connection http."""
        if self.allowed_hosts is None:
            return True
        given = parse_origin(origin.decode("latin-1"))
        if given is None:  # "null": a sandboxed page, a file
            return False
        if given in self.allowed_origins:
            return True
        if host is None:
            return False
        scheme, name, port = given
        own_name, own_port = host_and_port(host)
        return name == own_name and port == (own_port or DEFAULT_PORTS[scheme])

    def authorized(self, given: bytes) -> bool:
        """``Authorization: Bearer <token>``, the scheme in any case (RFC 9110), the token
        compared in constant time."""
        assert self.expected is not None
        scheme, _, credentials = given.strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            credentials.strip(), self.expected
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = scope.get("headers") or []
        headers = dict(raw)
        if len(headers) < len(raw) and (twice := _repeated(raw)):
            # dict() keeps the last of each: a checked header sent twice is refused, never
            # judged by one of its copies (an Origin of another site, then a local one)
            await send_error(send, 400, f"bad request: the {twice} header is sent twice")
            return
        if not self.host_allowed(headers.get(b"host")):
            name = host_name(headers.get(b"host", b""))[:100]
            await send_error(
                send,
                421,
                f"misdirected request: this server does not answer for host {name!r} (DNS "
                "rebinding); add the name with --allowed-host or MEMWORKER_API_ALLOWED_HOSTS",
            )
            return
        origin = headers.get(b"origin")
        if origin is not None and not self.origin_allowed(origin, headers.get(b"host")):
            shown = origin.decode("latin-1")[:100]
            await send_error(
                send,
                403,
                f"cross-origin request refused: a page of {shown!r} may not call this server "
                "(only its own origin may); add the origin to MEMWORKER_API_ALLOWED_ORIGINS",
            )
            return
        if self.expected is not None and scope["path"] not in self.open_paths:
            given = headers.get(b"authorization", b"")
            if not self.authorized(given):
                wait = self.guesses.refuse(client_address(scope)) if given else 0
                if wait:
                    await send_error(
                        send, 429, self.guesses.line(wait), (b"retry-after", str(wait).encode())
                    )
                    return
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
        try:  # the whole body within body_timeout_s: a slow one holds no connection
            async with asyncio.timeout(self.body_timeout_s):
                while True:  # read the body here, at most max_bytes, then hand it on whole
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
        except TimeoutError:
            await send_error(
                send,
                408,
                f"request body not received within {self.body_timeout_s:g} s "
                "(MEMWORKER_API_BODY_TIMEOUT_SECONDS)",
                (b"connection", b"close"),
            )
            return
        if rest is None and (problem := shape_problem(body)) is not None:
            await send_error(send, 413, problem)  # before any parser builds it
            return
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
