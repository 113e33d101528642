"""A request body within the 2 MB limit that parses into tens of MB of Python objects
(``[{},{},…]``, ``[[],[],…]``, 2 MB of ``[``) is refused 413 naming the limit before any parser
reads it, at every route that takes a body (each tool of ``memworker serve``, each form of its
inspector, ``memworker mcp --http``), on real servers with the token; the servers keep serving,
and text full of commas and brackets is still taken. Before, ``[{},{},…]`` sent to any tool
built ~700,000 dicts (BENCHMARKS.md: peak traced memory) and then answered 422."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from redis.asyncio import Redis

from tests.helpers import worker_env
from tests.inspector_server import routes as inspector_routes
from tests.integration.results_factory import migrated_engine
from tests.security.processes import free_port, listening
from tests.security.test_auth import api_routes
from worker.access.body_shape import MAX_JSON_CONTAINERS, MAX_JSON_VALUES
from worker.settings import Settings

TOKEN = "amplified-token-5e1b"
PROJECT = "amplified"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
LIMIT = 2_097_152


def filled(unit: bytes, head: bytes = b"[", tail: bytes = b"]") -> bytes:
    """``head unit,unit,… tail`` as long as the body limit allows."""
    count = (LIMIT - len(head) - len(tail)) // (len(unit) + 1)
    return head + b",".join([unit] * count) + tail


BODIES = {
    "objects": filled(b"{}"),
    "arrays": filled(b"[]"),
    "deep": b"[" * LIMIT,
    "numbers": filled(b"0"),
    "in a value": filled(b"{}", b'{"session_id":"s","key":"k","value":[', b"]}"),
}
"""Each within the body limit; each over one of the structure limits."""


@pytest.fixture
async def env(redis: Redis, settings: Settings, database_url: str) -> dict[str, str]:
    async with migrated_engine(database_url):
        pass
    return worker_env(
        settings.model_copy(update={"database_url": database_url}), MEMWORKER_API_TOKEN=TOKEN
    )


@contextmanager
def serving(args: list[str], said: str, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    where = ["--port", str(port)] if args == ["serve"] else [str(port)]
    with listening([*args, *where, "--project", PROJECT, "--host", "127.0.0.1"], env, said):
        yield f"http://127.0.0.1:{port}"


def refused(answer: httpx.Response, what: object) -> None:
    assert answer.status_code == 413, (what, answer.status_code, answer.text[:200])
    error = answer.json()["error"]
    assert f"{MAX_JSON_CONTAINERS:,}" in error or f"{MAX_JSON_VALUES:,}" in error, error


async def test_every_route_of_serve_refuses_a_body_that_would_parse_huge(
    env: dict[str, str],
) -> None:
    posts = [path for method, path in api_routes() if method == "POST"]
    posts += [path for method, path in inspector_routes() if method == "POST"]
    with serving(["serve"], "memory API of project", env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for path in posts:
                url = path.replace("{user_id}", "ann").replace("{name}", "persona")
                for name, body in BODIES.items():
                    refused(await http.post(url, content=body, headers=AUTH), (url, name))
            # text full of commas and brackets is no structure: taken whole
            text = "a, [b], {c}, " * 15_000  # 195 kB: 60,000 brackets, 45,000 commas
            turn = {"user_id": "ann", "session_id": "s", "input": text, "output": "ok"}
            taken = await http.post("/v1/remember", json=turn, headers=AUTH)
            assert taken.status_code == 200, taken.text
            many = {"session_id": "s", "key": "k", "value": [{"n": n} for n in range(5_000)]}
            answer = await http.post("/v1/wm_set", json=many, headers=AUTH)
            assert answer.status_code != 413, answer.text  # structure within the limits
            assert (await http.get("/healthz")).status_code == 200


async def test_mcp_over_http_refuses_a_body_that_would_parse_huge(env: dict[str, str]) -> None:
    with serving(["mcp", "--http"], "MCP of project", env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for name, body in BODIES.items():
                headers = {**AUTH, "Accept": "application/json, text/event-stream"}
                refused(await http.post("/mcp", content=body, headers=headers), name)
            assert (await http.get("/healthz")).status_code == 200
