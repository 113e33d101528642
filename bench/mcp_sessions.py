"""``memworker mcp --http`` under clients that never close their sessions: its RSS as they
pile up, and how many are refused past ``MEMWORKER_MCP_MAX_SESSIONS``.

    .venv/bin/python bench/mcp_sessions.py [--sessions 2500] [--max-sessions 1000]

Starts ``memworker mcp --http`` (Redis and Postgres are not needed to open a session: the
URLs name ports nothing listens on), sends ``--sessions`` ``initialize`` requests one after
another without ever closing one, and prints the server's RSS (``/proc/<pid>/status``) every
500 sessions with the count of each answer (200 opened, 503 refused).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "bench-token-0f3a"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"},
    },
}
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


async def main(sessions: int, max_sessions: int) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMWORKER_")}
    env.update(
        MEMWORKER_API_TOKEN=TOKEN,
        MEMWORKER_MCP_MAX_SESSIONS=str(max_sessions),
        REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        DATABASE_URL=f"postgresql://bench@127.0.0.1:{free_port()}/bench",
    )
    with tempfile.TemporaryFile("w+") as log:
        args = ["mcp", "--http", str(port), "--host", "127.0.0.1"]
        server = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            while True:
                log.seek(0)
                if "MCP of project" in log.read():
                    break
                time.sleep(0.1)
            print(f"started: {rss_mb(server.pid)} MB", flush=True)
            answers: dict[int, int] = {}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                for n in range(1, sessions + 1):
                    got = await http.post("/mcp", json=INITIALIZE, headers=HEADERS)
                    answers[got.status_code] = answers.get(got.status_code, 0) + 1
                    if n % 500 == 0 or n == sessions:
                        print(f"{n} sessions asked: {rss_mb(server.pid)} MB, {answers}", flush=True)
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2500)
    parser.add_argument("--max-sessions", type=int, default=1000)
    options = parser.parse_args()
    asyncio.run(main(options.sessions, options.max_sessions))
