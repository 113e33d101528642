"""MCP requests holding what the SDK's JSON reader refuses but JSON allows (a lone surrogate
escaped in a string, ``"\\ud800"``; a bare ``NaN``), over stdio and ``mcp --http`` as real
processes spoken to in raw JSON-RPC: each is answered as any bad call is, naming the field
(before: ``-32700 Parse error`` over HTTP and no answer at all over stdio), and the server
keeps serving."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.helpers import all_results, command, publish, running_worker
from tests.security.processes import clean_env, free_port, listening
from worker.keys import SessionKeys, shard_of
from worker.settings import Settings

INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "hostile", "version": "1"},
}
TOKEN = "unreadable-token-91c2"

CALLS: list[tuple[str, str, str]] = [
    # (tool, its arguments as raw JSON, what the error must name)
    ("recall", '{"query": "a\\ud800b"}', "query"),
    ("recall", '{"query": "\\udfff"}', "query"),
    ("remember", '{"session_id": "s1", "input": "hi \\ud800", "output": "ok"}', "input"),
    ("remember", '{"session_id": "s1", "input": "hi", "output": "ok \\uDBFF"}', "output"),
    (
        "remember_many",
        '{"turns": [{"session_id": "s1", "input": "a", "output": "b"},'
        ' {"session_id": "s1", "input": "\\ud800", "output": "b"}]}',
        "turns.1.input",
    ),
    ("wm_set", '{"session_id": "s1", "key": "k", "value": {"t": "\\ud800"}}', "value['t']"),
    ("add_fact", '{"subject": "a\\ud800", "predicate": "likes", "object": "tea"}', "subject"),
    ("recall", '{"query": "tea", "limit": NaN}', "limit"),
]


def call_line(request_id: int, tool: str, arguments: str) -> str:
    return (
        f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call",'
        f' "params": {{"name": "{tool}", "arguments": {arguments}}}}}'
    )


def refused_naming(answer: dict[str, Any], field: str) -> str:
    """The tool-call error line of ``answer``, checked: ``isError``, one line naming ``field``."""
    assert "result" in answer, answer
    result = answer["result"]
    assert result["isError"] is True, result
    error = json.loads(result["content"][0]["text"])["error"]
    assert error.startswith("invalid arguments: ") and f"{field}:" in error, error
    assert "\n" not in error
    return str(error)


def answered(response: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC answer of an ``mcp --http`` response, JSON or one server-sent event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        [data] = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        return dict(json.loads(data))
    return dict(response.json())


class Stdio:
    """``memworker mcp`` over stdio, spoken to in raw lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        await self.proc.stdin.drain()

    async def answer(self, request_id: int | None) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout=60)
            assert raw, "the MCP server closed stdout"
            answer: dict[str, Any] = json.loads(raw)
            if answer.get("id") == request_id:
                return answer


@pytest.fixture
async def stdio() -> AsyncIterator[Stdio]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        "mcp",
        "--project",
        "unreadable",
        env=clean_env(),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    mcp = Stdio(proc)
    try:
        await mcp.send(
            json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INITIALIZE})
        )
        assert "result" in await mcp.answer(0)
        await mcp.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        yield mcp
    finally:
        if proc.returncode is None:
            proc.kill()
        stderr = (await proc.communicate())[1].decode(errors="replace")
        assert "Traceback" not in stderr, stderr[-3000:]


