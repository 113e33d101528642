"""User memory under many agents at once: offered rate vs achieved vs p50/p99 of ``remember``
and ``recall``, 1 → 50 clients, one project and ten, through the Python API (``Memory``) and
HTTP (``memworker serve``), beside a plain Postgres INSERT (the limit being chased), and the
previous release's ``remember`` against this one's, alternated in the same process.

    .venv/bin/python bench/user_memory_load.py [--redis-url URL] [--database-url URL] \\
        [--seconds 8] [--clients 1,10,50] [--rounds 2] [--batch 1000] [--batch-clients 1]
        [--sustain 60] [--no-http] [--only rounds,points,bulk,http]

``--only`` runs some parts; to compare two checkouts in one window on a shared machine, run the
same command with ``PYTHONPATH`` at each, alternating (the bench itself uses only ``Memory``,
``serve`` and the outbox's public functions, so it runs against an older checkout too).

Every point runs ``--seconds`` against a fresh migrated database (dropped at the end) and the
given Redis, with ``MEMWORKER_REMEMBER_EMBEDDING=indexer`` (``remember`` stores and announces;
the indexer, which embeds, is not run: this measures the write path; the embedder bounds
freshness by meaning, not this). Clients are closed loops (each sends its next call when the
last returned: the offered rate is "as fast as answered", ``max``), plus points paced at half
the 50-client rate (an open loop: latency counted from the scheduled send, so queueing shows).
A client is one user of its own (its turns in order, 12 words of a 32-word vocabulary each);
remembers only, then mixed: every fourth call of a client a recall of that user by three such
words (words only: the server has no pgvector unless given), as fast as answered and paced so
the remembers come at half the rate, the recalls on top.

- **baseline**: one INSERT of a turn-sized row per transaction into a table of its own, same
  pool (10 connections) and clients: what Postgres alone does here;
- **before / after**: 50 tasks, one project, remembers only, the previous release's sequence
  (INSERT and its event in one transaction; XADD the announcement and mark it in a second; then
  the project's outbox published under its lock, one caller at a time) against this one's
  (one statement, then a group-committed publish), alternating ``--rounds`` times;
- **remember_many**: a bulk import in batches of ``--batch`` turns, ``--batch-clients`` batches
  at once (one by default; each sender its own users), alternating with the bulk baseline: the
  same batches, each one plain INSERT of their ids, users and text into a table of its own
  (what Postgres alone does with them here).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import random
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    cancel_on_sigterm,
    cleanup,
    fresh_database,
    invocation,
    markdown_table,
    memworker_command,
    percentile,
    service_env,
    unique_prefix,
)
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from user_memory import WORDS  # the same vocabulary as bench/user_memory.py

from worker.connections import redis_client
from worker.db.batch import mark_announced
from worker.db.engine import create_database_engine
from worker.db.models import TURN_OUTCOME
from worker.episodes.announcements import Announcement
from worker.episodes.changes import change_event, owe, publish_owed
from worker.keys import episodes_stream
from worker.settings import Settings
from worker.user_memory.inputs import check_episode
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode, as_utc
from worker.user_memory.turns import turn_source, turn_uuid

OUTPUT = "done, confirmation sent by email"
PARTS = ("rounds", "points", "bulk", "http")
"""``--only``: the before/after rounds, the Python points (and ``--sustain``), the
``remember_many`` import, the HTTP points."""
RECALL_EVERY = 4
MIXED = "max, every 4th call a recall"
PACED_EVERY = (4, 10, 40)
"""The mixed calls paced so that the remembers come at half the 50-client rate, recalls on top
(an open loop, ``beside``), one point for each share of recalls (every 4th, 10th, 40th call):
recall's latency beside the writes of the half-rate point, and how many recalls a second fit
beside them, where ``MIXED`` queues every call behind saturated cores."""


def paced_mix(every: int) -> str:
    return f"remembers at half, every {every}th call a recall"


def beside(half: float, every: int) -> float:
    """The calls a second that carry ``half`` remembers a second when every ``every``th call
    is a recall."""
    return half * every / (every - 1)


def words(c: int, n: int, count: int) -> str:
    """``count`` words of the vocabulary, a different mix for each call."""
    rng = random.Random(c * 1_000_003 + n)
    return " ".join(rng.choice(WORDS) for _ in range(count))


_PREVIOUS_INSERT = text(
    "INSERT INTO episodes (id, source_event_id, project_id, session_id, user_id, turn_id, input,"
    " output, tool_calls, tool_transcript, outcome, lessons_learned, context_summary,"
    " importance_score, occurred_at) VALUES (:id, :src, :p, :s, :u, :t, :i, :o,"
    " CAST(:calls AS jsonb), CAST(:transcript AS jsonb), :outcome, '[]'::jsonb, '', 0.5, :at)"
    " ON CONFLICT DO NOTHING RETURNING id"
)


async def previous_remember(memory: Memory, episode: Episode) -> str:
    """The previous release's ``Memory.remember`` (new ids only), step for step."""
    episode = check_episode(episode)
    project = memory.project_id
    row_id = turn_uuid(project, episode.user_id, episode.id)
    source = turn_source(project, episode.user_id, episode.id)
    async with memory.engine.begin() as conn:
        inserted = await conn.execute(
            _PREVIOUS_INSERT,
            {
                "id": row_id,
                "src": source,
                "p": project,
                "s": episode.session_id,
                "u": episode.user_id,
                "t": episode.id,
                "i": episode.input,
                "o": episode.output,
                "calls": "[]",
                "transcript": None,
                "outcome": TURN_OUTCOME,
                "at": as_utc(episode.occurred_at),
            },
        )
        if inserted.first() is not None:
            event = change_event(
                "episode.remembered",
                project,
                episode.user_id,
                episode.id,
                episode_id=episode.id,
                session_id=episode.session_id,
            )
            await owe(conn, project, [event])
    wire = Announcement(row_id, project, episode.session_id, source).wire()
    await memory.redis.xadd(episodes_stream(memory.settings.stream_prefix), {"data": wire})
    async with memory.engine.begin() as conn:
        await mark_announced(conn, [row_id])
    settings = memory.settings
    await publish_owed(
        memory.engine, memory.redis, settings.stream_prefix, settings.shards, project
    )
    return episode.id


