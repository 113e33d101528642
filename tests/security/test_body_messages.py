"""A body the HTTP API cannot read says what is wrong with it, on a real ``memworker serve``:
nested a thousand deep (before: 400 "There was an error parsing the body"), and longer than its
``Content-Length`` (before: "invalid arguments: 10: the body is not JSON", a number where a
field goes)."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import httpx
from redis.asyncio import Redis

from tests.inspector_server import TOKEN, env_for, serving
from tests.integration.results_factory import migrated_engine
from worker.settings import Settings

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _raw(base: str, head: str, body: bytes) -> tuple[int, str]:
    """One request written byte for byte (a Content-Length no client library would send)."""
    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(head.encode() + b"\r\n\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=60)  # to EOF: Connection: close
    finally:
        writer.close()
    status_line, _, rest = answer.decode().partition("\r\n")
    return int(status_line.split()[1]), rest.partition("\r\n\r\n")[2]


async def test_a_body_nested_too_deep_or_cut_at_its_length_says_so(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    with serving(env_for(settings, database_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as http:
            deep = b'{"user_id": "ann", "query": "x", "deep": ' + b"[" * 1000 + b"]" * 1000 + b"}"
            got = await http.post("/v1/recall", content=deep)
            assert got.status_code in (400, 422), got.text
            error = got.json()["error"]
            assert "nested too deep" in error and "parsing the body" not in error, error
        body = b'{"user_id": "ann", "query": "ferry"}'
        host = urlsplit(base).netloc
        head = (
            f"POST /v1/recall HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: 10\r\nConnection: close"
        )
        status, text = await _raw(base, head, body)
        assert status == 422, text
        error = json.loads(text)["error"]
        assert error.startswith("invalid arguments: body: the body is not JSON"), error
        assert "Content-Length of 10 bytes" in error, error
