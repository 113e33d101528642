"""Every HTTP route and every MCP tool, enumerated from the app and the tool list (a new one
cannot be missed), against real servers on real Redis and Postgres: no token → 401, a wrong
token → 401, and on a server pinned to user ann, a call reaching another user (bob's memory,
bob's session) → 403, with nothing of bob's written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from starlette.routing import Route

from tests.helpers import worker_env
from tests.integration.results_factory import migrated_engine
from tests.security.processes import free_port, listening
from worker.access.guard import OPEN_PATHS
from worker.access.guesses import GUESS_FAILURES, GUESS_WINDOW_SECONDS
from worker.access.http_api import create_app
from worker.access.tools import TOOLS, Tool
from worker.keys import SessionKeys
from worker.settings import Settings, asyncpg_url

TOKEN = "tenant-token-41c9"
PROJECT = "auth-demo"
PINNED = "ann"
OTHER = "bob"
BOBS_SESSION = "bob-chat"

SAMPLES: dict[str, Any] = {
    "session_id": BOBS_SESSION,
    "input": "bob's turn",
    "output": "ok",
    "query": "anything",
    "subject": "bob",
    "predicate": "likes",
    "object": "ferries",
    "name": "persona",
    "content": "Bob likes ferries.",
    "key": "plan",
    "value": {"step": 1},
    "turns": [{"session_id": BOBS_SESSION, "input": "bob's turn", "output": "ok"}],
}
"""A value for every required argument of every tool (a new one must be added here)."""


def other_tenants_call(tool: Tool) -> dict[str, Any]:
    """Arguments reaching bob: his user id where the tool takes one, else his session."""
    fields = tool.arguments.model_fields
    missing = [n for n, f in fields.items() if f.is_required() and n not in SAMPLES]
    assert not missing, f"tool {tool.name}: add a sample for {missing}"
    arguments = {n: SAMPLES[n] for n, f in fields.items() if f.is_required()}
    if "user_id" in fields:
        arguments["user_id"] = OTHER
    else:
        assert "session_id" in fields, f"tool {tool.name} names no user nor session: its tenant?"
    return arguments


def api_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of ``memworker serve``'s app but the open probes."""
    app: Any = create_app(lambda: None, token=TOKEN, max_bytes=1 << 20)  # type: ignore[arg-type,return-value]
    while not hasattr(app, "routes"):  # the middlewares around the FastAPI app
        app = app.app
    found = []
    for route in app.routes:
        assert isinstance(route, Route)
        if route.path in OPEN_PATHS:
            continue
        for method in sorted(route.methods or {"GET"}):
            if method != "HEAD":
                found.append((method, route.path))
    return found


def test_every_route_is_a_tool_or_open() -> None:
    """So the tenant cases below (one per tool) cover every route."""
    assert {path for _, path in api_routes()} == {f"/v1/{tool.name}" for tool in TOOLS}


@pytest.fixture
async def env(redis: Redis, settings: Settings, database_url: str) -> dict[str, str]:
    async with migrated_engine(database_url):
        pass
    keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, PROJECT, BOBS_SESSION)
    await redis.hset(keys.meta, mapping={"user_id": OTHER, "state": "running"})  # type: ignore[misc]  # bob's spawn
    return worker_env(
        settings.model_copy(update={"database_url": database_url}),
        MEMWORKER_API_TOKEN=TOKEN,
        MEMWORKER_API_USER=PINNED,
    )


@contextmanager
def serving(args: list[str], said: str, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    where = ["--port", str(port)] if args == ["serve"] else [str(port)]
    with listening([*args, *where, "--project", PROJECT, "--host", "127.0.0.1"], env, said):
        yield f"http://127.0.0.1:{port}"


def refused(answer: httpx.Response, guesses: int, what: object) -> None:
    """A call without the right token: 401, or 429 with ``Retry-After`` once the address sent
    more than ``GUESS_FAILURES`` wrong tokens (``guesses``: the wrong ones so far, this one
    included; 0 for a call with no token, which is no guess)."""
    if guesses > GUESS_FAILURES:
        assert answer.status_code == 429, (what, answer.text)
        assert 0 < int(answer.headers["retry-after"]) <= GUESS_WINDOW_SECONDS
        assert answer.json()["error"].startswith("too many wrong tokens from your address")
        return
    assert answer.status_code == 401, (what, answer.text)
    assert answer.json()["error"].startswith("unauthorized:")
    assert answer.headers["www-authenticate"] == "Bearer"


async def _nothing_of_bobs(database_url: str, redis: Redis, settings: Settings) -> None:
    engine = create_async_engine(asyncpg_url(database_url))
    try:
        async with engine.connect() as conn:
            for table, column in (
                ("episodes", "user_id"),
                ("facts", "user_id"),
                ("memory_blocks", "user_key"),
            ):
                count = await conn.scalar(
                    text(f"SELECT count(*) FROM {table} WHERE {column} = :u"), {"u": OTHER}
                )
                assert count == 0, f"{table} holds bob's rows"
    finally:
        await engine.dispose()
    keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, PROJECT, BOBS_SESSION)
    assert await redis.hlen(keys.vars) == 0, "bob's working memory was written"  # type: ignore[misc]


