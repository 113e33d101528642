"""MCP requests the SDK cannot read but JSON can: answered naming the field.

The SDK reads a message with a strict JSON parser that refuses what Python's ``json`` reads: a
lone surrogate escaped in a string (``"\\ud800"``: not Unicode text) and bare ``NaN`` or
``Infinity``. It answers such a request ``-32700 Parse error`` (``mcp --http``) or not at all
(stdio), without saying which field is wrong. Here such a request is read with ``json`` and
answered as any bad call is: a ``tools/call`` whose arguments break the input rule gets the
tool-call error (``isError``, ``{"error": "invalid arguments: query: contains a lone
surrogate ..."}``, counted as a 422 call); another request holding such text gets the JSON-RPC
error ``-32602`` naming where (``params['clientInfo']['name']: ...``). Nothing else changes:
a message the SDK reads never comes here, and one ``json`` cannot read either keeps the SDK's
answer. ``StdioIntake`` does it on the stdio read stream, ``HttpIntake`` in front of the SDK's
HTTP app.
"""

from __future__ import annotations

import json
import re
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
import orjson
import pydantic_core
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from worker.access.guard import App, Message, Receive, Scope, Send
from worker.access.mcp_screen import screened, unreadable
from worker.access.mcp_shapes import http_reply

if TYPE_CHECKING:
    from worker.access.mcp_direct import DirectCalls

SERVER = "mcp"
PARSE_ERROR = -32700
INVALID_PARAMS = -32602
INVALID_REQUEST = -32600

_SUSPECT = re.compile(rb"\\u[dD][89a-fA-F]|NaN|Infinity")
"""What a body the SDK may not read holds (a surrogate escape, a bare non-finite number): a
body without it goes to the SDK unread here."""


def _readable(raw: str | bytes) -> dict[str, Any] | None:
    """The JSON-RPC request ``raw`` is, read by ``json`` (a dict with an ``id`` and a
    ``method``), or None."""
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or "id" not in message:
        return None
    if not isinstance(message.get("method"), str) or not isinstance(message["id"], int | str):
        return None
    return message


