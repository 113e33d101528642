"""No password shows, and none the repository ships is accepted.

A failing start of every long-running command and of the CLI's one-shot commands, as real
processes with Redis and Postgres unreachable, their URLs carrying passwords: every output
(stdout, stderr, log lines, the bodies of /readyz, /healthz, /metrics and of a tool call over
HTTP and over MCP) shows the failure, the URL with ``***``, and never the password. Then:
``serve``, ``mcp --http`` and the workers refuse a shipped secret, in one line naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.security.processes import Recorded, clean_env, free_port

REDIS_SECRET = "S3c'retRedis\"Pw"  # quotes: a pattern stopping at them once showed it
PG_SECRET = "S3cretPgPw"
TOKEN = "an-own-token-7d2f"  # not a secret under test: the servers need one to answer
SECRETS = (REDIS_SECRET, PG_SECRET)


def _failing_env(redis_port: int, pg_port: int, **extra: str) -> dict[str, str]:
    return clean_env(
        REDIS_URL=f"redis://publisher:{REDIS_SECRET}@127.0.0.1:{redis_port}/0",
        DATABASE_URL=f"postgresql://memworker:{PG_SECRET}@127.0.0.1:{pg_port}/memworker",
        MEMWORKER_API_TOKEN=TOKEN,
        MEMWORKER_REDIS_RETRY_SECONDS="0.1",
        MEMWORKER_LOG_LEVEL="DEBUG",
        **extra,
    )


def _clean(what: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{what} shows a password:\n{text}"


async def _probe(base: str, headers: dict[str, str] | None = None) -> str:
    """The bodies of /readyz, /healthz and /metrics at ``base``."""
    async with httpx.AsyncClient(base_url=base, timeout=60, headers=headers) as http:
        bodies = [(await http.get(path)).text for path in ("/readyz", "/healthz", "/metrics")]
    return "\n".join(bodies)


async def test_no_output_of_a_failing_start_shows_a_password(tmp_path: Path) -> None:
    redis_port, pg_port = free_port(), free_port()
    env = _failing_env(redis_port, pg_port)
    seen: dict[str, str] = {}

    port = free_port()
    serve = Recorded(["serve", "--port", str(port), "--host", "127.0.0.1"], env, tmp_path / "s")
    try:
        serve.wait_for("memory API of project")
        base = f"http://127.0.0.1:{port}"
        seen["serve probes"] = await _probe(base)
        assert "cannot reach" in seen["serve probes"] and "***" in seen["serve probes"]
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=auth) as http:
            for tool, body in [
                ("wm_get", {"session_id": "s1", "key": "k"}),
                ("profile", {"user_id": "ann"}),
                ("recall", {"user_id": "ann", "query": "trains"}),
            ]:
                answer = await http.post(f"/v1/{tool}", json=body)
                assert answer.status_code == 503, answer.text
                seen[f"serve {tool}"] = answer.text
    finally:
        seen["serve output"] = serve.finish()
    assert "***" in seen["serve wm_get"]

    port = free_port()
    mcp = Recorded(["mcp", "--http", str(port), "--host", "127.0.0.1"], env, tmp_path / "m")
    try:
        mcp.wait_for("MCP of project")
        seen["mcp probes"] = await _probe(f"http://127.0.0.1:{port}")
        seen["mcp calls"] = await _mcp_calls(f"http://127.0.0.1:{port}/mcp")
    finally:
        seen["mcp output"] = mcp.finish()
    assert "***" in seen["mcp calls"]

    for command in ("run", "consolidate", "index"):
        metrics = free_port()
        worker = Recorded([command, "--metrics-port", str(metrics)], env, tmp_path / command)
        try:
            worker.wait_for(f"127.0.0.1:{redis_port}")  # its failure, reported
            seen[f"{command} probes"] = await _probe(f"http://127.0.0.1:{metrics}")
        finally:
            seen[f"{command} output"] = worker.finish()

    for args in (["stats"], ["publish", "spawn", "-p", "demo", "-s", "s1"], ["migrate"]):
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done
        seen[" ".join(args)] = done.stdout + done.stderr
    assert f"redis://publisher:***@127.0.0.1:{redis_port}/0" in seen["stats"]
    assert "***" in seen["migrate"]

    dev = Recorded(
        ["dev", "--data-dir", str(tmp_path / "dev-data"), "--metrics-port", str(free_port())],
        env,
        tmp_path / "dev",
    )
    seen["dev output"] = dev.finish() if dev.proc.wait(timeout=120) is not None else ""
    assert dev.proc.returncode == 1 and "memworker: error:" in seen["dev output"]

    for what, text in seen.items():
        _clean(what, text)


async def _mcp_calls(url: str) -> str:
    """Two tool calls over MCP (one to Redis, one to Postgres): their texts."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    texts = []
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as client,
        streamable_http_client(url, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        for tool, arguments in [
            ("wm_get", {"session_id": "s1", "key": "k"}),
            ("profile", {"user_id": "ann"}),
        ]:
            result = await session.call_tool(tool, arguments)
            assert result.is_error
            texts.append(json.dumps(result.model_dump(mode="json")))
    return "\n".join(texts)


@pytest.mark.parametrize(
    ("what", "extra"),
    [
        (
            "sentinel",
            {
                "REDIS_URL": "redis://publisher:{r}@127.0.0.1:{p},127.0.0.1:{q}/0",
                "MEMWORKER_REDIS_SENTINEL_SERVICE": "mymaster",
            },
        ),
        (
            "cluster",
            {"REDIS_URL": "redis://publisher:{r}@127.0.0.1:{p}/0", "MEMWORKER_REDIS_CLUSTER": "1"},
        ),
        ("query", {"REDIS_URL": "redis://127.0.0.1:{p}/0?password={r}&username=publisher"}),
    ],
)
def test_sentinel_cluster_and_query_passwords_are_masked_too(
    what: str, extra: dict[str, str]
) -> None:
    p, q = free_port(), free_port()
    env = _failing_env(p, free_port())
    env.update({k: v.format(r=REDIS_SECRET, p=p, q=q) for k, v in extra.items()})
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "stats"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    output = done.stdout + done.stderr
    assert "memworker: error:" in output
    _clean(what, output)


SHIPPED = "dev-publisher-change-me"


@pytest.mark.parametrize(
    ("args", "variable", "value"),
    [
        (["serve", "--port", "0"], "MEMWORKER_API_TOKEN", "dev-api-token-change-me"),
        (["mcp", "--http", "0"], "MEMWORKER_API_TOKEN", "CHANGE-ME"),
        (["serve", "--port", "0"], "MEMWORKER_API_TOKEN", "change-me"),
        (["run"], "REDIS_URL", f"redis://publisher:{SHIPPED}@127.0.0.1:1/0"),
        (["consolidate"], "REDIS_URL", f"redis://consolidator:{SHIPPED}@127.0.0.1:1/0"),
        (
            ["index"],
            "DATABASE_URL",
            "postgresql://memworker_runtime:dev-runtime-change-me@127.0.0.1:1/memworker",
        ),
    ],
)
def test_a_secret_the_repository_ships_is_refused_at_start(
    args: list[str], variable: str, value: str
) -> None:
    env = clean_env(**{variable: value})
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"memworker: error: {variable} holds a password this repository")
    assert "MEMWORKER_ALLOW_DEFAULT_SECRETS" in lines[0]
    assert "change-me" not in lines[0].lower()


async def test_the_override_lets_a_throwaway_stack_start_with_them(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        MEMWORKER_API_TOKEN="dev-api-token-change-me", MEMWORKER_ALLOW_DEFAULT_SECRETS="1"
    )
    serve = Recorded(["serve", "--port", str(port), "--host", "127.0.0.1"], env, tmp_path)
    try:
        serve.wait_for("memory API of project")
        async with httpx.AsyncClient(timeout=60) as http:
            answer: Any = await http.get(f"http://127.0.0.1:{port}/healthz")
        assert answer.status_code == 200
    finally:
        serve.finish()
