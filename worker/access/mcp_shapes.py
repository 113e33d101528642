"""MCP requests of a shape the SDK answers without saying what is wrong, answered here naming it
(``mcp_intake`` calls these): a ``tools/call`` whose ``arguments`` is not an object (the SDK:
``-32602`` with empty ``data``) and, over ``mcp --http``, a JSON-RPC batch, a JSON array (the
SDK: 400 with a pydantic error's text). Every other message passes on untouched."""

from __future__ import annotations

import re
from typing import Any

import pydantic_core

INVALID_PARAMS = -32602
INVALID_REQUEST = -32600
BATCH_REFUSED = (
    "Invalid request: a JSON-RPC batch (a JSON array) is not supported: send one request "
    "(a JSON object) per message"
)

_BATCH = re.compile(rb"\A\s*\[")
_ARGUMENTS = re.compile(rb'"arguments"\s*:\s*[^\s{n]')
"""A body where a key ``arguments`` holds something other than an object or null: the only
ones read in full here (a nested ``arguments`` key matches too; reading says which it is)."""


def arguments_problem(method: Any, params: Any) -> str | None:
    """Why a request's ``params.arguments`` is not a tool call's arguments, or None."""
    if method != "tools/call" or not isinstance(params, dict):
        return None
    arguments = params.get("arguments")
    if arguments is None or isinstance(arguments, dict):
        return None
    kind = "an array" if isinstance(arguments, list) else type(arguments).__name__
    return (
        f"Invalid params: params.arguments: must be an object of the tool's arguments, not {kind}"
    )


def error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def http_reply(body: bytes) -> tuple[int, dict[str, Any]] | None:
    """The status and JSON-RPC error a ``POST /mcp`` body is answered with here, or None."""
    if _BATCH.match(body):
        return 400, error(None, INVALID_REQUEST, BATCH_REFUSED)
    if not _ARGUMENTS.search(body):
        return None
    try:
        message = pydantic_core.from_json(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or not isinstance(message.get("id"), int | str):
        return None
    problem = arguments_problem(message.get("method"), message.get("params"))
    return None if problem is None else (200, error(message["id"], INVALID_PARAMS, problem))