async def test_every_http_route_refuses_no_token_a_wrong_token_and_another_tenant(
    env: dict[str, str], redis: Redis, settings: Settings, database_url: str
) -> None:
    by_path = {f"/v1/{tool.name}": tool for tool in TOOLS}
    guesses = 0  # wrong tokens sent from this address
    with serving(["serve"], "memory API of project", env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for method, path in api_routes():
                body = other_tenants_call(by_path[path])
                for headers in (
                    {},
                    {"Authorization": "Bearer wrong-token"},
                    {"Authorization": f"Bearer {TOKEN[:-1]}"},
                    {"Authorization": f"Basic {TOKEN}"},
                    {"Authorization": TOKEN},
                ):
                    answer = await http.request(method, path, json=body, headers=headers)
                    guesses += bool(headers)
                    refused(answer, guesses if headers else 0, (path, headers))
                auth = {"Authorization": f"Bearer {TOKEN}"}
                answer = await http.request(method, path, json=body, headers=auth)
                assert answer.status_code == 403, (path, body, answer.text)
                assert f"user {PINNED}" in answer.json()["error"], answer.text
                own = {**body, "user_id": PINNED}
                if "user_id" in body:  # the same call for the pinned user is served
                    mine = await http.request(method, path, json=own, headers=auth)
                    assert mine.status_code == 200, (path, mine.text)
    await _nothing_of_bobs(database_url, redis, settings)


async def test_every_mcp_tool_refuses_no_token_a_wrong_token_and_another_tenant(
    env: dict[str, str], redis: Redis, settings: Settings, database_url: str
) -> None:
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    with serving(["mcp", "--http"], "MCP of project", env) as base:
        url = f"{base}/mcp"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx2.AsyncClient(headers=auth, timeout=60) as client,
            streamable_http_client(url, http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = (await session.list_tools()).tools
            assert {tool.name for tool in listed} == {tool.name for tool in TOOLS}
            by_name = {tool.name: tool for tool in TOOLS}
            guesses = 0  # wrong tokens sent from this address
            async with httpx.AsyncClient(timeout=60) as plain:
                for number, tool in enumerate(listed):
                    arguments = other_tenants_call(by_name[tool.name])
                    call = {
                        "jsonrpc": "2.0",
                        "id": number,
                        "method": "tools/call",
                        "params": {"name": tool.name, "arguments": arguments},
                    }
                    for headers in ({}, {"Authorization": "Bearer wrong-token"}):
                        answer = await plain.post(url, json=call, headers=headers)
                        guesses += bool(headers)
                        refused(answer, guesses if headers else 0, (tool.name, headers))
                    result = await session.call_tool(tool.name, arguments)
                    assert result.is_error, (tool.name, result)
                    [content] = result.content
                    error = json.loads(content.text)["error"]  # type: ignore[union-attr]
                    assert f"user {PINNED}" in error, (tool.name, error)
    await _nothing_of_bobs(database_url, redis, settings)


async def test_wrong_tokens_count_once_on_every_door_and_the_right_one_is_never_limited(
    env: dict[str, str],
) -> None:
    """Wrong bearer tokens sent to the inspector's pages count as guesses, as wrong tokens typed
    into its sign-in form do, in one count per address shared with the API: past
    ``GUESS_FAILURES`` within the window, a wrong token on any door is answered 429 with
    ``Retry-After`` (before: the pages answered 401 to every guess, unlimited, and so did the
    API). No token is no guess, and the right token is served throughout."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with serving(["serve"], "memory API of project", env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for n in range(GUESS_FAILURES):
                guess = {"Authorization": f"Bearer guess-{n}"}
                answer = await http.get("/ui/", headers=guess)
                assert answer.status_code == 401, (n, answer.status_code)
            for door in ("/ui/", "/ui/users/ann"):
                held = await http.get(door, headers={"Authorization": "Bearer guess-more"})
                assert held.status_code == 429, (door, held.status_code)
                assert 0 < int(held.headers["retry-after"]) <= GUESS_WINDOW_SECONDS
                assert "Too many wrong tokens" in held.text
            held = await http.post(
                "/v1/recall", json={"query": "x"}, headers={"Authorization": "Bearer guess"}
            )
            assert held.status_code == 429, held.text
            assert 0 < int(held.headers["retry-after"]) <= GUESS_WINDOW_SECONDS
            assert held.json()["error"].startswith("too many wrong tokens from your address")
            signed = await http.post("/ui/login", data={"token": "guess"})
            assert signed.status_code == 429, signed.status_code
            signed = await http.post("/ui/login", data={"token": TOKEN})
            assert signed.status_code == 303, signed.status_code  # the form's right token too
            nothing = await http.post("/v1/recall", json={"query": "x"})
            assert nothing.status_code == 401, nothing.text
            assert (await http.get("/ui/", headers=auth)).status_code == 200
            served = await http.post("/v1/recall", json={"query": "x"}, headers=auth)
            assert served.status_code == 200, served.text
