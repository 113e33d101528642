"""What the fault scenarios share: loads with seq, exactly-once checks, a Redis server the test
can kill or stop, and a TCP proxy that delays, drops and resets connections."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from redis.asyncio import Redis

from tests.helpers import command, worker_env
from tests.redis_process import RedisProcess
from worker.consumers.groups import ensure_group
from worker.keys import LIFECYCLE_GROUP, SessionKeys, StreamKeys, shard_of
from worker.settings import Settings

KINDS = ("spawn", "pause", "resume", "terminate")
PROJECT = "proj"


def session_command(session: str, seq: int, project: str = PROJECT) -> dict[str, Any]:
    """Command ``seq`` (1-4) of a session's spawn → pause → resume → terminate lifecycle."""
    kind = KINDS[seq - 1]
    extra: dict[str, Any] = {}
    if kind == "spawn":
        extra["initial_state"] = {"n": session, "step": "start", "list": [1, 2, 3]}
    return command(kind, f"{session}-{seq}", session=session, project=project, seq=seq, **extra)


def lifecycle_order(sessions: int, prefix: str = "s") -> list[dict[str, Any]]:
    """Every command of ``sessions`` sessions, interleaved: all spawns, then all pauses, ..."""
    return [session_command(f"{prefix}{n}", seq) for seq in (1, 2, 3, 4) for n in range(sessions)]


async def ensure_groups(redis: Redis, settings: Settings) -> None:
    for shard in range(settings.shards):
        await ensure_group(
            redis, StreamKeys(settings.stream_prefix, shard).lifecycle, LIFECYCLE_GROUP
        )


async def publish_many(redis: Redis, settings: Settings, bodies: Iterable[dict[str, Any]]) -> int:
    """XADD every body to its shard's lifecycle stream (pipelined); returns how many."""
    pipe = redis.pipeline(transaction=False)
    n = 0
    for body in bodies:
        shard = shard_of(body["project_id"], body["session_id"], settings.shards)
        pipe.xadd(StreamKeys(settings.stream_prefix, shard).lifecycle, {"data": orjson.dumps(body)})
        n += 1
        if len(pipe) >= 1000:
            await pipe.execute()
    await pipe.execute()
    return n


async def total(redis: Redis, settings: Settings, kind: str = "results") -> int:
    n = 0
    for shard in range(settings.shards):
        n += int(await redis.xlen(getattr(StreamKeys(settings.stream_prefix, shard), kind)))
    return n


async def wait_for_results(
    redis: Redis, settings: Settings, n: int, timeout: float, *, alive: Any = None
) -> float:
    """Wait until the results streams hold ``n`` entries; returns the seconds waited."""
    started = time.monotonic()
    while (have := await total(redis, settings)) < n:
        if alive is not None:
            alive()
        if time.monotonic() - started > timeout:
            raise AssertionError(f"only {have} of {n} results after {timeout}s")
        await asyncio.sleep(0.1)
    return time.monotonic() - started


@dataclass
class Audit:
    """What the results and DLQ streams say about a run."""

    results: list[dict[str, Any]]
    per_command: Counter[str]
    dead: list[dict[str, bytes]] = field(default_factory=list)

    @property
    def duplicated(self) -> int:
        return sum(n - 1 for n in self.per_command.values() if n > 1)

    def missing(self, event_ids: Iterable[str]) -> list[str]:
        return [e for e in event_ids if e not in self.per_command]

    @property
    def rejected(self) -> list[dict[str, Any]]:
        return [r for r in self.results if r["type"] == "command.rejected"]


async def audit(redis: Redis, settings: Settings) -> Audit:
    out: list[dict[str, Any]] = []
    dead: list[dict[str, bytes]] = []
    for shard in range(settings.shards):
        streams = StreamKeys(settings.stream_prefix, shard)
        rows: Any = await redis.xrange(streams.results)
        out += [orjson.loads(f[b"data"]) for _i, f in rows]
        dlq: Any = await redis.xrange(streams.dlq)
        dead += [{k.decode(): v for k, v in f.items()} for _i, f in dlq]
    return Audit(out, Counter(r["causation_id"] for r in out), dead)


