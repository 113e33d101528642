"""JSON-RPC requests MCP cannot answer as sent, over stdio and ``mcp --http`` as real processes
spoken to in raw JSON-RPC. An ``id`` that is neither a string nor an integer (an object,
``1e400``, ``true``, ``1.5``, ``null``, an array) is refused ``-32600 Invalid Request`` naming
``id``, with ``id`` null (over HTTP: 400); before, the SDK read it as a notification and
answered nothing (HTTP 202, no body). A request nested 50,000 deep is refused naming the
structure limit (``body_shape``, the same rule at both doors); one within it but nested past
the JSON reader's depth, one with more digits than the reader takes, or one that is no JSON-RPC
message, gets ``-32700``/``-32600`` with ``id`` null; before, stdio answered nothing to any line
it could not read. The server keeps serving the next line. A 10 KB string and a 30-digit
integer are ids and answered by them."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.security.processes import clean_env, free_port, listening
from tests.security.test_unreadable_json import INITIALIZE, answered
from worker.access.body_shape import MAX_JSON_CONTAINERS

TOKEN = "jsonrpc-ids-token-4a7e"
BAD_IDS = ['{"a": 1}', "1e400", "true", "false", "1.5", "null", "[1]", "-0.5e3", "NaN"]
"""Ids MCP cannot answer by, as sent on the wire."""
HUGE_INTEGER = "1" + "0" * 5_000
"""More digits than the SDK's JSON reader takes: a parse error."""
GOOD_IDS = ['"' + "i" * 10_240 + '"', "1" + "0" * 29, "-7"]
"""Odd but valid: a 10 KB string, an integer past 64 bits, a negative one."""
DEEP = '{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": ' + "[" * 50_000
NESTED = '{"jsonrpc": "2.0", "id": 6, "method": "ping", "params": {"a": ' + "[" * 300
NESTED += "]" * 300 + "}}"
"""Within the structure limit, deeper than the SDK's reader goes."""


def request(raw_id: str, method: str = "tools/list") -> str:
    return f'{{"jsonrpc": "2.0", "id": {raw_id}, "method": "{method}"}}'


def invalid_id(answer: dict[str, Any], sent: str) -> None:
    assert answer.get("id", "absent") is None, (sent, answer)
    error = answer["error"]
    assert error["code"] == -32600, (sent, answer)
    assert error["message"].startswith("Invalid request: id: must be a string or an integer")
    assert "\n" not in error["message"]


class Lines:
    """``memworker mcp`` over stdio, spoken to in raw lines, read one answer at a time."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout=60)
        assert raw, "the MCP server closed stdout"
        return dict(json.loads(raw))


@pytest.fixture
async def stdio() -> AsyncIterator[Lines]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        "mcp",
        "--project",
        "ids",
        env=clean_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=1 << 20,
    )
    mcp = Lines(proc)
    try:
        await mcp.send(
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INITIALIZE})
        )
        assert (await mcp.next())["id"] == 0
        await mcp.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        yield mcp
    finally:
        if proc.returncode is None:
            proc.kill()
        stderr = (await proc.communicate())[1].decode(errors="replace")
        assert "Traceback" not in stderr, stderr[-3000:]


async def test_mcp_stdio_refuses_an_id_it_cannot_answer_by(stdio: Lines) -> None:
    for raw_id in BAD_IDS:
        await stdio.send(request(raw_id))
        invalid_id(await stdio.next(), raw_id)  # the next line answers it: nothing dropped
    await stdio.send(request(HUGE_INTEGER))
    answer = await stdio.next()
    assert answer["id"] is None and answer["error"]["code"] == -32700, answer
    assert "number out of range" in answer["error"]["message"], answer
    for raw_id in GOOD_IDS:
        await stdio.send(request(raw_id, "ping"))
        answer = await stdio.next()
        assert answer == {"jsonrpc": "2.0", "id": json.loads(raw_id), "result": {}}, raw_id[:20]
    await stdio.send('{"jsonrpc": "2.0", "id": 9}')  # no method, no result: still answered
    answer = await stdio.next()
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    await stdio.send(request("10"))
    assert len((await stdio.next())["result"]["tools"]) > 5


async def test_mcp_stdio_answers_a_request_nested_too_deep(stdio: Lines) -> None:
    await stdio.send(DEEP)
    answer = await stdio.next()
    assert answer["id"] is None and answer["error"]["code"] == -32600, answer
    assert f"{MAX_JSON_CONTAINERS:,}" in answer["error"]["message"], answer
    await stdio.send(NESTED)
    answer = await stdio.next()
    assert answer["id"] is None and answer["error"]["code"] == -32700, answer
    assert "nested deeper" in answer["error"]["message"], answer
    await stdio.send(request("11"))  # the next line is served
    answer = await stdio.next()
    assert answer["id"] == 11 and len(answer["result"]["tools"]) > 5, answer


async def test_mcp_over_http_refuses_an_id_it_cannot_answer_by() -> None:
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
            headers.update(
                {
                    "mcp-session-id": opened.headers["mcp-session-id"],
                    "mcp-protocol-version": "2025-06-18",
                }
            )
            for raw_id in BAD_IDS:
                got = await http.post("/mcp", content=request(raw_id), headers=headers)
                assert got.status_code == 400, (raw_id, got.status_code, got.text)
                invalid_id(got.json(), raw_id)
            # before opening a session too: the id is judged first
            got = await http.post("/mcp", content=request('{"a": 1}', "initialize"))
            assert got.status_code == 400, got.text
            huge = await http.post("/mcp", content=request(HUGE_INTEGER), headers=headers)
            assert huge.status_code == 400 and huge.json()["error"]["code"] == -32700, huge.text
            for raw_id in GOOD_IDS:
                got = await http.post("/mcp", content=request(raw_id, "ping"), headers=headers)
                assert got.status_code == 200, got.text
                assert answered(got)["id"] == json.loads(raw_id), raw_id[:20]
            # the structure rule of both doors: 413 naming the limit; too deep: -32700
            deep = await http.post("/mcp", content=DEEP, headers=headers)
            assert deep.status_code == 413, deep.text
            assert f"{MAX_JSON_CONTAINERS:,}" in deep.json()["error"], deep.text
            nested = await http.post("/mcp", content=NESTED, headers=headers)
            assert nested.status_code == 400, nested.text
            assert nested.json()["error"]["code"] == -32700, nested.text
            listed = await http.post("/mcp", content=request("12"), headers=headers)
            assert listed.status_code == 200 and "recall" in listed.text, listed.text
    assert "Traceback" not in "".join(process.lines)
