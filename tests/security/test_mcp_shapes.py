"""MCP requests of a shape the SDK refused without saying what is wrong, over stdio and
``mcp --http`` as real processes spoken to in raw JSON-RPC: a ``tools/call`` whose ``arguments``
is not an object (before: ``-32602`` with an empty ``data`` and a message naming nothing) is
answered ``-32602`` naming ``params.arguments``; a JSON-RPC batch, a JSON array, over HTTP
(before: 400 with a pydantic error's text) is one JSON-RPC error saying batches are not
supported, over stdio too (before: a -32600 naming pydantic's model). The server keeps serving."""

from __future__ import annotations

import json

import httpx

from tests.security.processes import clean_env, free_port, listening
from tests.security.test_unreadable_json import INITIALIZE, TOKEN, Stdio, answered, stdio

__all__ = ["stdio"]

NOT_OBJECTS = ['"recall ferry"', "[1, 2]", "5", "true"]


def call(request_id: int, arguments: str) -> str:
    return (
        f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call",'
        f' "params": {{"name": "recall", "arguments": {arguments}}}}}'
    )


def names_arguments(answer: dict[str, object]) -> None:
    error = answer["error"]
    assert isinstance(error, dict) and error["code"] == -32602, answer
    assert "params.arguments: must be an object" in error["message"], answer


async def test_mcp_stdio_names_arguments_that_are_not_an_object(stdio: Stdio) -> None:
    for n, arguments in enumerate(NOT_OBJECTS, start=1):
        await stdio.send(call(n, arguments))
        names_arguments(await stdio.answer(n))
    await stdio.send('{"jsonrpc": "2.0", "id": 9, "method": "tools/list"}')
    assert len((await stdio.answer(9))["result"]["tools"]) > 5


async def test_mcp_stdio_answers_a_batch_saying_batches_are_not_supported(stdio: Stdio) -> None:
    batch = [json.loads(call(n, "{}")) for n in (1, 2)]
    await stdio.send(json.dumps(batch))
    error = (await stdio.answer(None))["error"]
    assert error["code"] == -32600 and "batch" in error["message"], error
    await stdio.send('{"jsonrpc": "2.0", "id": 9, "method": "tools/list"}')
    assert len((await stdio.answer(9))["result"]["tools"]) > 5


async def test_mcp_over_http_names_arguments_and_refuses_a_batch_cleanly() -> None:
    port = free_port()
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    args = ["mcp", "--http", str(port), "--host", "127.0.0.1"]
    with listening(args, clean_env(MEMWORKER_API_TOKEN=TOKEN), "MCP of project") as process:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as http:
            opened = await http.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INITIALIZE},
            )
            assert opened.status_code == 200, opened.text
            session = {
                "mcp-session-id": opened.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-06-18",
            }
            for n, arguments in enumerate(NOT_OBJECTS, start=1):
                got = await http.post("/mcp", content=call(n, arguments), headers=session)
                names_arguments(answered(got))
            batch = json.dumps(
                [
                    {"jsonrpc": "2.0", "id": 20, "method": "ping"},
                    {"jsonrpc": "2.0", "id": 21, "method": "tools/list"},
                ]
            )
            for headers_sent in (session, {}):
                got = await http.post("/mcp", content=batch, headers=headers_sent)
                assert got.status_code == 400, got.text
                error = got.json()["error"]
                assert error["code"] == -32600 and "batch" in error["message"], got.text
                assert "pydantic" not in got.text and "validation error" not in got.text
            listed = await http.post(
                "/mcp", json={"jsonrpc": "2.0", "id": 30, "method": "tools/list"}, headers=session
            )
            assert listed.status_code == 200 and "recall" in listed.text, listed.text
    assert "Traceback" not in "".join(process.lines)