async def pending(redis: Redis, settings: Settings) -> int:
    n = 0
    for shard in range(settings.shards):
        summary: Any = await redis.xpending(
            StreamKeys(settings.stream_prefix, shard).lifecycle, LIFECYCLE_GROUP
        )
        n += int(summary["pending"])
    return n


async def states(
    redis: Redis, settings: Settings, sessions: Iterable[str], project: str = PROJECT
) -> Counter[str]:
    pipe = redis.pipeline(transaction=False)
    for session in sessions:
        keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, project, session)
        pipe.hget(keys.meta, "state")
    found = await pipe.execute()
    return Counter((s or b"<none>").decode() for s in found)


def assert_exactly_once(report: Audit, event_ids: list[str]) -> None:
    missing = report.missing(event_ids)
    assert not missing, f"{len(missing)} commands lost, e.g. {missing[:5]}"
    assert report.duplicated == 0, f"{report.duplicated} duplicated results"
    assert len(report.results) == len(event_ids)


# -- a Redis server the test owns ----------------------------------------------------------


class OwnRedis(RedisProcess):
    """``RedisProcess`` (AOF on) that can be killed (SIGKILL) or shut down (SIGTERM), then
    started again on the same port and data directory."""

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def shutdown(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)
        self.proc = None


# -- a TCP proxy between the worker and Redis -----------------------------------------------


class FaultProxy:
    """A TCP proxy on 127.0.0.1 that forwards to ``target`` and injects faults on demand:
    ``delay`` (seconds added to every chunk, each way), ``drop()`` (close every open
    connection cleanly), ``reset()`` (close every connection with an RST), ``stall``
    (stop forwarding, connections stay open) and ``refuse`` (reset new connections at once)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.delay = 0.0
        self.stall = False
        self.refuse = False
        self.port = 0
        self.faults: Counter[str] = Counter()
        self._server: asyncio.Server | None = None
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset(count=False)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def heal(self) -> None:
        self.delay = 0.0
        self.stall = False
        self.refuse = False

    def drop(self) -> int:
        """Close every open connection (FIN), as a restarted load balancer would."""
        pairs = list(self._pairs)
        for a, b in pairs:
            a.close()
            b.close()
        self._pairs.clear()
        self.faults["drop"] += len(pairs)
        return len(pairs)

    def reset(self, *, count: bool = True) -> int:
        """Abort every open connection with an RST (SO_LINGER 0)."""
        pairs = list(self._pairs)
        for a, b in pairs:
            for writer in (a, b):
                _abort(writer)
        self._pairs.clear()
        if count:
            self.faults["reset"] += len(pairs)
        return len(pairs)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        if self.refuse:
            self.faults["refused"] += 1
            _abort(client_w)
            return
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(client_w)
            return
        pair = (client_w, server_w)
        self._pairs.add(pair)
        for src, dst in ((client_r, server_w), (server_r, client_w)):
            task = asyncio.create_task(self._pipe(src, dst, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await src.read(1 << 16):
                while self.stall and pair in self._pairs:
                    await asyncio.sleep(0.01)
                if self.delay:
                    await asyncio.sleep(self.delay)
                if pair not in self._pairs:
                    return
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            if pair in self._pairs:
                self._pairs.discard(pair)
                for writer in pair:
                    writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport = writer.transport
    transport.abort()


# -- worker processes -------------------------------------------------------------------------


def start_worker(
    settings: Settings, consumer: str, log: Path, **extra: str
) -> subprocess.Popen[bytes]:
    """``memworker run --consumer NAME`` with its log appended to ``log`` (never a full pipe)."""
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "run", "--consumer", consumer],
            env=worker_env(settings, **extra),
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )


def stop_worker(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def log_errors(log: Path) -> list[str]:
    """Lines of a worker log that say something crashed (not the expected warnings)."""
    if not log.exists():
        return []
    bad = ("Traceback", "batch_failed", "loop_error", '"level": "error"', '"level":"error"')
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if any(b in line for b in bad)]


def figures(scenario: str, **values: Any) -> None:
    """Print a scenario's measured figures; append them to $MEMWORKER_FAULTS_REPORT if set."""
    line = orjson.dumps({"scenario": scenario, **values}).decode()
    print(f"\nFIGURES {line}")
    if target := os.environ.get("MEMWORKER_FAULTS_REPORT"):
        with open(target, "a") as out:
            out.write(line + "\n")