@dataclass
class Point:
    """One measured point: latencies (s) of each kind, errors, wall time."""

    remember: list[float] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""
    seconds: float = 0.0

    def rate(self) -> float:
        return len(self.remember) / self.seconds if self.seconds else 0.0


Call = Callable[[int, int], Awaitable[object]]


async def drive(
    remember: Call,
    recall: Call | None,
    clients: int,
    seconds: float,
    rate: float | None = None,
    every: int = RECALL_EVERY,
) -> Point:
    """``clients`` loops for ``seconds``: client ``c``'s call ``n`` is ``recall(c, n)`` every
    ``every``th call (when given), else ``remember(c, n)``. ``rate``: calls per second
    in all, paced (latency from the scheduled send); None: as fast as answered."""
    point = Point()
    clock = time.perf_counter
    start = clock()
    deadline = start + seconds
    interval = clients / rate if rate else 0.0

    async def client(c: int) -> None:
        n = 0
        due = start + interval * c / clients
        while True:
            if rate:
                wait = due - clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                sent, due = due, due + interval
            else:
                sent = clock()
            if sent >= deadline:
                return
            n += 1
            is_recall = recall is not None and n % every == 0
            try:
                if is_recall and recall is not None:
                    await recall(c, n)
                else:
                    await remember(c, n)
            except Exception as exc:
                point.errors += 1
                point.first_error = point.first_error or f"{type(exc).__name__}: {exc}"[:160]
                continue
            (point.recall if is_recall else point.remember).append(clock() - sent)

    await asyncio.gather(*(client(c) for c in range(clients)))
    point.seconds = clock() - start
    return point


def ms(samples: list[float], q: float) -> str:
    return "–" if not samples else f"{percentile(samples, q) * 1000:,.1f}"


