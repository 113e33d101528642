"""``memworker stats`` on an 80-column terminal: no line wraps and no name is cut short."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import unicodedata
import uuid

from redis.asyncio import Redis


def on_a_terminal(args: list[str], env: dict[str, str]) -> str:
    """Run ``memworker`` with a pseudo-terminal of 80 columns as stdout; what it printed."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        env={**env, "COLUMNS": "80", "LINES": "50", "TERM": "dumb", "NO_COLOR": "1"},
        stdout=secondary,
        stderr=subprocess.PIPE,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    return b"".join(chunks).decode().replace("\r\n", "\n")


def columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


async def test_stats_fits_an_80_column_terminal(redis: Redis, redis_url: str) -> None:
    short = "t" + uuid.uuid4().hex[:5]  # as long as the default prefix, agents: its own keys
    lifecycle = f"{short}:lifecycle:{{0}}"
    await redis.delete(lifecycle)
    try:
        await redis.xgroup_create(lifecycle, "consolidation", id="0", mkstream=True)
        await redis.xadd(lifecycle, {"data": b"{}"})
        env = {**os.environ, "REDIS_URL": redis_url, "MEMWORKER_STREAM_PREFIX": short}
        shown = on_a_terminal(["stats", "--rate-seconds", "0"], env)
    finally:
        await redis.delete(lifecycle)
    lines = shown.splitlines()
    assert max(columns(line) for line in lines) <= 80, "\n".join(
        line for line in lines if columns(line) > 80
    )
    assert "…" not in shown, shown
    assert lifecycle in shown and "consolidation" in shown, shown
    assert any(line.startswith("1 GB sustains ") for line in lines), shown
