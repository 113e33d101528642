"""What a JSON-RPC message must be before the MCP SDK reads it, the same at both doors of
``memworker mcp`` (stdio and ``--http``): its structure within ``body_shape``'s limits (over
HTTP the ``Guard`` already refused a body over them, 413) and, for a request, an ``id`` MCP can
answer by: a string or an integer. The SDK reads a message whose ``id`` is anything else
(``{"a": 1}``, ``1e400``, ``true``, ``1.5``, ``null``) as a notification and answers nothing
(``--http``: 202, no body); here it is refused ``-32600 Invalid Request`` naming ``id``, with
``id`` null (``--http``: 400). A JSON-RPC batch (a JSON array: MCP has none since 2025-06-18)
is refused ``-32600`` saying so, over stdio as over ``--http`` (the SDK's stdio transport
read one and answered nothing). A message the SDK cannot read at all gets, over stdio, the
JSON-RPC error ``-32700`` (or ``-32600``) with ``id`` null, as ``--http`` gets it from the SDK,
instead of silence.

``ScreenedStdin`` is standard input as the SDK's stdio transport reads it, each line screened
first; a refused line is answered on the transport's write stream and never reaches the SDK.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import sys
from collections.abc import Callable
from typing import Any, BinaryIO

import anyio
import mcp_types as types
import pydantic_core
from mcp.shared.message import SessionMessage

from worker.access.body_shape import shape_problem
from worker.access.mcp_shapes import BATCH_REFUSED

PARSE_ERROR = -32700
INVALID_REQUEST = -32600


def error(code: int, line: str) -> dict[str, Any]:
    """A JSON-RPC error answering a message whose ``id`` cannot be known: ``id`` null."""
    return {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": line}}


def _what(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and abs(value) == float("inf"):
        return "a number out of range"
    return f"a number with a fraction or an exponent ({value!r})"


def id_problem(message: Any) -> str | None:
    """The line a request (a JSON object with a ``method``) is refused with when it carries an
    ``id`` that is neither a string nor an integer (MCP: never null), or None."""
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    value = message["id"]
    if isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool)):
        return None
    return (
        f"Invalid request: id: must be a string or an integer, not {_what(value)} "
        "(leave id out for a notification)"
    )


def screened(raw: bytes | bytearray, *, shape: bool) -> tuple[int, dict[str, Any]] | None:
    """The HTTP status and JSON-RPC error a message is refused with before the SDK reads it
    (``shape``: its structure checked too, as the ``Guard`` checks an HTTP body), or None: the
    SDK reads it (one it cannot parse included: its own answer, or ``mcp_intake``'s)."""
    if shape and (problem := shape_problem(raw, "the message")) is not None:
        return 413, error(INVALID_REQUEST, f"Invalid request: {problem}")
    try:
        message = pydantic_core.from_json(raw)
    except ValueError:
        return None
    if isinstance(message, list):  # the SDK reads a batch over stdio and answers nothing
        return 400, error(INVALID_REQUEST, BATCH_REFUSED)
    if (problem := id_problem(message)) is not None:
        return 400, error(INVALID_REQUEST, problem)
    return None


def unreadable(detail: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC error answering a stdio line the SDK could not read (``detail``: the first
    of its reader's errors), as ``--http`` answers such a body (parse error or invalid
    request, ``id`` null)."""
    if detail.get("type") == "json_invalid":
        reason = str(detail.get("ctx", {}).get("error") or detail.get("msg", "invalid JSON"))
        if reason.startswith("recursion limit"):
            reason += " (arrays and objects nested deeper than the JSON reader reads)"
        return error(PARSE_ERROR, f"Parse error: {reason}")
    where = ".".join(str(part) for part in detail.get("loc", ()))
    return error(
        INVALID_REQUEST,
        "Invalid request: not a JSON-RPC 2.0 request, notification or response"
        + (f" ({where}: {detail.get('msg', '')})" if where else ""),
    )


class _Unowned(io.TextIOWrapper):
    """Text over a binary stream that is not this wrapper's to close."""

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.detach()


def claim_stdin() -> tuple[BinaryIO, Callable[[], None]]:
    """Standard input's wire for the transport alone, as the SDK's stdio transport claims it:
    read from a private copy of fd 0 while fd 0 points at the null device (a handler or child
    reading stdin reads nothing); the returned callable puts the wire back. Where fd 0 cannot
    be copied, ``sys.stdin``'s buffer is read in place."""
    try:
        wire = fcntl.fcntl(0, fcntl.F_DUPFD_CLOEXEC, 3)
    except OSError:
        return sys.stdin.buffer, lambda: None
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        os.close(wire)
        return sys.stdin.buffer, lambda: None

    def restore() -> None:
        os.dup2(wire, 0)

    return os.fdopen(wire, "rb", closefd=False), restore


class ScreenedStdin(anyio.AsyncFile[str]):
    """Lines of ``binary`` (UTF-8, undecodable bytes replaced, as the SDK reads them), each
    refused by ``screened`` answered on the write stream given to ``answer_on`` and skipped."""

    def __init__(self, binary: BinaryIO) -> None:
        super().__init__(_Unowned(binary, encoding="utf-8", errors="replace"))
        self._ready = anyio.Event()
        self._write: Any = None

    def answer_on(self, write: Any) -> None:
        """The transport's write stream: refusals are sent there, in order with answers."""
        self._write = write
        self._ready.set()

    async def readline(self) -> str:
        while True:
            line = await super().readline()
            refused = screened(line.encode(), shape=True) if line.strip() else None
            if refused is None:
                return line
            await self._ready.wait()
            reply = types.jsonrpc_message_adapter.validate_python(refused[1])
            await self._write.send(SessionMessage(reply))
