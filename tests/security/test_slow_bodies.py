"""A request whose body does not arrive holds no connection: ``memworker serve`` answers 408
after ``MEMWORKER_API_BODY_TIMEOUT_SECONDS`` and closes it. Before, 300 such connections (a
Content-Length of 100,000 and 10 bytes sent) were held for as long as the client liked."""

from __future__ import annotations

import socket
import time

from redis.asyncio import Redis

from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.test_access import PROJECT, TOKEN, free_port, migrated
from worker.settings import Settings


async def test_a_body_that_does_not_arrive_is_answered_408_and_closed(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    port = free_port()
    env = worker_env(settings, MEMWORKER_API_TOKEN=TOKEN, MEMWORKER_API_BODY_TIMEOUT_SECONDS="1")
    server = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    try:
        server.wait_for(f"memory API of project {PROJECT} on http://127.0.0.1:{port}")
        with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
            conn.sendall(
                b"POST /v1/recall HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Authorization: Bearer {TOKEN}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                + b'{"query": '
            )
            started = time.monotonic()
            received = b""
            while chunk := conn.recv(65536):  # until the server closes the connection
                received += chunk
            waited = time.monotonic() - started
        assert received.startswith(b"HTTP/1.1 408"), received[:200]
        assert b"MEMWORKER_API_BODY_TIMEOUT_SECONDS" in received
        assert waited < 15, waited
    finally:
        server.close()
