"""A header the server judges a request by (``Origin``, ``Authorization``) sent twice is
refused 400: before, only the last copy was checked, so ``Origin: http://evil.example`` then a
local ``Origin`` was answered 200."""

from __future__ import annotations

import socket

import pytest
from redis.asyncio import Redis

from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.test_access import PROJECT, TOKEN, free_port, migrated
from worker.settings import Settings


def exchange(port: int, headers: list[str]) -> bytes:
    body = b'{"query": "x"}'
    request = (  # the Host a browser sends, with the port: the Origin rule compares both
        f"POST /v1/recall HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\n"
        + "".join(f"{h}\r\n" for h in headers)
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(request)
        received = b""
        while chunk := conn.recv(65536):
            received += chunk
    return received


@pytest.mark.parametrize(
    "headers",
    [
        [f"Authorization: Bearer {TOKEN}", "Origin: http://evil.example", "Origin: {local}"],
        ["Authorization: Bearer wrong", f"Authorization: Bearer {TOKEN}"],
    ],
    ids=["origin", "authorization"],
)
async def test_a_checked_header_sent_twice_is_refused(
    redis: Redis, settings: Settings, database_url: str, headers: list[str]
) -> None:
    settings = await migrated(settings, database_url)
    port = free_port()
    env = worker_env(settings, MEMWORKER_API_TOKEN=TOKEN)
    server = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    try:
        server.wait_for(f"memory API of project {PROJECT} on http://127.0.0.1:{port}")
        local = f"http://127.0.0.1:{port}"
        sent = [h.replace("{local}", local) for h in headers]
        answer = exchange(port, sent)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:300]
        assert b"sent twice" in answer
        once = [h for i, h in enumerate(sent) if h not in sent[:i] and "evil" not in h]
        ok = exchange(
            port, [f"Authorization: Bearer {TOKEN}", *[h for h in once if "Authorization" not in h]]
        )
        assert ok.startswith(b"HTTP/1.1 200"), ok[:300]
    finally:
        server.close()
