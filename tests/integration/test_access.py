"""``memworker mcp`` and ``memworker serve`` as real processes against real Redis and Postgres:
an MCP client from the SDK over stdio, and HTTP calls to a served API (auth, remember → recall,
bad input, OpenAPI, probes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from redis.asyncio import Redis

from tests.cli_process import Memworker
from tests.helpers import spawn_session, worker_env
from tests.integration.results_factory import migrated_engine
from worker.settings import Settings

TOKEN = "s3cret-token"
PROJECT = "access-demo"


async def migrated(settings: Settings, database_url: str) -> Settings:
    async with migrated_engine(database_url):
        pass
    return settings.model_copy(update={"database_url": database_url})


def result_of(done: Any) -> Any:
    [content] = done.content
    return json.loads(content.text)


async def test_mcp_over_stdio_lists_the_tools_and_remembers_then_recalls(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "worker.cli", "mcp", "--project", PROJECT],
        env=worker_env(settings),
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == {
            "remember",
            "remember_many",
            "recall",
            "recall_facts",
            "recall_facts_scored",
            "add_fact",
            "working",
            "update_block",
            "append_block",
            "session_messages",
            "profile",
            "forget",
            "wm_get",
            "wm_set",
        }
        for tool in tools.values():
            assert tool.description and len(tool.description) > 20, tool.name
            assert tool.input_schema["type"] == "object", tool.name
        assert {"query", "min_score", "since", "until", "user_id"} <= set(
            tools["recall"].input_schema["properties"]
        )
        assert tools["recall"].input_schema["required"] == ["query"]

        done = await session.call_tool(
            "remember",
            {
                "user_id": "ann",
                "session_id": "chat-1",
                "input": "Find me a train to Lisbon on Friday",
                "output": "The 08:12 from Madrid arrives at 17:40.",
            },
        )
        assert not done.is_error, done
        remembered = result_of(done)["id"]
        done = await session.call_tool("recall", {"user_id": "ann", "query": "train to Lisbon"})
        assert not done.is_error, done
        [match] = result_of(done)
        assert match["episode"]["id"] == remembered
        assert match["episode"]["input"] == "Find me a train to Lisbon on Friday"
        assert match["bm25_score"] > 0
        # embedded when remember returned (no indexer runs) where the server has pgvector;
        # else recalled by words, and the match says so
        assert match["unindexed"] is (match["vector_score"] is None)
        # min_score: words matched (no vectors on this project), so kept; nothing else is.
        done = await session.call_tool(
            "recall", {"user_id": "ann", "query": "bicycle", "min_score": 0.5}
        )
        assert result_of(done) == []
        done = await session.call_tool("recall", {"user_id": "bob", "query": "train"})
        assert result_of(done) == []  # never another user's

        refused = await session.call_tool("forget", {})
        assert refused.is_error
        assert "forget needs a selector" in result_of(refused)["error"]
        bad = await session.call_tool("recall", {"user_id": "ann", "query": "x", "limit": 0})
        assert bad.is_error
        assert result_of(bad)["error"].startswith("invalid arguments: limit:")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def api(
    redis: Redis, settings: Settings, database_url: str
) -> AsyncIterator[tuple[str, Memworker]]:
    settings = await migrated(settings, database_url)
    port = free_port()
    env = worker_env(settings, MEMWORKER_API_TOKEN=TOKEN, MEMWORKER_API_MAX_REQUEST_BYTES="4096")
    process = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    try:
        process.wait_for(f"memory API of project {PROJECT} on http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}", process
    finally:
        process.close()


AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_the_http_api_refuses_without_the_token_and_remembers_then_recalls(
    api: tuple[str, Memworker],
) -> None:
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        turn = {"user_id": "ann", "session_id": "c1", "input": "I love trains", "output": "Ok"}
        refused = await http.post("/v1/remember", json=turn)
        assert refused.status_code == 401
        assert refused.json()["error"].startswith("unauthorized: no bearer token")
        wrong = await http.post("/v1/remember", json=turn, headers={"Authorization": "Bearer x"})
        assert wrong.status_code == 401

        done = await http.post("/v1/remember", json=turn, headers=AUTH)
        assert done.status_code == 200, done.text
        remembered = done.json()["id"]
        found = await http.post(
            "/v1/recall", json={"user_id": "ann", "query": "trains"}, headers=AUTH
        )
        assert found.status_code == 200, found.text
        assert [m["episode"]["id"] for m in found.json()] == [remembered]
        [match] = found.json()
        assert match["unindexed"] is (match["vector_score"] is None)

        block = {"user_id": "ann", "name": "persona", "content": "Ann likes trains."}
        assert (await http.post("/v1/update_block", json=block, headers=AUTH)).status_code == 200
        blocks = (await http.post("/v1/working", json={"user_id": "ann"}, headers=AUTH)).json()
        assert [(b["name"], b["content"]) for b in blocks] == [("persona", "Ann likes trains.")]
        profile = (await http.post("/v1/profile", json={"user_id": "ann"}, headers=AUTH)).json()
        assert profile["episode_count"] == 1
        forgotten = await http.post("/v1/forget", json={"user_id": "ann"}, headers=AUTH)
        assert forgotten.status_code == 200 and forgotten.json()["forgotten"] == 2


async def test_the_http_api_answers_bad_input_with_a_4xx_and_one_line(
    api: tuple[str, Memworker],
) -> None:
    base, process = api
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        cases: list[tuple[str, Any, int, str]] = [
            ("/v1/recall", {"query": "x", "limit": 0}, 422, "invalid arguments: limit:"),
            ("/v1/recall", {"query": "x", "colour": 1}, 422, "invalid arguments: colour:"),
            ("/v1/remember", {"session_id": "c", "input": "i", "output": 1}, 422, "output:"),
            (
                "/v1/remember",
                {"session_id": "c", "user_id": "a b", "input": "i", "output": "o"},
                422,
                "user_id",
            ),
            ("/v1/recall", {"query": "x", "user_id": "not an id"}, 422, "user_id"),
            ("/v1/forget", {}, 400, "forget needs a selector"),
            ("/v1/nothing", {}, 404, "no such path /v1/nothing"),
            (
                "/v1/recall",
                {"query": "x", "since": "2026-02-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
                400,
                "is after until",
            ),
        ]
        for path, body, status, text in cases:
            got = await http.post(path, json=body, headers=AUTH)
            assert got.status_code == status, (path, body, got.text)
            assert text in got.json()["error"], (path, got.json())
            assert "\n" not in got.json()["error"]
        raw = await http.post(
            "/v1/recall", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"}
        )
        assert raw.status_code == 422 and "not JSON" in raw.json()["error"]
        large = await http.post(
            "/v1/remember",
            json={"session_id": "c", "input": "x" * 10_000, "output": "o"},
            headers=AUTH,
        )
        assert large.status_code == 413
        assert "MEMWORKER_API_MAX_REQUEST_BYTES" in large.json()["error"]
        wm = await http.post(
            "/v1/wm_set", json={"session_id": "s1", "key": "_x", "value": 1}, headers=AUTH
        )
        assert wm.status_code == 400 and "reserved" in wm.json()["error"]
    assert not any("Traceback" in line for line in process.lines), "".join(process.lines)


async def test_the_http_api_serves_openapi_probes_metrics_and_working_memory(
    api: tuple[str, Memworker], redis: Redis, settings: Settings
) -> None:
    base, _ = api
    await spawn_session(redis, settings, PROJECT, "s1")
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        document = (await http.get("/openapi.json")).json()
        assert {"/v1/remember", "/v1/recall", "/v1/wm_get", "/v1/forget"} <= set(document["paths"])
        recall = document["paths"]["/v1/recall"]["post"]
        assert "min_score" in json.dumps(document["components"]["schemas"]["RecallArguments"])
        assert recall["description"].startswith("The user's past turns")
        assert (await http.get("/healthz")).status_code == 200
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        set_ = await http.post(
            "/v1/wm_set",
            json={"session_id": "s1", "key": "plan", "value": {"step": 2}},
            headers=AUTH,
        )
        assert set_.status_code == 200, set_.text
        got = await http.post("/v1/wm_get", json={"session_id": "s1", "key": "plan"}, headers=AUTH)
        assert got.json() == {"key": "plan", "found": True, "value": {"step": 2}}
        metrics = (await http.get("/metrics")).text
        assert 'memworker_access_calls_total{server="http",status="200",tool="wm_set"} 1.0' in (
            metrics
        )


async def test_a_server_pinned_to_a_user_never_reaches_another_users_memory(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    port = free_port()
    process = Memworker(
        ["serve", "--project", PROJECT, "--user", "ann", "--port", str(port)],
        worker_env(settings),
    )
    try:
        started = process.wait_for("on http://127.0.0.1:")
        assert any("MEMWORKER_API_TOKEN is not set" in line for line in process.lines[:started])
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            turn = {"session_id": "c", "input": "ann's secret", "output": "ok"}
            assert (await http.post("/v1/remember", json=turn)).status_code == 200
            other = await http.post("/v1/recall", json={"query": "secret", "user_id": "bob"})
            assert other.status_code == 403
            assert "serves user ann only" in other.json()["error"]
            own = (await http.post("/v1/recall", json={"query": "secret"})).json()
            assert [m["episode"]["user_id"] for m in own] == ["ann"]
            wm = await http.post("/v1/wm_get", json={"session_id": "someone-elses"})
            assert wm.status_code == 403
            anonymous = await http.post("/v1/forget", json={"anonymous": True})
            assert anonymous.status_code == 403, anonymous.text
            assert anonymous.json()["error"].startswith("anonymous: this server serves user ann")
    finally:
        process.close()


@asynccontextmanager
async def mcp_over_http(
    settings: Settings, database_url: str, **more_env: str
) -> AsyncIterator[str]:
    """``memworker mcp --http`` of ``PROJECT`` with the token (and ``more_env``), on the
    migrated database: its base URL once it listens; the process closed after."""
    settings = await migrated(settings, database_url)
    port = free_port()
    env = worker_env(settings, MEMWORKER_API_TOKEN=TOKEN, **more_env)
    process = Memworker(
        ["mcp", "--project", PROJECT, "--http", str(port), "--host", "127.0.0.1"], env
    )
    try:
        process.wait_for(f"MCP of project {PROJECT} at /mcp on http://127.0.0.1:{port}")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.close()
    assert "Traceback" not in "".join(process.lines)


async def test_mcp_over_streamable_http_refuses_without_the_token_then_remembers_and_recalls(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async with mcp_over_http(settings, database_url) as base:
        url = f"{base}/mcp"
        async with httpx.AsyncClient() as plain:
            refused = await plain.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert refused.status_code == 401
        async with (
            httpx2.AsyncClient(headers=AUTH, timeout=30) as client,
            streamable_http_client(url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert "recall" in {tool.name for tool in (await session.list_tools()).tools}
            done = await session.call_tool(
                "remember",
                {"user_id": "ann", "session_id": "c", "input": "ferry to Tangier", "output": "ok"},
            )
            assert not done.is_error, result_of(done)
            found = await session.call_tool("recall", {"user_id": "ann", "query": "Tangier"})
            assert "ferry to Tangier" in json.dumps(result_of(found))


async def test_working_memory_of_a_session_never_spawned_is_refused_and_not_created(
    api: tuple[str, Memworker], redis: Redis, settings: Settings
) -> None:
    """Before: an unpinned ``wm_set`` created ``ghost1`` (24 h TTL), and its later spawn
    carried the stray key though the spawn said ``initial_items: 1``."""
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as http:
        for path, body in [
            ("/v1/wm_set", {"session_id": "ghost1", "key": "stray", "value": 1}),
            ("/v1/wm_get", {"session_id": "ghost1"}),
            ("/v1/wm_get", {"session_id": "ghost1", "key": "stray"}),
        ]:
            got = await http.post(path, json=body)
            assert got.status_code == 404, (path, got.text)
            assert got.json()["error"].startswith("unknown_session: session_id ghost1")
        assert [k async for k in redis.scan_iter(match=f"{settings.stream_prefix}:*ghost1*")] == []
        await spawn_session(redis, settings, PROJECT, "ghost1")
        got = await http.post("/v1/wm_get", json={"session_id": "ghost1"})
        assert got.status_code == 200 and got.json() == {"variables": {}}, got.text
        done = await http.post("/v1/wm_set", json={"session_id": "ghost1", "key": "k", "value": 2})
        assert done.status_code == 200, done.text


async def test_the_http_api_reads_a_curl_d_body_as_json_without_a_content_type(
    api: tuple[str, Memworker],
) -> None:
    """``curl -d`` (the README's forget example, verbatim) sends a form's content type."""
    base, _ = api

    def curl(path: str, body: str) -> Any:
        done = subprocess.run(
            ["curl", "-s", "-H", f"Authorization: Bearer {TOKEN}", f"{base}{path}", "-d", body],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return json.loads(done.stdout)

    assert curl("/v1/forget", "{}")["error"].startswith("forget needs a selector")
    turn = {"user_id": "ann", "session_id": "c1", "input": "I love trains", "output": "Ok"}
    remembered = curl("/v1/remember", json.dumps(turn))["id"]
    found = curl("/v1/recall", json.dumps({"user_id": "ann", "query": "trains"}))
    assert [m["episode"]["id"] for m in found] == [remembered]
    assert "not JSON" in curl("/v1/recall", "query=trains")["error"]


async def test_the_http_api_recalls_facts_with_their_scores(api: tuple[str, Memworker]) -> None:
    """``recall_facts_scored``: ``recall_facts``' facts in its order, each with its scores (by
    words alone here: a Postgres without pgvector, no fact embedded)."""
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as http:
        for obj in ("Lisbon by the river", "a red bicycle", "the river ferry"):
            fact = {"user_id": "ann", "subject": "ann", "predicate": "likes", "object": obj}
            assert (await http.post("/v1/add_fact", json=fact)).status_code == 200
        asked = {"user_id": "ann", "query": "river"}
        plain = (await http.post("/v1/recall_facts", json=asked)).json()
        got = await http.post("/v1/recall_facts_scored", json=asked)
        assert got.status_code == 200, got.text
        scored = got.json()
        assert [m["fact"] for m in scored] == plain
        assert [m["fact"]["object"] for m in scored] == ["the river ferry", "Lisbon by the river"]
        assert [m["score"] for m in scored] == [1 / 61, 1 / 62]
        assert all(m["word_score"] > 0 and m["vector_score"] is None for m in scored)
        other = await http.post("/v1/recall_facts_scored", json={"user_id": "bob", "query": ""})
        assert other.status_code == 200 and other.json() == []