def row(door: str, projects: int, clients: int, offered: str, point: Point) -> list[str]:
    recalls = f"{len(point.recall) / point.seconds:,.0f}/s" if point.recall else "–"
    return [
        door,
        str(projects),
        str(clients),
        offered,
        f"{point.rate():,.0f}/s",
        ms(point.remember, 50),
        ms(point.remember, 99),
        recalls,
        ms(point.recall, 50),
        ms(point.recall, 99),
        str(point.errors) + (f" ({point.first_error})" if point.errors else ""),
    ]


HEADER = [
    "door",
    "projects",
    "clients",
    "offered",
    "remembers achieved",
    "remember p50 ms",
    "remember p99 ms",
    "recalls",
    "recall p50 ms",
    "recall p99 ms",
    "errors",
]


def turn(tag: str, c: int, n: int) -> Episode:
    return Episode(
        id=f"{tag}-{c}-{n}",
        session_id=f"s{c}",
        user_id=f"u{c}",
        input=f"please {words(c, n, 12)}",
        output=OUTPUT,
    )


async def python_point(
    memories: list[Memory],
    tag: str,
    clients: int,
    seconds: float,
    rate: float | None = None,
    mixed: int = 0,
) -> Point:
    """``mixed``: every ``mixed``th call of a client a recall (0: remembers only)."""

    async def remember(c: int, n: int) -> object:
        return await memories[c % len(memories)].remember(turn(tag, c, n))

    async def recall(c: int, n: int) -> object:
        return await memories[c % len(memories)].recall(words(c, -n, 3), user_id=f"u{c}")

    return await drive(remember, recall if mixed else None, clients, seconds, rate, mixed)


async def baseline_point(engine: AsyncEngine, tag: str, clients: int, seconds: float) -> Point:
    statement = text(
        "INSERT INTO bench_plain (id, user_id, input, output) VALUES (:id, :u, :i, :o)"
    )

    async def insert(c: int, n: int) -> object:
        async with engine.begin() as conn:
            await conn.execute(
                statement,
                {
                    "id": f"{tag}-{c}-{n}",
                    "u": f"u{c}",
                    "i": f"please {words(c, n, 12)}",
                    "o": OUTPUT,
                },
            )
        return None

    return await drive(insert, None, clients, seconds)


async def back_to_back(memory: Memory, rounds: int, senders: int, size: int) -> int:
    """``senders`` senders, each ``rounds`` batches of ``size`` turns one after another (its
    own users, as the alternating import), then the project's events flushed: the turns sent."""

    async def sender(i: int) -> None:
        for b in range(rounds):
            await memory.remember_many([turn(f"back{b}", i * 50 + k % 50, k) for k in range(size)])

    await asyncio.gather(*(sender(i) for i in range(senders)))
    await memory.flush_changes()
    return rounds * senders * size


async def plain_batch(engine: AsyncEngine, episodes: list[Episode]) -> None:
    """The bulk baseline: the turns' ids, users and text in one plain INSERT, a transaction."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO bench_plain (id, user_id, input, output) SELECT * FROM"
                " unnest(CAST(:ids AS text[]), CAST(:us AS text[]), CAST(:is AS text[]),"
                " CAST(:os AS text[]))"
            ),
            {
                "ids": [f"plain-{e.session_id}-{e.id}" for e in episodes],
                "us": [e.user_id for e in episodes],
                "is": [e.input for e in episodes],
                "os": [e.output for e in episodes],
            },
        )


async def timed_batch(memory: Memory, episodes: list[Episode]) -> float:
    """``memory.remember_many(episodes)``; its seconds."""
    started = time.perf_counter()
    await memory.remember_many(episodes)
    return time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(redis_url: str, database_url: str, prefix: str, project: str) -> AsyncIterator[str]:
    """``memworker serve`` for ``project`` on a free port; its base URL once ready."""
    async with door_server(redis_url, database_url, prefix, project, "serve") as base:
        yield base


@contextlib.asynccontextmanager
async def door_server(
    redis_url: str, database_url: str, prefix: str, project: str, *args: str
) -> AsyncIterator[str]:
    """``memworker <args> --project <project>`` (``serve``, or ``mcp`` over HTTP) listening on
    a free port, without a token; its base URL once ``/readyz`` answers; stopped afterwards."""
    port = free_port()
    env = service_env(redis_url, prefix, database_url, MEMWORKER_REMEMBER_EMBEDDING="indexer")
    env.pop("MEMWORKER_API_TOKEN", None)
    command = [*args, "--project", project]
    command += ["--http", str(port)] if args[0] == "mcp" else ["--port", str(port)]
    proc = subprocess.Popen(
        memworker_command(*command), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as probe:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if (await probe.get(f"{base}/readyz")).status_code == 200:
                        break
                if proc.poll() is not None:
                    raise RuntimeError(f"memworker {args[0]} exited with {proc.returncode}")
                await asyncio.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Connection:
    """A minimal HTTP/1.1 keep-alive client, one connection per bench client: httpx's pool
    spent more CPU than the server at 50 clients (82/s against 875/s for the same server)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, base: str) -> Connection:
        host, port = base.removeprefix("http://").rsplit(":", 1)
        return cls(*await asyncio.open_connection(host, int(port)))

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        data = orjson.dumps(body)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        await self.writer.drain()
        answer = await self.reader.readuntil(b"\r\n\r\n")
        lines = answer.split(b"\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in lines
            if line.lower().startswith(b"content-length:")
        )
        return int(lines[0].split()[1]), await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


