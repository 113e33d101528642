"""The two HTTP doors (``memworker serve``, ``memworker mcp --http``) as real processes: the
``Host`` they answer (DNS rebinding: 421) and the ``Origin`` (403), what an empty token means,
the ``Bearer`` scheme in any case, the warnings at start, and ``mcp --http``'s sessions (a cap,
idle ones closed) and probes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.results_factory import migrated_engine
from tests.security.processes import clean_env, free_port, listening
from worker.settings import Settings

TOKEN = "door-token-5e1b"
DOORS = {
    "serve": (["serve"], "/v1/profile", "memory API of project"),
    "mcp": (["mcp", "--http"], "/mcp", "MCP of project"),
}


@contextmanager
def door(kind: str, env: dict[str, str], *extra: str) -> Iterator[tuple[str, Memworker]]:
    """``serve`` or ``mcp --http`` on a free port, once it listens: its base URL."""
    args, _, said = DOORS[kind]
    port = free_port()
    where = ["--port", str(port)] if kind == "serve" else [str(port)]
    with listening([*args, *where, *extra], env, said) as process:
        yield f"http://127.0.0.1:{port}", process


@pytest.mark.parametrize("kind", list(DOORS))
async def test_a_request_naming_another_host_is_refused_421(kind: str) -> None:
    """A page on rebind.evil.example whose name now resolves to 127.0.0.1 reaches the
    port, but names its own host: refused, with or without a token."""
    _, path, _ = DOORS[kind]
    env = clean_env(MEMWORKER_API_ALLOWED_HOSTS="api.internal.example")
    with door(kind, env, "--host", "127.0.0.1", "--allowed-host", "memory.example") as (base, _):
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for target in (path, "/readyz", "/openapi.json"):
                evil = await http.get(target, headers={"Host": "rebind.evil.example"})
                assert evil.status_code == 421, (target, evil.text)
                assert "rebind.evil.example" in evil.json()["error"]
            for name in (
                f"127.0.0.1:{base.rsplit(':', 1)[1]}",
                "localhost",
                "[::1]:1",
                "memory.example",
                "API.internal.example:443",
            ):
                ok = await http.get("/healthz", headers={"Host": name})
                assert ok.status_code == 200, (name, ok.text)
            other_site = await http.post(
                path, json={}, headers={"Origin": "http://rebind.evil.example"}
            )
            assert other_site.status_code == 403, other_site.text
            assert "cross-origin" in other_site.json()["error"]


@pytest.mark.parametrize("kind", list(DOORS))
async def test_only_the_servers_own_origin_and_the_allowed_ones_pass(kind: str) -> None:
    """A browser's ``Origin`` must be the server's own (the host and port its ``Host`` names) or
    one of ``MEMWORKER_API_ALLOWED_ORIGINS``: a page of another local app (another port of
    localhost, a ``*.localhost`` name) is refused 403 at every door: the API, ``/ui`` and
    ``mcp --http`` (before: any localhost origin passed). A request without ``Origin`` is
    not judged by it."""
    _, path, _ = DOORS[kind]
    env = clean_env(
        MEMWORKER_API_TOKEN=TOKEN,
        MEMWORKER_API_ALLOWED_ORIGINS="http://localhost:3000,HTTPS://App.example.com:443",
    )
    extra = ["--host", "127.0.0.1", "--allowed-host", "memory.example"]
    with door(kind, env, *extra) as (base, _):
        port = int(base.rsplit(":", 1)[1])
        own, local = f"127.0.0.1:{port}", f"localhost:{port}"
        refused = [  # (Origin, Host)
            (f"http://localhost:{port + 1}", local),  # another local app, same host
            (f"http://localhost:{port + 1}", own),
            (f"http://127.0.0.1:{port + 1}", own),
            ("http://localhost:3001", own),
            (f"http://app.localhost:{port}", local),
            ("http://memory.example:8080", "memory.example"),
            ("https://app.example.com:8443", own),
            ("null", own),
        ]
        passed = [
            (f"http://127.0.0.1:{port}", own),
            (f"http://localhost:{port}", local),
            ("https://memory.example", "memory.example"),
            ("http://memory.example:8080", "memory.example:8080"),
            ("http://localhost:3000", own),  # the allow-list
            ("https://app.example.com", own),
            (None, own),
        ]
        targets = [path, "/ui/login"] if kind == "serve" else [path]
        auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=auth) as http:
            for target in targets:
                for origin, host in refused + passed:
                    headers = {"Host": host, **({"Origin": origin} if origin else {})}
                    answer = await http.post(target, content=b"{}", headers=headers)
                    if (origin, host) in refused:
                        assert answer.status_code == 403, (target, origin, host, answer.text)
                        error = answer.json()["error"]
                        assert "MEMWORKER_API_ALLOWED_ORIGINS" in error, error
                    else:
                        assert answer.status_code != 403, (target, origin, host, answer.text)


async def test_an_empty_token_means_no_authentication_as_documented(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    env = worker_env(
        settings.model_copy(update={"database_url": database_url}), MEMWORKER_API_TOKEN=""
    )
    with door("serve", env) as (base, process):
        assert any("MEMWORKER_API_TOKEN is not set" in line for line in process.lines)
        assert base.startswith("http://127.0.0.1:")  # no token: loopback only
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            answer = await http.post("/v1/profile", json={"user_id": "ann"})
        assert answer.status_code == 200, answer.text


async def test_the_bearer_scheme_is_case_insensitive_and_the_token_is_not(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    env = worker_env(
        settings.model_copy(update={"database_url": database_url}), MEMWORKER_API_TOKEN=TOKEN
    )
    with door("serve", env, "--host", "127.0.0.1") as (base, _):
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            for given, status in [
                (f"Bearer {TOKEN}", 200),
                (f"bearer {TOKEN}", 200),
                (f"BEARER {TOKEN}", 200),
                (f"bEaReR   {TOKEN}", 200),
                (f"Bearer {TOKEN.upper()}", 401),
                (f"Basic {TOKEN}", 401),
                (TOKEN, 401),
                (f"Bearer {TOKEN}x", 401),
            ]:
                answer = await http.post(
                    "/v1/profile", json={"user_id": "ann"}, headers={"Authorization": given}
                )
                assert answer.status_code == status, (given, answer.text)


@pytest.mark.parametrize("kind", list(DOORS))
def test_plain_http_off_loopback_is_said_loudly_at_start(kind: str) -> None:
    with door(kind, clean_env(MEMWORKER_API_TOKEN=TOKEN), "--host", "0.0.0.0") as (_, process):
        said = "".join(process.lines)
    assert "WARNING: plain HTTP on 0.0.0.0" in said
    assert "deploy/TLS.md" in said
    with door(kind, clean_env(), "--host", "0.0.0.0") as (_, process):
        said = "".join(process.lines)
    assert "WARNING: MEMWORKER_API_TOKEN is not set" in said
    assert "ANYONE WHO CAN REACH IT" in said
    with door(kind, clean_env(MEMWORKER_API_TOKEN=TOKEN), "--host", "127.0.0.1") as (_, process):
        said = "".join(process.lines)
    assert "WARNING" not in said


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"},
    },
}
MCP_HEADERS = {
    "Authorization": f"Bearer {TOKEN}",
    "Accept": "application/json, text/event-stream",
}


async def _open_session(http: httpx.AsyncClient) -> httpx.Response:
    return await http.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)


async def _ping(http: httpx.AsyncClient, session: str) -> int:
    answer = await http.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 2, "method": "ping"},
        headers={**MCP_HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-06-18"},
    )
    return answer.status_code


@pytest.fixture
async def mcp_door() -> AsyncIterator[Any]:
    env = clean_env(
        MEMWORKER_API_TOKEN=TOKEN,
        MEMWORKER_MCP_MAX_SESSIONS="3",
        MEMWORKER_MCP_SESSION_IDLE_SECONDS="2",
    )
    with door("mcp", env, "--host", "127.0.0.1") as (base, _):
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            yield http


async def test_mcp_sessions_past_the_cap_are_refused_and_idle_ones_closed(mcp_door: Any) -> None:
    http = mcp_door
    sessions = []
    for _ in range(3):
        opened = await _open_session(http)
        assert opened.status_code == 200, opened.text
        sessions.append(opened.headers["mcp-session-id"])
    refused = await _open_session(http)
    assert refused.status_code == 503, refused.text
    assert "Too many open sessions: 3 are open (MEMWORKER_MCP_MAX_SESSIONS)" in refused.text
    metrics = (await http.get("/metrics")).text
    assert "memworker_mcp_sessions_open 3.0" in metrics  # the gauge counts them
    assert await _ping(http, sessions[0]) == 200  # the open ones still work

    # Left alone past MEMWORKER_MCP_SESSION_IDLE_SECONDS, they are closed: room again.
    deadline = asyncio.get_running_loop().time() + 60
    while (await _open_session(http)).status_code == 503:
        assert asyncio.get_running_loop().time() < deadline, "idle sessions stayed open"
        await asyncio.sleep(0.5)
    assert await _ping(http, sessions[1]) == 404  # closed: unknown to the server now


async def test_mcp_over_http_serves_the_probes(mcp_door: Any) -> None:
    http = mcp_door
    assert (await http.get("/healthz")).text == "ok\n"
    ready = await http.get("/readyz")  # no servers configured: not ready, and why
    assert ready.status_code == 503 and ready.json()["error"].startswith("cannot reach")
    metrics = await http.get("/metrics")
    assert metrics.status_code == 200 and "memworker_ready" in metrics.text