def answer(message: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON-RPC answer to a request the SDK could not read (module doc), or None: nothing
    here to name (the SDK's own answer stands)."""
    from schemas.inputs import json_text_problem

    params = message.get("params")
    bad_method = json_text_problem(message["method"], "method")
    if bad_method is not None:  # no method is named so: the request itself is invalid
        line = f"Invalid request: {bad_method[0]}: {bad_method[1]}"
        error = {"code": INVALID_REQUEST, "message": _printable(line)}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}
    if message["method"] == "tools/call" and isinstance(params, dict):
        refused = _refused_call(params.get("name"), params.get("arguments"))
        if refused is not None:
            _status, line = refused
            text = orjson.dumps({"error": _printable(line)}).decode()
            result = {"content": [{"type": "text", "text": text}], "isError": True}
            return {"jsonrpc": "2.0", "id": message["id"], "result": result}
    found = json_text_problem(params, "params")
    if found is None:
        return None
    where, problem = found
    error = {"code": INVALID_PARAMS, "message": _printable(f"Invalid params: {where}: {problem}")}
    return {"jsonrpc": "2.0", "id": message["id"], "error": error}


def _refused_call(name: Any, arguments: Any) -> tuple[int, str] | None:
    """The status and line a call of tool ``name`` with ``arguments`` is refused with (counted
    as ``invoke`` counts calls), or None: they follow the input rule. Text no argument model
    checks (a working-memory value, any JSON) is checked here, naming where in it."""
    from schemas.inputs import InvalidInputError, json_text_problem
    from worker.access.scope import AccessError, failure
    from worker.access.tools import BY_NAME
    from worker.metrics import ACCESS_CALLS

    tool = BY_NAME.get(name) if isinstance(name, str) else None
    try:
        if tool is None:
            raise AccessError(f"no tool {name!r}: the tools are {', '.join(BY_NAME)}", 404)
        tool.arguments.model_validate(arguments or {})
        for field, value in (arguments or {}).items():
            if (found := json_text_problem(value, str(field))) is not None:
                raise InvalidInputError(*found)
    except (AccessError, ValidationError, InvalidInputError) as exc:
        status, line = failure(exc)
        ACCESS_CALLS.labels(SERVER, name if tool is not None else "unknown", str(status)).inc()
        return status, line
    return None


def _printable(line: str) -> str:
    """``line`` as UTF-8 can carry it (a lone surrogate as its escape)."""
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


class StdioIntake:
    """The stdio read stream, with each line the SDK could not read (it passes the failure
    on as an exception holding the line) answered here when ``answer`` has one; everything
    else passes on."""

    def __init__(self, inner: Any, write: Any) -> None:
        self.inner = inner
        self.write = write

    @property
    def last_context(self) -> Any:
        return getattr(self.inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item: SessionMessage | Exception = await self.inner.receive()
            reply = _reply_to(item) if isinstance(item, ValidationError) else _shaped(item)
            if reply is None:
                return item
            await self.write.send(SessionMessage(reply))

    def __aiter__(self) -> StdioIntake:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> StdioIntake:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


def _shaped(item: Any) -> types.JSONRPCMessage | None:
    """The answer to a request of a shape the SDK would refuse unnamed (``mcp_shapes``)."""
    from worker.access.mcp_shapes import INVALID_PARAMS, arguments_problem, error

    request = getattr(item, "message", None)
    if not isinstance(request, types.JSONRPCRequest):
        return None
    problem = arguments_problem(request.method, request.params)
    if problem is None:
        return None
    return types.jsonrpc_message_adapter.validate_python(error(request.id, INVALID_PARAMS, problem))


def _reply_to(error: ValidationError) -> types.JSONRPCMessage | None:
    """The answer to the line a parse failure holds (pydantic keeps the input): the request's
    own when ``answer`` has one, else the parse error or invalid request (``id`` null) the SDK
    answers such a body with over HTTP; None for a blank line (nothing asked)."""
    details = error.errors()
    for detail in details:
        line = detail.get("input")
        if detail.get("type") == "json_invalid" and isinstance(line, str | bytes):
            if not line.strip():
                return None
            message = _readable(line)
            reply = answer(message) if message is not None else None
            if reply is not None:
                return types.jsonrpc_message_adapter.validate_python(reply)
    if not details:
        return None
    return types.jsonrpc_message_adapter.validate_python(unreadable(dict(details[0])))


class HttpIntake:
    """In front of the SDK's HTTP app: a ``POST /mcp`` whose body the SDK cannot read but
    ``answer`` can is answered here (200, ``application/json``), one ``mcp_screen`` refuses (a
    request's ``id`` neither a string nor an integer) too (400), and a request of the
    2026-07-28 revision that is not JSON with where it stops being JSON (400); a result
    answered here to that revision carries its ``resultType``. Every other request passes on,
    its body as it came: to ``direct`` when given (``mcp_direct``: a tool call answered
    without the SDK's dispatch, the rest handed on), else to the SDK's app."""

    def __init__(self, app: App, direct: DirectCalls | None = None) -> None:
        self.app = app
        self.direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope["path"] != "/mcp":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        status, reply = 200, None
        modern = _modern(scope)
        if (refused := screened(body, shape=False)) is not None:  # an id MCP cannot answer by
            status, reply = refused
        elif (shaped := http_reply(body)) is not None:  # a batch, arguments not an object
            status, reply = shaped
        elif _SUSPECT.search(body):
            reply = _http_reply(body)
        elif modern and (unparsed := _parse_error(body)) is not None:
            status, reply = 400, unparsed
        if modern and reply is not None and isinstance(reply.get("result"), dict):
            reply["result"].setdefault("resultType", "complete")  # the revision requires it
        if reply is None:
            replayed = _replay([{"type": "http.request", "body": body}], receive)

            async def sdk(answer: Send) -> None:
                await self.app(scope, replayed, answer)

            if self.direct is None:
                await sdk(send)
            else:
                await self.direct.serve(scope, body, send, sdk)
            return
        payload = orjson.dumps(reply)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})


def _modern(scope: Scope) -> bool:
    """Whether the request is of MCP's revision without sessions (2026-07-28: its
    ``MCP-Protocol-Version`` header names no version of the ``initialize`` handshake)."""
    for name, value in scope.get("headers") or []:
        if name == b"mcp-protocol-version":
            return value.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS
    return False


def _parse_error(body: bytes) -> dict[str, Any] | None:
    """JSON-RPC's parse error saying where the body stops being JSON, or None: it is JSON. The
    SDK says where for a session's request, but only ``Parse error`` for one of the 2026-07-28
    revision."""
    try:
        pydantic_core.from_json(body)
    except ValueError as exc:
        error = {"code": PARSE_ERROR, "message": _printable(f"Parse error: {exc}")}
        return {"jsonrpc": "2.0", "id": None, "error": error}
    return None


def _http_reply(body: bytes) -> dict[str, Any] | None:
    try:
        pydantic_core.from_json(body)
    except ValueError:
        message = _readable(body)
        return answer(message) if message is not None else None
    return None  # the SDK reads it


def _replay(messages: list[Message], then: Receive) -> Receive:
    """A ``receive`` giving ``messages``, then what the client sends next (``then``: its
    disconnect, which a streamed answer waits for)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        return await then()

    return receive
