"""User memory's network doors under many clients: MCP over HTTP (``memworker mcp --http``)
against the HTTP API (``memworker serve``), and ``serve`` as one process against two.

    .venv/bin/python bench/user_memory_doors.py [--redis-url URL] [--database-url URL] \\
        [--seconds 8] [--clients 50] [--rounds 2]

Every round runs, in turn, 50 clients (``--clients``) calling ``remember`` as fast as answered
(closed loops, each client one user of its own, the turns of ``bench/user_memory_load.py``)
against: one ``serve``; one ``mcp --http`` (a session per client, ``tools/call`` of
``remember``); two ``serve`` processes of the same project, client ``c`` talking to process
``c mod 2`` (what two processes behind one port's balancer give, without a balancer's own
cost); the same ``mcp --http`` spoken to in MCP's 2026-07-28 revision (no session: each call
stands alone). All servers run from the start (idle ones cost nothing measurable), on a fresh
migrated database (dropped at the end) and the given Redis, ``MEMWORKER_REMEMBER_EMBEDDING=indexer``
(the write path: the indexer is not run). Clients are minimal keep-alive HTTP/1.1 clients
(``user_memory_load.Connection``; an MCP answer is read as JSON or as one server-sent event).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
from typing import Any

import orjson
import psutil
from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    cancel_on_sigterm,
    cleanup,
    fresh_database,
    invocation,
    markdown_table,
    unique_prefix,
)
from redis.asyncio import Redis
from sqlalchemy import text
from user_memory_load import OUTPUT, Connection, Point, door_server, drive, ms, words

from worker.db.engine import create_database_engine

PROJECT = "doors"
DOORS = (
    "HTTP `serve`, 1 process",
    "MCP over HTTP, 1 process",
    "HTTP `serve`, 2 processes",
    "MCP over HTTP 2026-07-28, 1 process",
)
MCP_HEADERS = "Accept: application/json, text/event-stream\r\n"
MODERN = "2026-07-28"
"""MCP's revision without sessions: each request stands alone (``MCP-Protocol-Version``
header, the client's version, name and capabilities in the request's ``_meta``)."""
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def server_cpu(bases: list[str]) -> float:
    """CPU seconds (user and system) the ``memworker`` processes listening at ``bases`` have
    used: found by the port on their command line."""
    ports = {base.rsplit(":", 1)[1] for base in bases}
    used = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        line = proc.info["cmdline"] or []
        if "worker.cli" in line and ports & {*line}:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            used += times.user + times.system
    return used


def server(redis_url: str, database_url: str, prefix: str, *args: str) -> Any:
    """``memworker <args> --project doors`` on a free port (``door_server``)."""
    return door_server(redis_url, database_url, prefix, PROJECT, *args)


class McpConnection(Connection):
    """One MCP session over one keep-alive connection: ``initialize``, then ``tools/call``;
    ``modern``: no session, each ``tools/call`` standing alone (``MODERN``)."""

    session = ""
    calls = 0
    modern = False

    async def exchange(self, body: dict[str, Any]) -> tuple[int, dict[bytes, bytes], bytes]:
        data = orjson.dumps(body)
        session = f"Mcp-Session-Id: {self.session}\r\n" if self.session else ""
        if self.modern:  # the routing headers repeat the body's method and tool
            session = (
                f"MCP-Protocol-Version: {MODERN}\r\nMcp-Method: {body['method']}\r\n"
                f"Mcp-Name: {body['params']['name']}\r\n"
            )
        head = (
            f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"{MCP_HEADERS}{session}Content-Length: {len(data)}\r\n\r\n"
        )
        self.writer.write(head.encode() + data)
        await self.writer.drain()
        answer = await self.reader.readuntil(b"\r\n\r\n")
        lines = answer.split(b"\r\n")
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(b":") for line in lines[1:] if line)
        }
        if b"content-length" in headers:
            payload = await self.reader.readexactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding") == b"chunked":
            payload = b""
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                payload += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            await self.reader.readuntil(b"\r\n")
        else:
            payload = b""
        return int(lines[0].split()[1]), headers, payload

    async def start(self) -> None:
        if self.modern:
            return
        status, headers, payload = await self.exchange(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "1"},
                },
            }
        )
        if status != 200:
            raise RuntimeError(f"initialize: {status} {payload[:100]!r}")
        self.session = headers[b"mcp-session-id"].decode()
        await self.exchange({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        status, _headers, payload = await self.exchange(
            {
                "jsonrpc": "2.0",
                "id": self.calls,
                "method": "tools/call",
                "params": {
                    "name": tool,
                    "arguments": arguments,
                    **({"_meta": MODERN_META} if self.modern else {}),
                },
            }
        )
        data = next(
            (line[5:] for line in payload.splitlines() if line.startswith(b"data:")), payload
        )
        reply: dict[str, Any] = orjson.loads(data)
        if status != 200 or "error" in reply or reply["result"].get("isError"):
            raise RuntimeError(f"{status} {payload[:160]!r}")
        return reply


def body(tag: str, c: int, n: int) -> dict[str, Any]:
    return {
        "id": f"{tag}-{c}-{n}",
        "session_id": f"s{c}",
        "user_id": f"u{c}",
        "input": f"please {words(c, n, 12)}",
        "output": OUTPUT,
    }


async def http_point(bases: list[str], tag: str, clients: int, seconds: float) -> Point:
    """``clients`` closed loops of ``POST /v1/remember``, client ``c`` on ``bases[c % len]``."""
    connections = [await Connection.open(bases[c % len(bases)]) for c in range(clients)]

    async def remember(c: int, n: int) -> object:
        status, answer = await connections[c].post("/v1/remember", body(tag, c, n))
        if status != 200:
            raise RuntimeError(f"{status} {answer[:100]!r}")
        return None

    try:
        return await drive(remember, None, clients, seconds)
    finally:
        for connection in connections:
            connection.close()


async def mcp_point(
    base: str, tag: str, clients: int, seconds: float, modern: bool = False
) -> Point:
    """``clients`` closed loops of the ``remember`` tool, a session each (``modern``: none,
    each call standing alone)."""
    connections: list[McpConnection] = []
    for _ in range(clients):
        host, port = base.removeprefix("http://").rsplit(":", 1)
        connection = McpConnection(*await asyncio.open_connection(host, int(port)))
        connection.modern = modern
        await connection.start()
        connections.append(connection)

    async def remember(c: int, n: int) -> object:
        return await connections[c].call("remember", body(tag, c, n))

    try:
        return await drive(remember, None, clients, seconds)
    finally:
        for connection in connections:
            connection.close()


async def run(args: argparse.Namespace) -> str:
    cancel_on_sigterm()
    load_before = os.getloadavg()[0]
    prefix = unique_prefix("user-memory-doors")
    redis = Redis.from_url(args.redis_url)
    rows: list[list[str]] = []
    rates: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}  # the server's CPU seconds a call, by door
    try:
        async with (
            fresh_database(args.database_url) as url,
            server(args.redis_url, url, prefix, "serve") as one,
            server(args.redis_url, url, prefix, "serve") as two,
            server(args.redis_url, url, prefix, "mcp") as mcp,
        ):
            await http_point([one, two], "warm", args.clients, 2.0)  # connections, statements
            await mcp_point(mcp, "warm-mcp", args.clients, 2.0)
            await mcp_point(mcp, "warm-modern", args.clients, 2.0, modern=True)
            for r in range(args.rounds):
                for k, door in enumerate(DOORS):
                    tag, seconds = f"r{r}-{k}", args.seconds
                    bases = [mcp] if k in (1, 3) else [one, two][: k // 2 + 1]
                    cpu = server_cpu(bases)
                    if k in (1, 3):
                        point = await mcp_point(mcp, tag, args.clients, seconds, k == 3)
                    else:
                        point = await http_point(bases, tag, args.clients, seconds)
                    cpu = server_cpu(bases) - cpu
                    cpus.setdefault(door, []).append(cpu / max(1, len(point.remember)))
                    rates.setdefault(door, []).append(point.rate())
                    rows.append(
                        [
                            str(r + 1),
                            door,
                            str(args.clients),
                            f"{point.rate():,.0f}/s",
                            ms(point.remember, 50),
                            ms(point.remember, 99),
                            f"{cpu * 1000 / max(1, len(point.remember)):.2f}",
                            str(point.errors) + (f" ({point.first_error})" if point.errors else ""),
                        ]
                    )
            engine = create_database_engine(url)
            async with engine.connect() as conn:
                stored = (await conn.execute(text("SELECT count(*) FROM episodes"))).scalar_one()
            await engine.dispose()
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    mean = {door: sum(v) / len(v) for door, v in rates.items()}
    http1 = mean[DOORS[0]]
    per_call = {door: sum(v) / len(v) for door, v in cpus.items()}
    notes = [
        f"MCP over HTTP ÷ HTTP (means of the rounds): {mean[DOORS[1]] / http1:.2f}; its "
        f"server's CPU a call ÷ `serve`'s: {per_call[DOORS[1]] / per_call[DOORS[0]]:.2f}",
        f"MCP over HTTP {MODERN} ÷ HTTP (means of the rounds): {mean[DOORS[3]] / http1:.2f};"
        f" its server's CPU a call ÷ `serve`'s: {per_call[DOORS[3]] / per_call[DOORS[0]]:.2f}",
        f"2 processes ÷ 1 (means of the rounds): {mean[DOORS[2]] / http1:.2f}",
        f"{stored:,} turns in Postgres",
    ]
    return (
        f"`{invocation()}` — {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {args.seconds:g} s a point; load average "
        f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end\n\n"
        + markdown_table(
            [
                "round",
                "door",
                "clients",
                "remembers",
                "p50 ms",
                "p99 ms",
                "server CPU ms a call",
                "errors",
            ],
            rows,
            "llrrrrrl",
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
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
