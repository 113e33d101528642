"""``memworker dev``: everything in one process on one machine.

Embedded servers (a Valkey and a PostgreSQL shipped in wheels) start unless ``REDIS_URL`` /
``DATABASE_URL`` are set; their data lives under ``--data-dir`` and is kept between runs.
Then the schema is migrated and the lifecycle worker, the consolidator and the indexer (recall
by meaning: ``worker.episodes.indexer``) run side by side.

One ``dev`` per data dir: a lock file (``dev.lock``, holding the pid) refuses a second one
before it touches anything; the lock is an ``flock``, so a crashed instance's lock is free
again. The embedded servers are daemons: SIGTERM, SIGINT and SIGHUP stop them with ``dev``; a
``dev`` killed with SIGKILL has them stopped by its watchdog (``worker.ops.dev_watchdog``)
within seconds, and what is still left running on the data dir (the watchdog killed too) the
next one stops (holding the lock, it knows no live ``dev`` owns them) before it starts its own.

``dev.env`` holds the database URL (and any password in it): it is written only once the
servers are up, readable by its owner only. The embedded Redis keeps its port between
runs when the port is free, so an old ``dev.env`` stays right.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import shlex
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker.consolidation.consolidator import Consolidator
from worker.credentials import mask
from worker.db.migrate import migrate
from worker.episodes.indexer import Indexer
from worker.errors import ActionableError
from worker.lifecycle.worker import LifecycleWorker
from worker.logs import configure_logging
from worker.metrics import serve_http
from worker.ops.dev_watchdog import start_watchdog
from worker.ops.embedded import EmbeddedPostgres, EmbeddedRedis, default_data_dir
from worker.settings import Settings

LOCK_FILE = "dev.lock"
ENV_FILE = "dev.env"
REDIS_PORT_FILE = "valkey/port"


class DevAlreadyRunningError(ActionableError):
    """Another ``memworker dev`` holds this data dir."""


def _say(line: str = "") -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Hold ``data_dir``'s lock for the block, or raise DevAlreadyRunningError."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            raise DevAlreadyRunningError(
                f"another memworker dev (pid {holder}) is running on {data_dir}: use its "
                f"servers (source {data_dir / ENV_FILE}), stop it, or pass another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (it holds secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file may have been created world-readable
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def shell_quoted(value: str) -> str:
    """``value`` as one word a POSIX shell reads back unchanged: always in single quotes (as
    ``shlex.quote`` writes an unsafe one), each ``'`` in it written ``'"'"'``; ``$``, ``"``,
    backslashes, spaces and newlines are then plain characters."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def env_lines(values: dict[str, str]) -> str:
    """``export NAME='value'`` lines, safe to ``source`` whatever a value holds (a password with
    quotes, ``$`` or spaces); ``worker.cli.common.running_dev_env`` reads them back."""
    return "".join(f"export {name}={shell_quoted(value)}\n" for name, value in values.items())


