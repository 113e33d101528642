"""``mcp --http``'s hot call, a ``tools/call``, answered without the SDK's dispatch.

The SDK serves a session's call through its transport: a memory stream into the session's
task, its dispatcher, its runner (OpenTelemetry middleware, pydantic models of each message),
and a memory stream back; a call of the 2026-07-28 revision through the runner. That made a
``remember`` over MCP ~0.7 of one over ``memworker serve`` on the same cores, memworker's own
code ~9 % of the process's time (BENCHMARKS.md, many agents at once). ``DirectCalls`` answers a
``tools/call`` the SDK would serve as it is, with the SDK's own checks of the request
(``validate_client_request``; for the 2026-07-28 revision its routing-header ladder,
``classify_inbound_request``) and of the result (``serialize_server_result``), the body read
by the SDK's parser (integers exact, nesting as deep as it reads), its Content-Type and Accept
checks, the session's idle countdown held while the call runs (the transport's own count of
requests in flight), and the same tool call (``tools.invoke``): the same answer, without the
hops. Anything else, and any call the SDK would answer otherwise (no such session, a session
not initialised, headers it refuses, ``Mcp-Param-*`` headers, a tool we do not have, a request
holding more than a call's fields, a body its parser refuses), goes to the SDK untouched,
which answers it as before. ``MEMWORKER_MCP_DIRECT_CALLS`` off sends every call through the
SDK. A tool's answer is written the same way on both paths (``call_text``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
import orjson
import pydantic_core
from mcp.server.streamable_http import (
    CONTENT_TYPE_JSON,
    MCP_SESSION_ID_HEADER,
    check_accept_headers,
)
from mcp.shared.inbound import (
    InboundModernRoute,
    classify_inbound_request,
    find_duplicated_routing_header,
    validate_mcp_param_headers,
)
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.methods import serialize_server_result, validate_client_request
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request

from worker.access.guard import Message, Scope, Send

if TYPE_CHECKING:
    from mcp.server import Server

    from worker.access.scope import Access

SERVER = "mcp"
METHOD = "tools/call"
_CALL_FIELDS = frozenset({"jsonrpc", "id", "method", "params"})
_PARAMS = frozenset({"name", "arguments"})
_MODERN_PARAMS = frozenset({"name", "arguments", "_meta"})
_SESSION = MCP_SESSION_ID_HEADER.lower().encode()
_PARAM_HEADER = b"mcp-param-"
_IN_FLIGHT = "_requests_in_flight"
"""The SDK transport's count of a session's requests in flight: the idle countdown runs only
while it is 0. A call answered here counts in it too; without it (another SDK), the SDK's."""

Sdk = Callable[[Send], Awaitable[None]]


