"""``ScriptChannel``: one Redis connection that pipelines batches of commands in order.

The worker's hot path sends a whole batch of apply calls, and while Redis executes it the
worker parses the next batch: two batches can be in flight on one connection. Redis runs a
connection's commands in the order they arrive, so commands of one session keep their order
across batches. Replies are parsed by hiredis in C and matched to batches first-in, first-out.

redis-py's pipeline cannot do this (it waits for a batch's replies before the connection is
reused, and reads each reply through a Python timeout context: ~20 µs per command here).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import hiredis
from redis.connection import parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from worker.credentials import mask


def _tls_context(opts: dict[str, Any]) -> ssl.SSLContext:
    """TLS as redis-py reads it from a ``rediss://`` URL's query: ``ssl_ca_certs``,
    ``ssl_certfile``/``ssl_keyfile`` (client certificate), ``ssl_cert_reqs``
    (none/optional/required) and ``ssl_check_hostname``; ``SSL_CERT_FILE`` works too."""
    context = ssl.create_default_context(cafile=opts.get("ssl_ca_certs"))
    if opts.get("ssl_certfile"):
        context.load_cert_chain(opts["ssl_certfile"], opts.get("ssl_keyfile"))
    reqs = str(opts.get("ssl_cert_reqs", "required")).lower()
    if reqs in ("none", "cert_none"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif reqs in ("optional", "cert_optional"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_OPTIONAL
    if str(opts.get("ssl_check_hostname", "true")).lower() in ("false", "0", "no"):
        context.check_hostname = False
    return context


def _keepalive(writer: asyncio.StreamWriter) -> None:
    """TCP keepalive, so a silently dropped peer is noticed in about a minute, not 15."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


@dataclass(slots=True)
class _Waiting:
    expected: int
    future: asyncio.Future[list[Any]]
    replies: list[Any] = field(default_factory=list)


@dataclass(slots=True)
class _Connection:
    """One TCP (or unix) connection with its own queue of batches awaiting replies, so a
    reply arriving late on a dropped connection can never be matched to a newer batch."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    waiting: deque[_Waiting] = field(default_factory=deque)
    read_task: asyncio.Task[None] | None = None
    closed: bool = False

    def fail(self, error: Exception) -> None:
        self.closed = True
        self.writer.close()
        while self.waiting:
            waiting = self.waiting.popleft()
            if not waiting.future.done():
                waiting.future.set_exception(error)


class ScriptChannel:
    """Ordered, pipelined batches over one connection; reconnects on the next batch."""

    def __init__(self, url: str, connect_timeout: float = 5.0, reply_timeout: float = 30.0) -> None:
        self.url = url
        self.shown = mask(url)
        """The URL as errors show it: its password ``***``."""
        self.connect_timeout = connect_timeout
        self.reply_timeout = reply_timeout
        self._options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()

    @property
    def connected(self) -> bool:
        conn = self._conn
        return conn is not None and not conn.closed and not conn.writer.is_closing()

    async def connect(self) -> None:
        async with self._connecting:
            if self.connected:
                return
            opts = self._options
            try:
                if "path" in opts:
                    opened = asyncio.open_unix_connection(opts["path"])
                else:
                    tls = _tls_context(opts) if self.url.startswith("rediss://") else None
                    opened = asyncio.open_connection(
                        opts.get("host", "127.0.0.1"), opts.get("port", 6379), ssl=tls
                    )
                reader, writer = await asyncio.wait_for(opened, self.connect_timeout)
                _keepalive(writer)
            except (OSError, TimeoutError) as exc:
                raise RedisConnectionError(f"cannot connect to {self.shown}: {exc}") from exc
            conn = _Connection(reader, writer)
            conn.read_task = asyncio.create_task(self._read_loop(conn))
            self._conn = conn
            setup: list[list[Any]] = []
            if opts.get("password"):
                auth: list[Any] = ["AUTH"]
                if opts.get("username"):
                    auth.append(opts["username"])
                setup.append([*auth, opts["password"]])
            if opts.get("db"):
                setup.append(["SELECT", int(opts["db"])])
            if setup:
                for reply in await self.submit(setup):
                    if isinstance(reply, Exception):
                        self._drop(conn, RedisConnectionError(f"handshake failed: {reply}"))
                        raise RedisConnectionError(f"handshake with {self.shown} failed: {reply}")

    def submit(self, commands: Sequence[Sequence[Any]]) -> asyncio.Future[list[Any]]:
        """Write a batch now (in call order) and return a future of its replies.

        Raises ConnectionError when not connected: call ``connect`` first.
        """
        conn = self._conn
        if conn is None or not self.connected:
            raise RedisConnectionError(f"not connected to {self.shown}")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        if not commands:
            future.set_result([])
            return future
        payload = b"".join(hiredis.pack_command(tuple(c)) for c in commands)
        conn.waiting.append(_Waiting(len(commands), future))
        conn.writer.write(payload)
        return future

    async def execute(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send a batch and wait for its replies (errors are returned as exceptions).

        Replies overdue by ``reply_timeout`` drop the connection (a silent partition) and
        raise ConnectionError; the caller retries, and the next batch reconnects.
        """
        if not self.connected:
            await self.connect()
        conn = self._conn
        future = self.submit(commands)
        assert conn is not None
        try:
            await conn.writer.drain()
        except (OSError, ConnectionError) as exc:
            self._drop(conn, RedisConnectionError(f"lost connection to {self.shown}: {exc}"))
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.reply_timeout)
        except TimeoutError:
            self.abandon(f"no reply within {self.reply_timeout:g}s")
            return await future

    async def _read_loop(self, conn: _Connection) -> None:
        parser = hiredis.Reader(replyError=ResponseError)
        error: Exception = RedisConnectionError(f"connection to {self.shown} closed")
        try:
            while True:
                data = await conn.reader.read(1 << 16)
                if not data:
                    break
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    _deliver(conn, reply)
        except (OSError, ConnectionError, hiredis.ProtocolError) as exc:
            error = RedisConnectionError(f"lost connection to {self.shown}: {exc}")
        except asyncio.CancelledError:
            error = RedisConnectionError(f"connection to {self.shown} closed")
        self._drop(conn, error)

    def _drop(self, conn: _Connection, error: Exception) -> None:
        """Fail ``conn``'s waiting batches; forget it if it is still the current one."""
        conn.fail(error)
        if self._conn is conn:
            self._conn = None

    def abandon(self, reason: str) -> None:
        """Drop the connection (e.g. replies overdue): every waiting batch fails, the next
        batch reconnects."""
        if self._conn is not None:
            self._drop(self._conn, RedisConnectionError(f"{reason}; reconnecting to {self.shown}"))

    async def close(self) -> None:
        conn = self._conn
        if conn is None:
            return
        self._drop(conn, RedisConnectionError(f"connection to {self.shown} closed"))
        if conn.read_task is not None:
            conn.read_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await conn.read_task


def _deliver(conn: _Connection, reply: Any) -> None:
    if not conn.waiting:
        return
    head = conn.waiting[0]
    head.replies.append(reply)
    if len(head.replies) == head.expected:
        conn.waiting.popleft()
        if not head.future.done():
            head.future.set_result(head.replies)