def _port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` (as servers do, with SO_REUSEADDR: the last
    run's connections in TIME_WAIT do not make it taken)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _previous_redis_port(data_dir: Path) -> int | None:
    try:
        return int((data_dir / REDIS_PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def memworker_command() -> str:
    """This memworker as a command that works from any terminal: the absolute path of the
    installed script (``make run`` does not put the virtualenv on PATH)."""
    script = Path(sys.prefix) / "bin" / "memworker"
    if script.exists():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m worker.cli"


async def _start_redis(data_dir: Path) -> tuple[EmbeddedRedis, str]:
    previous = _previous_redis_port(data_dir)
    keep = previous if previous is not None and _port_free(previous) else None
    server = EmbeddedRedis(data_dir / "valkey", port=keep)
    url = await asyncio.to_thread(server.start)
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    if previous is not None and port != previous:
        _say(
            f"note: the embedded Redis's port {previous} (last run) is taken; it now listens "
            f"on {port}: source {data_dir / ENV_FILE} again in other terminals"
        )
    (data_dir / REDIS_PORT_FILE).write_text(f"{port}\n")
    return server, url


async def _stop_leftovers(data_dir: Path) -> None:
    """Stop the embedded servers a ``dev`` killed with SIGKILL left running on ``data_dir``
    (only a holder of the lock may: no live ``dev`` owns them)."""
    for name, server in (
        ("Valkey", EmbeddedRedis(data_dir / "valkey")),
        ("PostgreSQL", EmbeddedPostgres(data_dir / "postgres")),
    ):
        pid = await asyncio.to_thread(server.stop_leftover)
        if pid is not None:
            _say(
                f"note: stopped the embedded {name} (pid {pid}) that a memworker dev which did "
                f"not exit cleanly left running on {data_dir}"
            )


DEFAULT_METRICS_PORT = 9464


async def run_dev(data_dir: Path | None, metrics_port: int | None) -> None:
    base = Settings()
    configure_logging(base.log_level, base.log_json)
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    if metrics_port is None:
        metrics_port = base.metrics_port or DEFAULT_METRICS_PORT
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    with data_dir_lock(data_dir):
        await _stop_leftovers(data_dir)
        if not (os.environ.get("REDIS_URL") and os.environ.get("DATABASE_URL")):
            # Stops the embedded servers when this process ends without stopping them (SIGKILL).
            start_watchdog(data_dir / LOCK_FILE, data_dir / "valkey", data_dir / "postgres")
        await _run_locked(base, data_dir, metrics_port, stop)


async def _run_locked(
    base: Settings, data_dir: Path, metrics_port: int, stop: asyncio.Event
) -> None:
    parts: dict[str, Any] = {}

    def ready() -> bool:
        worker, consolidator = parts.get("worker"), parts.get("consolidator")
        indexer = parts.get("indexer")
        return bool(
            worker
            and consolidator
            and indexer
            and worker.ready
            and consolidator.is_ready()
            and indexer.is_ready()
        )

    # Bind the metrics port first: a taken port fails at once, before any server starts.
    server = await serve_http(metrics_port, ready, host="127.0.0.1")
    redis_server: EmbeddedRedis | None = None
    pg_server: EmbeddedPostgres | None = None
    redis_url, database_url = base.redis_url, base.database_url
    try:
        if not os.environ.get("REDIS_URL") and not stop.is_set():
            redis_server, redis_url = await _start_redis(data_dir)
        if not os.environ.get("DATABASE_URL") and not stop.is_set():
            pg_server = EmbeddedPostgres(data_dir / "postgres")
            database_url = await asyncio.to_thread(pg_server.start)
        if stop.is_set():
            return
        settings = base.model_copy(update={"redis_url": redis_url, "database_url": database_url})
        revision = await migrate(settings.database_url)
        worker = parts["worker"] = LifecycleWorker(settings)
        consolidator = parts["consolidator"] = Consolidator.from_settings(settings)
        indexer = parts["indexer"] = Indexer.from_settings(settings)
        env_file = data_dir / ENV_FILE
        write_private(
            env_file,
            env_lines(
                {
                    "REDIS_URL": settings.redis_url,
                    "DATABASE_URL": settings.database_url,
                    "MEMWORKER_STREAM_PREFIX": settings.stream_prefix,
                }
            ),
        )
        tasks = [
            asyncio.create_task(worker.run(stop)),
            asyncio.create_task(consolidator.run(stop)),
            asyncio.create_task(indexer.run(stop)),
        ]
        _banner(settings, revision, data_dir, metrics_port, env_file, redis_server, pg_server)
        await stop.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
        await consolidator.close()
        await indexer.close()
    finally:
        server.close()
        if pg_server is not None:
            await asyncio.to_thread(pg_server.stop)
        if redis_server is not None:
            await asyncio.to_thread(redis_server.stop)


def _banner(
    settings: Settings,
    revision: str,
    data_dir: Path,
    metrics_port: int,
    env_file: Path,
    redis_server: EmbeddedRedis | None,
    pg_server: EmbeddedPostgres | None,
) -> None:
    cmd = memworker_command()
    _say("memworker dev is running.")
    _say(f"  redis     {mask(settings.redis_url)}" + ("  (embedded)" if redis_server else ""))
    _say(f"  postgres  {mask(settings.database_url)}" + ("  (embedded)" if pg_server else ""))
    _say(f"  schema    revision {revision}")
    _say(f"  data      {data_dir}")
    _say(f"  metrics   http://127.0.0.1:{metrics_port}/metrics  (/healthz, /readyz)")
    _say(
        f"  streams   {settings.stream_prefix}:lifecycle:{{0}} → worker → "
        f"{settings.stream_prefix}:results:{{0}} → consolidator → Postgres"
    )
    _say()
    _say("From another terminal:")
    _say(f"  source {shlex.quote(str(env_file))}")
    _say(f'  {cmd} publish spawn -p demo -s s1 --state \'{{"goal": "hello"}}\' --wait')
    _say(f"  {cmd} publish terminate -p demo -s s1 --set lessons_learned='[\"it works\"]' --wait")
    _say(f"  {cmd} tail episodes --from-start --count 1")
    _say(f"  {cmd} episodes show -p demo -s s1")
    _say(f'  {cmd} recall -p demo "what worked"')
    _say()
    _say("Ctrl-C stops everything (data is kept).")