class DirectCalls:
    """The module's fast path for one ``mcp --http`` app: ``server`` (the SDK's, for its
    sessions and its ``serverInfo``), ``access`` (the tools' scope), ``idle_seconds`` (a
    session's idle timeout, held and restarted by a call answered here as by the SDK's)."""

    def __init__(self, server: Server[Any], access: Callable[[], Access], idle_seconds: float):
        self.server = server
        self.access = access
        self.idle_seconds = idle_seconds
        self.initialised: dict[str, str] = {}
        """Sessions whose ``initialize`` the SDK answered with a result, with the protocol
        version it agreed (what the SDK shapes their answers for): only their calls are
        answered here (the SDK refuses a call on a session not initialised)."""

    async def serve(self, scope: Scope, body: bytes, send: Send, sdk: Sdk) -> None:
        """Answer ``body`` (a ``POST /mcp``'s) here when it is a call the SDK would serve,
        else hand it to ``sdk`` (watching an ``initialize``'s answer for its session)."""
        try:  # read as the SDK reads it: integers exact, at most its depth
            message = pydantic_core.from_json(body)
        except ValueError:
            await sdk(send)
            return
        if not isinstance(message, dict):
            await sdk(send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
        version = _header(headers, b"mcp-protocol-version")
        if message.get("method") == "initialize" and _header(headers, _SESSION) is None:
            await sdk(self._watching(send))
            return
        accepts_json, _sse = check_accept_headers(Request(scope))  # the SDK's own check
        if not _plain_call(message) or not accepts_json or not _json_type(headers):
            await sdk(send)
            return
        if "user" in scope:  # a session's owner: the SDK's to check
            await sdk(send)
            return
        if version is None or version in HANDSHAKE_PROTOCOL_VERSIONS:
            answered = await self._session_call(headers, message, send)
        else:
            answered = await self._modern_call(headers, message, send)
        if not answered:
            await sdk(send)

    async def _session_call(
        self, headers: list[tuple[bytes, bytes]], message: dict[str, Any], send: Send
    ) -> bool:
        session_id = _header(headers, _SESSION) or ""
        manager = self.server.session_manager
        transport = manager._server_instances.get(session_id)
        agreed = self.initialised.get(session_id)
        if agreed is None or transport is None:
            return False
        if not _json_body(headers) or transport.is_terminated:
            return False
        idle = transport.idle_scope
        if idle is not None and (idle.cancel_called or not hasattr(transport, _IN_FLIGHT)):
            return False
        params = message["params"]
        if not params.keys() <= _PARAMS or not _valid(agreed, params):
            return False
        with self._held(transport, idle):
            result = await self._call(params, agreed)
        await _answer(send, message["id"], result, [(_SESSION, session_id.encode())])
        return True

    async def _modern_call(
        self, headers: list[tuple[bytes, bytes]], message: dict[str, Any], send: Send
    ) -> bool:
        params = message["params"]
        if not params.keys() <= _MODERN_PARAMS:
            return False
        texts = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        if find_duplicated_routing_header(texts) is not None:
            return False
        verdict = classify_inbound_request(message, headers=dict(texts))
        if not isinstance(verdict, InboundModernRoute):
            return False
        if any(name.startswith(_PARAM_HEADER) for name, _ in headers):
            return False
        arguments = params.get("arguments") or {}
        lookup = self.server.get_tool_input_schema  # what the SDK checks the headers against
        schema = lookup(params["name"]) if lookup is not None else None
        if validate_mcp_param_headers(schema, arguments, dict(texts)) is not None:
            return False
        if not _valid(verdict.protocol_version, params):
            return False
        result = await self._call(params, verdict.protocol_version)
        result["resultType"] = result.get("resultType") or "complete"
        result["_meta"] = {SERVER_INFO_META_KEY: self.server.server_info_stamp}  # as the SDK
        await _answer(send, message["id"], result, [])
        return True

    async def _call(self, params: dict[str, Any], version: str) -> dict[str, Any]:
        """The tool's answer as the SDK's runner shapes a ``CallToolResult`` (``call_tool``
        in ``mcp_server``) for ``version``."""
        from worker.access.tools import invoke

        arguments = params.get("arguments")
        status, result = await invoke(self.access(), SERVER, params["name"], arguments)
        text, failed = call_text(status, result)
        content: list[types.ContentBlock] = [types.TextContent(text=text)]
        shaped = types.CallToolResult(content=content, is_error=failed)
        dumped = shaped.model_dump(by_alias=True, mode="json", exclude_none=True)
        return serialize_server_result(METHOD, version, dumped)

    @contextmanager
    def _held(self, transport: Any, idle: anyio.CancelScope | None) -> Iterator[None]:
        """The session's idle countdown held while a call is answered, and restarted once
        no request is in flight, as the SDK's transport does for the requests it serves (its
        count of them, shared)."""
        if idle is None:
            yield
            return
        setattr(transport, _IN_FLIGHT, getattr(transport, _IN_FLIGHT) + 1)
        idle.deadline = math.inf
        try:
            yield
        finally:
            setattr(transport, _IN_FLIGHT, getattr(transport, _IN_FLIGHT) - 1)
            if not getattr(transport, _IN_FLIGHT):
                idle.deadline = anyio.current_time() + self.idle_seconds

    def _watching(self, send: Send) -> Send:
        """``send``, noting the session an ``initialize`` answered with a result opened."""
        opened: list[str] = []

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 200:
                opened.extend(v.decode() for k, v in message["headers"] if k.lower() == _SESSION)
            elif message["type"] == "http.response.body" and opened:
                self._opened(opened[0], message.get("body", b""))
            await send(message)

        return watch

    def _opened(self, session_id: str, body: bytes) -> None:
        """Note the session an ``initialize`` answered by ``body`` opened, with its version."""
        try:
            version = orjson.loads(body)["result"]["protocolVersion"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return  # refused, or not one JSON body: its calls stay the SDK's
        live = self.server.session_manager._server_instances
        for gone in [known for known in self.initialised if known not in live]:
            del self.initialised[gone]  # closed sessions forgotten
        if session_id in live and version in HANDSHAKE_PROTOCOL_VERSIONS:
            self.initialised[session_id] = version


def call_text(status: int, result: Any) -> tuple[str, bool]:
    """A tool's answer as MCP's text content, and whether it is an error (both paths: this
    module's and ``mcp_server.call_tool``'s). A value nested deeper than orjson writes (a
    working-memory value ``serve`` stored 254 deep) is written by ``json``, as ``serve``
    answers it; an answer neither can write is the call's error saying so, never a failed
    request."""
    try:
        return orjson.dumps(result).decode(), status >= 400
    except TypeError:  # orjson.JSONEncodeError is one
        pass
    try:
        return json.dumps(result, ensure_ascii=False, separators=(",", ":")), status >= 400
    except (TypeError, ValueError, RecursionError) as exc:
        line = f"the answer cannot be sent as JSON: {exc}"
        return orjson.dumps({"error": line}).decode(), True


def _plain_call(message: dict[str, Any]) -> bool:
    """A JSON-RPC request calling a tool we have by name, its arguments an object."""
    from worker.access.tools import BY_NAME

    request_id = message.get("id")
    params = message.get("params")
    return (
        message.get("method") == METHOD
        and message.get("jsonrpc") == "2.0"
        and message.keys() <= _CALL_FIELDS
        and (isinstance(request_id, str) or type(request_id) is int)
        and isinstance(params, dict)
        and isinstance(params.get("name"), str)
        and params["name"] in BY_NAME
        and isinstance(params.get("arguments", {}), dict)
    )


def _valid(version: str, params: dict[str, Any]) -> bool:
    """Whether the SDK's surface check of a call's params for ``version`` passes."""
    try:
        validate_client_request(METHOD, version, params)
    except Exception:  # any refusal is the SDK's to answer
        return False
    return True


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in headers if k == name), None)


def _json_type(headers: list[tuple[bytes, bytes]]) -> bool:
    """The SDK's Content-Type check of every POST (``TransportSecurityMiddleware``)."""
    return (_header(headers, b"content-type") or "").lower().startswith(CONTENT_TYPE_JSON)


def _json_body(headers: list[tuple[bytes, bytes]]) -> bool:
    """The SDK's Content-Type check of a session's request."""
    kind = (_header(headers, b"content-type") or "").split(";")[0]
    return any(part.strip() == CONTENT_TYPE_JSON for part in kind.split(","))


async def _answer(
    send: Send, request_id: Any, result: dict[str, Any], headers: list[tuple[bytes, bytes]]
) -> None:
    payload = orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", CONTENT_TYPE_JSON.encode()),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