async def test_mcp_stdio_names_the_field_holding_a_lone_surrogate(stdio: Stdio) -> None:
    for n, (tool, arguments, field) in enumerate(CALLS, start=1):
        await stdio.send(call_line(n, tool, arguments))
        error = refused_naming(await stdio.answer(n), field)
        if "NaN" not in arguments:
            assert "lone surrogate" in error, error
    # another request's params: the JSON-RPC error naming where
    await stdio.send('{"jsonrpc": "2.0", "id": 90, "method": "ping", "params": {"x": "\\ud800"}}')
    answer = await stdio.answer(90)
    assert answer["error"]["code"] == -32602, answer
    assert "params['x']: contains a lone surrogate" in answer["error"]["message"], answer
    # an unknown tool named with one: refused as unknown, not dropped
    await stdio.send(call_line(91, "re\\ud800call", '{"query": "x"}'))
    assert json.loads((await stdio.answer(91))["result"]["content"][0]["text"])["error"]
    # a method named with one: an invalid request, answered (it got no answer at all)
    await stdio.send('{"jsonrpc": "2.0", "id": 93, "method": "pi\\ud800ng"}')
    answer = await stdio.answer(93)
    assert answer["error"]["code"] == -32600, answer
    assert "method: contains a lone surrogate" in answer["error"]["message"], answer
    # still serving
    await stdio.send('{"jsonrpc": "2.0", "id": 92, "method": "tools/list"}')
    assert len((await stdio.answer(92))["result"]["tools"]) > 5


async def test_mcp_over_http_names_the_field_holding_a_lone_surrogate() -> None:
    port = free_port()
    env = clean_env(MEMWORKER_API_TOKEN=TOKEN)
    headers = {
        "Authorization": f"Bearer {TOKEN}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    args = ["mcp", "--http", str(port), "--host", "127.0.0.1"]
    with listening(args, env, "MCP of project") as process:
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
            for n, (tool, arguments, field) in enumerate(CALLS, start=1):
                got = await http.post(
                    "/mcp", content=call_line(n, tool, arguments), headers=session
                )
                assert got.status_code == 200, got.text
                refused_naming(answered(got), field)
            no_token = await http.post(
                "/mcp",
                content=call_line(50, *CALLS[0][:2]),
                headers={**session, "Authorization": "Bearer wrong"},
            )
            assert no_token.status_code == 401, no_token.text  # the guard still goes first
            ping = '{"jsonrpc": "2.0", "id": 60, "method": "ping", "params": {"x": "\\ud800"}}'
            got = await http.post("/mcp", content=ping, headers=session)
            assert answered(got)["error"]["code"] == -32602, got.text
            assert "params['x']" in answered(got)["error"]["message"], got.text
            listed = await http.post(
                "/mcp", json={"jsonrpc": "2.0", "id": 61, "method": "tools/list"}, headers=session
            )
            assert listed.status_code == 200 and "recall" in listed.text, listed.text
    assert "Traceback" not in "".join(process.lines)


async def test_the_stream_door_names_the_field_holding_a_lone_surrogate(
    redis: Redis, settings: Settings
) -> None:
    """The lifecycle stream's JSON, a lone surrogate escaped in a command's text: the command is
    rejected ``invalid_event`` naming the field, and nothing of the session is made."""
    cases: dict[str, tuple[str, dict[str, Any], str]] = {
        "u1": ("spawn", {"metadata": {"m": "\ud800"}}, "metadata['m']"),
        "u2": ("spawn", {"correlation_id": "c\udfff"}, "correlation_id"),
        "u3": ("spawn", {"initial_state": {"a": ["ok", {"b": "\ud800"}]}}, "initial_state['a'][1]"),
    }
    for event_id, (kind, fields, _where) in cases.items():
        body = command(kind, event_id, session=f"s-{event_id}", **fields)
        shard = shard_of(body["project_id"], body["session_id"], settings.shards)
        raw = json.dumps(body).encode()  # the surrogate escaped, as a JSON producer writes it
        assert b"\\ud" in raw
        await publish(redis, settings, raw, shard=shard)
    async with running_worker(settings):
        for _ in range(200):
            if len(await all_results(redis, settings)) >= len(cases):
                break
            await asyncio.sleep(0.05)
    got = {r["causation_id"]: r for r in await all_results(redis, settings)}
    for event_id, (_kind, _fields, where) in cases.items():
        result = got[event_id]
        assert result["type"] == "command.rejected", result
        assert result["reason"] == "invalid_event", result
        assert where in result["detail"] and "surrogate" in result["detail"], result["detail"]
        keys = SessionKeys.for_session(
            settings.stream_prefix, settings.shards, "p1", f"s-{event_id}"
        )
        assert await redis.exists(keys.meta) == 0