async def http_point(
    base: str,
    tag: str,
    clients: int,
    seconds: float,
    rate: float | None = None,
    mixed: int = 0,
) -> Point:
    connections = [await Connection.open(base) for _ in range(clients)]

    async def remember(c: int, n: int) -> object:
        body = {
            "id": f"{tag}-{c}-{n}",
            "session_id": f"s{c}",
            "user_id": f"u{c}",
            "input": f"please {words(c, n, 12)}",
            "output": OUTPUT,
        }
        status, text_ = await connections[c].post("/v1/remember", body)
        if status != 200:
            raise RuntimeError(f"{status} {text_[:100]!r}")
        return None

    async def recall(c: int, n: int) -> object:
        body = {"query": words(c, -n, 3), "user_id": f"u{c}"}
        status, text_ = await connections[c].post("/v1/recall", body)
        if status != 200:
            raise RuntimeError(f"{status} {text_[:100]!r}")
        return None

    try:
        return await drive(remember, recall if mixed else None, clients, seconds, rate, mixed)
    finally:
        for connection in connections:
            connection.close()


async def check_stored(engine: AsyncEngine, expected: int) -> str:
    async with engine.connect() as conn:
        turns = (await conn.execute(text("SELECT count(*) FROM episodes"))).scalar_one()
    return f"{turns:,} turns in Postgres, {expected:,} acknowledged"


