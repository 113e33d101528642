"""Every long-running command stops on SIGTERM and SIGINT, whatever state it is in.

A process manager (Kubernetes, systemd, a terminal's Ctrl-C) sends SIGTERM or SIGINT and waits;
a command that ignores it is killed after the grace period. Each test brings a real
``memworker`` subprocess into one state (starting with Redis unreachable, consuming, Redis gone,
Postgres gone), sends the signal and expects a clean exit with status 0.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.cli_process import Memworker
from tests.integration.results_factory import publish as publish_results
from tests.integration.results_factory import session_story
from tests.redis_process import RedisProcess, free_port
from worker.settings import Settings


def closed_port_url() -> str:
    """A Redis URL nothing listens on (a port bound, never listened on, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


Launch = Callable[..., "Memworker"]


@pytest.fixture
def launch(prefix: str, database_url: str) -> Iterator[Launch]:
    started: list[Memworker] = []

    def start(*args: str, redis_url: str, db_url: str | None = None) -> Memworker:
        env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "DATABASE_URL": db_url or database_url,
            "MEMWORKER_STREAM_PREFIX": prefix,
            "MEMWORKER_LOG_JSON": "true",
            "MEMWORKER_LOG_LEVEL": "INFO",
            "MEMWORKER_RECLAIM_INTERVAL_MS": "200",
        }
        proc = Memworker(list(args), env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def dev_args(tmp_path: Path) -> list[str]:
    return ["dev", "--data-dir", str(tmp_path / "dev"), "--metrics-port", str(free_port())]


# What each command logs once it is in a state.
STARTED = {
    "run": "lifecycle_worker_started",
    "run --workers 2": "lifecycle_worker_started",
    "dev": "memworker dev is running.",
    "consolidate": "consumer group starting",
}
REDIS_UNAVAILABLE = {
    "run": "redis_unavailable",
    "run --workers 2": "redis_unavailable",
    "dev": "redis_unavailable",
    "consolidate": "redis unavailable, retrying",
}


def command_args(command: str, tmp_path: Path) -> list[str]:
    return dev_args(tmp_path) if command == "dev" else command.split()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("command", list(STARTED))
async def test_a_command_still_waiting_for_an_unreachable_redis_stops_on_a_signal(
    launch: Launch, tmp_path: Path, command: str, signum: int
) -> None:
    proc = launch(*command_args(command, tmp_path), redis_url=closed_port_url())
    proc.wait_for(REDIS_UNAVAILABLE[command])
    assert proc.stop_with(signum) == 0, "".join(proc.lines[-20:])


@pytest.mark.parametrize("command", list(STARTED))
async def test_a_running_command_stops_on_sigterm(
    launch: Launch, tmp_path: Path, redis_url: str, redis: Redis, command: str
) -> None:
    proc = launch(*command_args(command, tmp_path), redis_url=redis_url)
    proc.wait_for(STARTED[command])
    assert proc.stop_with(signal.SIGTERM) == 0, "".join(proc.lines[-20:])


@pytest.mark.parametrize("command", list(STARTED))
async def test_a_command_riding_out_a_redis_outage_stops_on_sigterm(
    launch: Launch, tmp_path: Path, command: str
) -> None:
    server = RedisProcess(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    server.start()
    try:
        proc = launch(*command_args(command, tmp_path), redis_url=server.url)
        seen = proc.wait_for(STARTED[command])
        server.stop()
        proc.wait_for(REDIS_UNAVAILABLE[command], after=seen + 1)
        assert proc.stop_with(signal.SIGTERM) == 0, "".join(proc.lines[-20:])
    finally:
        server.stop()


async def test_a_consolidator_waiting_for_an_unreachable_postgres_stops_on_sigterm(
    launch: Launch, redis_url: str, redis: Redis, prefix: str
) -> None:
    await publish_results(redis, Settings(stream_prefix=prefix), session_story("p", "s")[:1])
    proc = launch(
        "consolidate",
        redis_url=redis_url,
        db_url=f"postgresql://postgres@127.0.0.1:{free_port()}/postgres",
    )
    proc.wait_for("storage unavailable, retrying")
    assert proc.stop_with(signal.SIGTERM) == 0, "".join(proc.lines[-20:])