async def run(args: argparse.Namespace) -> str:
    cancel_on_sigterm()
    load_before = os.getloadavg()[0]
    only = set(args.only.split(","))
    if only - set(PARTS):
        raise SystemExit(f"--only: {', '.join(sorted(only - set(PARTS)))}: not one of {PARTS}")
    prefix = unique_prefix("user-memory-load")
    redis = redis_client(args.redis_url)  # the product's own (commands packed by hiredis)
    clients_list = [int(c) for c in args.clients.split(",")]
    rows: list[list[str]] = []
    ratios: list[list[str]] = []
    notes: list[str] = []
    acknowledged = 0
    try:
        async with fresh_database(args.database_url) as url:
            settings = Settings(
                redis_url=args.redis_url,
                database_url=url,
                stream_prefix=prefix,
                remember_embedding="indexer",
            )
            engine = create_database_engine(url)
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "CREATE TABLE bench_plain (id text PRIMARY KEY, user_id text,"
                        " input text, output text, at timestamptz DEFAULT now())"
                    )
                )
            one = [Memory("load0", settings=settings, engine=engine, redis=redis)]
            ten = [
                Memory(f"load{k}", settings=settings, engine=engine, redis=redis) for k in range(10)
            ]
            try:
                for memory in ten:  # warm: connections, statements
                    for n in range(5):
                        await memory.remember(turn("warm", 0, n))
                        acknowledged += 1
                before: list[float] = []
                after: list[float] = []
                before_p99: list[float] = []
                after_p99: list[float] = []
                for r in range(args.rounds if "rounds" in only else 0):
                    for label in ("after", "before"):

                        async def remember(
                            c: int, n: int, label: str = label, r: int = r
                        ) -> object:
                            episode = turn(f"ab{label}{r}", c, n)
                            if label == "before":
                                return await previous_remember(one[0], episode)
                            return await one[0].remember(episode)

                        point = await drive(remember, None, 50, args.seconds)
                        acknowledged += len(point.remember)
                        (after if label == "after" else before).append(point.rate())
                        (after_p99 if label == "after" else before_p99).append(
                            percentile(point.remember, 99)
                        )
                        ratios.append(
                            [
                                f"{r + 1}",
                                label,
                                f"{point.rate():,.0f}/s",
                                ms(point.remember, 50),
                                ms(point.remember, 99),
                                str(point.errors),
                            ]
                        )
                ratio = sum(after) / sum(before) if sum(before) else float("nan")
                if before:
                    notes.append(
                        f"Python API, 50 tasks, one project, remembers only: this release "
                        f"{sum(after) / len(after):,.0f}/s against the previous release's "
                        f"{sum(before) / len(before):,.0f}/s: **{ratio:.1f}×** (mean of "
                        f"{args.rounds} alternated rounds); p99 "
                        f"{1000 * sum(after_p99) / len(after_p99):,.0f} ms vs "
                        f"{1000 * sum(before_p99) / len(before_p99):,.0f} ms."
                    )
                for clients in clients_list if "points" in only else []:
                    point = await baseline_point(engine, f"b{clients}", clients, args.seconds)
                    rows.append(row("Postgres INSERT (baseline)", 1, clients, "max", point))
                    for memories in (one, ten):
                        if len(memories) > clients:
                            continue
                        tag = f"py{len(memories)}-{clients}"
                        door = "Python `Memory`"
                        point = await python_point(memories, tag, clients, args.seconds)
                        acknowledged += len(point.remember)
                        rows.append(row(door, len(memories), clients, "max", point))
                        if clients == max(clients_list):
                            half = point.rate() / 2
                            paced = await python_point(
                                memories, tag + "h", clients, args.seconds, half
                            )
                            acknowledged += len(paced.remember)
                            offered = f"{half:,.0f}/s (half)"
                            rows.append(row(door, len(memories), clients, offered, paced))
                        mixed = await python_point(
                            memories, tag + "m", clients, args.seconds, mixed=RECALL_EVERY
                        )
                        acknowledged += len(mixed.remember)
                        rows.append(row(door, len(memories), clients, MIXED, mixed))
                        for every in PACED_EVERY if clients == max(clients_list) else ():
                            paced = await python_point(
                                memories, f"{tag}hm{every}", clients, args.seconds,
                                beside(half, every), every,
                            )  # fmt: skip
                            acknowledged += len(paced.remember)
                            offered = f"{beside(half, every):,.0f}/s: {paced_mix(every)}"
                            rows.append(row(door, len(memories), clients, offered, paced))
                if args.sustain and "points" in only:
                    point = await python_point(one, "sustain", 50, args.sustain)
                    acknowledged += len(point.remember)
                    rows.append(row("Python `Memory`", 1, 50, f"max, {args.sustain:g} s", point))
                bulk_s = plain_s = bulk_cpu = bulk_calls = 0.0
                imported = 0
                senders = max(1, args.batch_clients)
                rounds = max(1, args.batch_turns // (args.batch * senders)) if "bulk" in only else 0
                for b in range(rounds):  # alternating with a plain INSERT of the same rows
                    # sender i's users are its own (i * 50 + k % 50): each user's turns come
                    # from one sender, one batch after the other, so the feed keeps their order
                    sent = [
                        [turn(f"bulk{b}", i * 50 + k % 50, k) for k in range(args.batch)]
                        for i in range(senders)
                    ]
                    started = time.perf_counter()
                    await asyncio.gather(*(plain_batch(engine, episodes) for episodes in sent))
                    plain_s += time.perf_counter() - started
                    started, cpu = time.perf_counter(), time.process_time()
                    calls = await asyncio.gather(*(timed_batch(one[0], e) for e in sent))
                    bulk_s += time.perf_counter() - started
                    bulk_cpu += time.process_time() - cpu
                    bulk_calls += sum(calls)
                    imported += args.batch * senders
                acknowledged += imported
                if rounds:
                    who = "one client" if senders == 1 else f"{senders} at once"
                    notes.append(
                        f"`remember_many`, batches of {args.batch:,}, {who}: {imported:,}"
                        f" turns in {bulk_s:.2f} s = **{imported / bulk_s:,.0f} turns/s** "
                        f"({1000 * bulk_calls / (rounds * senders):,.0f} ms a batch); the same"
                        " batches as one plain INSERT each into a table of their own (baseline,"
                        f" alternating): {imported / plain_s:,.0f} turns/s"
                        f" ({1000 * plain_s / rounds:,.0f} ms a round): `remember_many` is"
                        f" {plain_s / bulk_s:.2f} of it; this process's CPU (Python, the"
                        f" client's side) {1e6 * bulk_cpu / imported:,.0f} µs a turn."
                    )
                if rounds:  # the same import back to back, its publish inside the time
                    started, cpu = time.perf_counter(), time.process_time()
                    sent_back = await back_to_back(one[0], rounds, senders, args.batch)
                    took = time.perf_counter() - started
                    acknowledged += sent_back
                    notes.append(
                        f"The same import back to back ({who}, no pause between batches, the"
                        " time ending when every event is published: what a bulk import of"
                        f" history sees): {sent_back:,} turns in {took:.2f} s ="
                        f" **{sent_back / took:,.0f} turns/s**; this process's CPU"
                        f" {1e6 * (time.process_time() - cpu) / sent_back:,.0f} µs a turn."
                    )
                notes.append(await check_stored(engine, acknowledged))
            finally:
                for memory in ten + one:
                    await memory.close()
            if not args.no_http and "http" in only:
                async with serve(args.redis_url, url, prefix, "http0") as base:
                    for clients in clients_list:
                        point = await http_point(base, f"h{clients}", clients, args.seconds)
                        rows.append(row("HTTP `serve`", 1, clients, "max", point))
                        if clients == max(clients_list):
                            half = point.rate() / 2
                            paced = await http_point(
                                base, f"h{clients}h", clients, args.seconds, half
                            )
                            offered = f"{half:,.0f}/s (half)"
                            rows.append(row("HTTP `serve`", 1, clients, offered, paced))
                        mixed = await http_point(
                            base, f"h{clients}m", clients, args.seconds, mixed=RECALL_EVERY
                        )
                        rows.append(row("HTTP `serve`", 1, clients, MIXED, mixed))
                        for every in PACED_EVERY if clients == max(clients_list) else ():
                            paced = await http_point(
                                base, f"h{clients}hm{every}", clients, args.seconds,
                                beside(half, every), every,
                            )  # fmt: skip
                            offered = f"{beside(half, every):,.0f}/s: {paced_mix(every)}"
                            rows.append(row("HTTP `serve`", 1, clients, offered, paced))
            await engine.dispose()
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    header = (
        f"`{invocation()}` — {platform.machine()}, {os.cpu_count()} cores (shared with other "
        f"work: compare within the run), Python {platform.python_version()}, {args.seconds:g} s a "
        f"point; load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        "\n\n"
    )
    return (
        header
        + markdown_table(HEADER, rows, "llrrrrrrrrl")
        + "\n\n"
        + markdown_table(
            ["round", "remember", "achieved", "p50 ms", "p99 ms", "errors"], ratios, "llrrrr"
        )
        + "\n\n"
        + "\n".join(f"- {n}" for n in notes)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", default="1,10,50")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--batch-turns", type=int, default=20_000)
    parser.add_argument(
        "--batch-clients",
        type=int,
        default=1,
        help="remember_many batches sent at once (each its own users, one batch after the"
        " other; a bulk import on several connections)",
    )
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument("--sustain", type=float, default=0.0, help="seconds of a last point")
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help="the parts to run, of " + ",".join(PARTS) + " (all by default); run it once with "
        "PYTHONPATH at each of two checkouts, alternating, to compare them in one window",
    )
    args = parser.parse_args()
    random.seed(7)
    print(asyncio.run(run(args)))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
