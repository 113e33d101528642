"""The ``memworker`` command line (README.md "Command line").

Exit status: 0 on success, 2 on a usage error, 1 on failure, with one clear line on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, Protocol, TypeVar

import orjson
import typer
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from worker.connections import client_for
from worker.errors import ActionableError, one_line
from worker.ids import InvalidIdError, validate_id
from worker.keys import StreamKeys, episodes_stream, shard_of
from worker.logs import configure_logging
from worker.redis_conditions import RedisConditionError
from worker.settings import Settings

T = TypeVar("T")

app = typer.Typer(
    name="memworker",
    help="Agent-memory lifecycle worker: commands in on Redis Streams, working memory in "
    "Redis, episodes in Postgres.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Click's plain help: flags show as flags (rich help labels each one `<bool>`), and a
    # usage error is a short "Error: …" line rather than a box.
    rich_markup_mode=None,
)
dlq_app = typer.Typer(
    help="Inspect, redrive and purge dead letters.", no_args_is_help=True, rich_markup_mode=None
)
app.add_typer(dlq_app, name="dlq")

# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns: give them room.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


REJECTED_EXIT_STATUS = 3
"""``publish --wait``: the command was answered ``command.rejected``."""


class CliError(ActionableError):
    """A failure to report as one line on stderr with exit status 1."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


def settings_from_env() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        raise CliError(one_line(exc)) from exc


def check_ids(**ids: str) -> None:
    """Usage error (exit status 2) for any id a key may not carry, e.g. ``project_id="a b"``."""
    for name, value in ids.items():
        try:
            validate_id(value, name)
        except InvalidIdError as exc:
            raise typer.BadParameter(str(exc)) from exc


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def with_redis(settings: Settings, use: Callable[[Redis], Awaitable[T]]) -> T:
    redis: Any = client_for(settings)
    try:
        await redis.ping()
    except (RedisConnectionError, OSError) as exc:
        await redis.aclose()
        raise CliError(f"cannot reach Redis at {settings.redis_url}: {exc}") from exc
    try:
        return await use(redis)
    finally:
        await redis.aclose()


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve_metrics(settings: Settings, port: int | None, is_ready: Callable[[], bool]) -> Any:
    chosen = port if port is not None else settings.metrics_port
    if chosen is None:
        return None
    from worker.metrics import serve_http

    return await serve_http(chosen, is_ready)


MetricsPort = Annotated[
    int | None, typer.Option(help="Serve /metrics, /healthz, /readyz on this port.")
]


class GroupProcess(Protocol):
    """A consumer-group process (``Consolidator``, ``Indexer``) as the CLI runs it."""

    def is_ready(self) -> bool: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    async def close(self) -> None: ...


async def serve_consumer(
    settings: Settings, metrics_port: int | None, process: GroupProcess
) -> None:
    """Run ``process`` until SIGTERM/SIGINT, with /metrics, /healthz, /readyz when asked."""
    stop = asyncio.Event()
    install_stop_signals(stop)
    server = await serve_metrics(settings, metrics_port, process.is_ready)
    try:
        await process.run(stop)
    finally:
        if server is not None:
            server.close()
        await process.close()


@app.command()
def run(
    workers: Annotated[int, typer.Option(min=1, max=64, help="Worker processes to run.")] = 1,
    consumer: Annotated[
        str | None, typer.Option(help="Consumer name (default: host-pid-random).")
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve /metrics, /healthz, /readyz on this port.")
    ] = None,
) -> None:
    """Run the lifecycle worker (consumer group `lifecycle` on every shard)."""
    settings = settings_from_env()
    configure_logging(settings.log_level, settings.log_json)
    if workers > 1:
        raise typer.Exit(_run_processes(workers, consumer, metrics_port))

    async def serve() -> None:
        from worker.lifecycle.worker import LifecycleWorker

        worker = LifecycleWorker(settings, consumer=consumer)
        stop = asyncio.Event()
        install_stop_signals(stop)
        server = await serve_metrics(settings, metrics_port, lambda: worker.ready)
        try:
            await worker.run(stop)
        finally:
            if server is not None:
                server.close()

    run_async(serve())


def _run_processes(workers: int, consumer: str | None, metrics_port: int | None) -> int:
    """Run ``workers`` single-process workers; forward SIGTERM/SIGINT; fail if one fails."""
    children = []
    for n in range(workers):
        cmd = [sys.executable, "-m", "worker.cli", "run"]
        if consumer:
            cmd += ["--consumer", f"{consumer}-{n}"]
        if metrics_port is not None:
            cmd += ["--metrics-port", str(metrics_port + n)]
        children.append(subprocess.Popen(cmd))

    asked: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = []
    for child in children:
        while True:
            try:
                codes.append(child.wait(timeout=1.0))
                break
            except subprocess.TimeoutExpired:
                # A child still importing when the signal came has no handler yet: it may
                # have ignored the signal (SIGINT is ignored in background jobs). Say it again.
                if asked:
                    forward(asked[-1], None)
    stopped = (0, -signal.SIGTERM, -signal.SIGINT, 130)  # 130: interrupted while starting
    return 1 if any(code not in stopped for code in codes) else 0


@app.command()
def consolidate(
    metrics_port: MetricsPort = None,
) -> None:
    """Run the consolidator (group `consolidation`): results into Postgres, episodes out."""
    settings = settings_from_env()
    configure_logging(settings.log_level, settings.log_json)

    from worker.consolidation.consolidator import Consolidator

    run_async(serve_consumer(settings, metrics_port, Consolidator.from_settings(settings)))


@app.command()
def migrate() -> None:
    """Create or upgrade the Postgres schema (safe to run from several replicas at once)."""
    settings = settings_from_env()
    from worker.db.migrate import migrate_reporting

    revision, vectors = run_async(migrate_reporting(settings.database_url))
    out.print(f"schema at revision {revision}")
    if vectors is not None:
        print(f"warning: {vectors}", file=sys.stderr)  # one line, never wrapped


@app.command()
def dev(
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the embedded servers keep data (kept between runs).")
    ] = None,
    metrics_port: Annotated[int, typer.Option(help="Port of /metrics, /healthz, /readyz.")] = 9464,
) -> None:
    """All in one process: embedded servers, migrations, worker and consolidator.

    The embedded servers start unless REDIS_URL / DATABASE_URL are set.
    """
    from worker.ops.dev import run_dev

    run_async(run_dev(data_dir, metrics_port))


# -- driving ---------------------------------------------------------------------------------


def _parse_assignments(values: list[str]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{item!r} is not NAME=VALUE", param_hint="--set")
        try:
            fields[name] = json.loads(raw)
        except json.JSONDecodeError:
            fields[name] = raw
    return fields


@app.command()
def publish(
    command_type: Annotated[
        str, typer.Argument(metavar="TYPE", help="spawn, pause, resume or terminate.")
    ],
    project: Annotated[str, typer.Option("--project", "-p", help="project_id")],
    session: Annotated[str, typer.Option("--session", "-s", help="session_id")],
    agent: Annotated[str, typer.Option("--agent", "-a", help="agent_instance_id")] = "cli",
    field: Annotated[
        list[str] | None,
        typer.Option("--set", help="Another field, NAME=VALUE (VALUE parsed as JSON if it can)."),
    ] = None,
    state: Annotated[
        str | None, typer.Option(help="spawn: initial_state as a JSON object.")
    ] = None,
    event_id: Annotated[str | None, typer.Option(help="event_id (default: a new UUID).")] = None,
    no_seq: Annotated[bool, typer.Option("--no-seq", help="Do not assign a seq.")] = False,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Wait for and print the result; exit status 3 if the command was rejected.",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option(help="Seconds --wait waits.")] = 10.0,
) -> None:
    """Publish one lifecycle command.

    Exit status with --wait: 0 when the command was applied, 3 when it was rejected
    (command.rejected: the result is still printed, its reason on stderr), 1 when no result
    came within --timeout.
    """
    if command_type not in ("spawn", "pause", "resume", "terminate"):
        raise typer.BadParameter("must be spawn, pause, resume or terminate", param_hint="TYPE")
    body: dict[str, Any] = {
        "type": command_type,
        "project_id": project,
        "session_id": session,
        "agent_instance_id": agent,
        **_parse_assignments(field or []),
    }
    if state is not None:
        try:
            body["initial_state"] = json.loads(state)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--state") from exc
    if event_id:
        body["event_id"] = event_id
    check_ids(project_id=project, session_id=session, agent_instance_id=agent)
    settings = settings_from_env()

    async def go(redis: Redis) -> Any:
        from worker.lifecycle.client import LifecycleClient, ResultTimeoutError

        client = LifecycleClient(redis, settings)
        sent = await client.publish(body, assign_seq=not no_seq)
        if not wait:
            out.print(sent)
            return None
        try:
            result = await client.wait(sent, timeout)
        except ResultTimeoutError as exc:
            fail(str(exc))
        print(result.model_dump_json(indent=2), flush=True)
        return result

    result = run_async(with_redis(settings, go))
    if result is not None and result.type == "command.rejected":
        print(f"memworker: rejected: {result.reason}: {result.detail}", file=sys.stderr)
        raise typer.Exit(REJECTED_EXIT_STATUS)


def _print_entry(stream: str, entry_id: str, fields: dict[bytes, bytes], as_json: bool) -> None:
    decoded = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
    data: Any = decoded.get("data")
    if data is not None:
        with contextlib.suppress(orjson.JSONDecodeError):
            data = orjson.loads(data)
    if as_json:
        print(
            json.dumps(
                {
                    "stream": stream,
                    "id": entry_id,
                    "data": data,
                    **{k: v for k, v in decoded.items() if k != "data"},
                }
            ),
            flush=True,
        )
        return
    if isinstance(data, dict) and "source_stream" not in decoded:
        kind = data.get("type", "?")
        who = f"{data.get('project_id', '')}/{data.get('session_id', '')}"
        extra = data.get("reason") or data.get("episode_id") or data.get("checkpoint_id") or ""
        out.print(f"[dim]{entry_id}[/dim] [bold]{kind}[/bold] {who} {extra}", highlight=False)
    else:
        reason = decoded.get("reason", "")
        out.print(
            f"[dim]{entry_id}[/dim] [red]{reason}[/red] {decoded.get('error', '')}", highlight=False
        )


@app.command()
def tail(
    what: Annotated[str, typer.Argument(help="results, episodes, dlq or lifecycle.")] = "results",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Start at the oldest entry, not new ones.")
    ] = False,
    count: Annotated[int | None, typer.Option(help="Stop after this many entries.")] = None,
) -> None:
    """Follow results, episodes, the DLQ or commands as they arrive."""
    if what not in ("results", "episodes", "dlq", "lifecycle"):
        raise typer.BadParameter("must be results, episodes, dlq or lifecycle", param_hint="WHAT")
    settings = settings_from_env()
    if what == "episodes":
        names = [episodes_stream(settings.stream_prefix)]
    else:
        names = [
            getattr(StreamKeys(settings.stream_prefix, i), what) for i in range(settings.shards)
        ]

    async def go(redis: Redis) -> None:
        positions: dict[str, str] = {name: "0-0" if from_start else "$" for name in names}
        seen = 0
        while count is None or seen < count:
            reply: Any = await redis.xread(positions, count=100, block=1000)  # type: ignore[arg-type]
            for stream, entries in reply or []:
                name = stream.decode()
                for entry_id, fields in entries:
                    positions[name] = entry_id.decode()
                    _print_entry(name, entry_id.decode(), fields, as_json)
                    seen += 1
                    if count is not None and seen >= count:
                        return

    run_async(with_redis(settings, go))


@app.command()
def inspect(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[str, typer.Option("--session", "-s")],
) -> None:
    """Show one session's working memory, state and checkpoints (JSON)."""
    settings = settings_from_env()
    check_ids(project_id=project, session_id=session)

    async def go(redis: Redis) -> dict[str, Any]:
        from worker.ops.inspection import inspect_session

        return await inspect_session(redis, settings, project, session)

    view = run_async(with_redis(settings, go))
    if not view["exists"]:
        fail(f"no session {project}/{session} (never spawned, expired, or cleaned up)")
    print(json.dumps(view, indent=2, default=str))


@app.command()
def stats(
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of tables.")] = False,
    dead_after: Annotated[
        float,
        typer.Option(
            min=1, help="Seconds idle after which a consumer without pending entries is dead."
        ),
    ] = 300.0,
    prune_dead_consumers: Annotated[
        bool,
        typer.Option(
            "--prune-dead-consumers",
            help="Delete the dead consumers (never one that owns pending entries).",
        ),
    ] = False,
    rate_seconds: Annotated[
        float,
        typer.Option(
            min=0,
            help="Seconds between the two readings of the lifecycle streams' entries-added "
            "that give the command rate (0: the average over what the streams retain).",
        ),
    ] = 2.0,
    sample_keys: Annotated[
        int,
        typer.Option(
            min=1, help="Keys SCAN visits to measure sessions and dedupe records (a sample)."
        ),
    ] = 2_000,
) -> None:
    """Streams and groups (length, lag, pending, consumers, dead consumers) and Redis capacity:
    memory, bytes per session, per dedupe record and per stream entry, and time until full."""
    settings = settings_from_env()

    async def go(redis: Redis) -> tuple[list[Any], Any, list[tuple[str, str, str]]]:
        from worker.ops.capacity import measure_capacity
        from worker.ops.inspection import prune_dead_consumers as prune
        from worker.ops.inspection import stream_stats

        pruned = await prune(redis, settings, dead_after) if prune_dead_consumers else []
        rows = await stream_stats(redis, settings, dead_after)
        if settings.redis_cluster:  # keys spread over the nodes: no one SCAN sees them
            return rows, None, pruned
        capacity = await measure_capacity(
            redis, settings, rate_seconds=rate_seconds, max_keys=sample_keys
        )
        return rows, capacity, pruned

    rows, capacity, pruned = run_async(with_redis(settings, go))
    if as_json:
        print(
            json.dumps(
                {
                    "streams": [r.as_dict() for r in rows],
                    "capacity": None if capacity is None else capacity.as_dict(),
                    "pruned_consumers": [
                        {"stream": s, "group": g, "consumer": c} for s, g, c in pruned
                    ],
                },
                indent=2,
            )
        )
        return
    table = Table("stream", "length", "group", "lag", "pending", "oldest pending", "consumers")
    for r in rows:
        age = "" if r.oldest_pending_age_s is None else f"{r.oldest_pending_age_s:.1f}s"
        gone = len(r.dead_consumers) + len(r.stalled_consumers)
        table.add_row(
            r.stream,
            str(r.length),
            r.group or "-",
            "" if r.lag is None else str(r.lag),
            str(r.pending),
            age,
            f"{r.consumers} ({gone} dead)" if gone else str(r.consumers),
        )
    out.print(table)
    for r in rows:
        for name in r.dead_consumers:
            out.print(f"dead consumer {name} of {r.stream} {r.group}: no pending entries")
        for name in r.stalled_consumers:
            out.print(
                f"dead consumer {name} of {r.stream} {r.group}: owns pending entries "
                "(reclaimed by a live consumer, then prunable)"
            )
    for stream, group, consumer in pruned:
        out.print(f"pruned consumer {consumer} of {stream} {group}")
    if any(r.dead_consumers for r in rows) and not prune_dead_consumers:
        out.print("remove dead consumers with: memworker stats --prune-dead-consumers")
    if capacity is None:
        out.print("capacity: not measured on a Redis Cluster (keys are spread over the nodes)")
        return
    from worker.ops.capacity import render_capacity

    out.print(render_capacity(capacity, settings), highlight=False)


@app.command()
def replay(
    what: Annotated[
        str, typer.Argument(help="lifecycle (into the worker) or results (into the consolidator).")
    ],
    shard: Annotated[int | None, typer.Option(help="One shard (default: every shard).")] = None,
    start: Annotated[str, typer.Option("--from", help="First entry id (inclusive).")] = "-",
    end: Annotated[str, typer.Option("--to", help="Last entry id (inclusive).")] = "+",
    since: Annotated[
        str | None,
        typer.Option(help="results: from this time (RFC 3339, or ago: 90m, 36h, 7d)."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="results: up to this time (RFC 3339, or ago).")
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="results: one project only.")
    ] = None,
    source: Annotated[
        str,
        typer.Option(
            help="results: read from the stream, or from Postgres (lifecycle_events: every "
            "result, also those older than the stream's retention; a time range)."
        ),
    ] = "stream",
    publish_to: Annotated[
        str | None,
        typer.Option(
            help="results: also publish each replayed result (field data) on this stream, "
            "for subscribers that missed them; every run publishes again (same event_ids)."
        ),
    ] = None,
) -> None:
    """Re-apply a range. Effects are idempotent: replaying twice changes nothing.

    results: stores what Postgres lacks, announces episodes never announced, and with
    --publish-to republishes the results.
    """
    if what not in ("lifecycle", "results"):
        raise typer.BadParameter("must be lifecycle or results", param_hint="WHAT")
    if source not in ("stream", "postgres"):
        raise typer.BadParameter("must be stream or postgres", param_hint="--source")
    settings = settings_from_env()
    shards = [shard] if shard is not None else list(range(settings.shards))
    if any(s < 0 or s >= settings.shards for s in shards):
        raise typer.BadParameter(f"must be 0..{settings.shards - 1}", param_hint="--shard")
    from worker.consolidation.replay import STREAM_ID, ResultRange, parse_instant

    for hint, entry_id, edge in (("--from", start, "-"), ("--to", end, "+")):
        if entry_id != edge and not STREAM_ID.match(entry_id):
            raise typer.BadParameter(
                f"{entry_id!r} is not a stream id (MILLISECONDS-SEQUENCE, e.g. 1700000000000-0)",
                param_hint=hint,
            )

    if what == "lifecycle" and (since or until or project or publish_to or source != "stream"):
        raise typer.BadParameter(
            "--since, --until, --project, --source and --publish-to are for results",
            param_hint="WHAT",
        )
    if source == "postgres" and (start != "-" or end != "+"):
        raise typer.BadParameter(
            "Postgres keeps no stream ids: name the range with --since/--until",
            param_hint="--from/--to",
        )
    bounds: dict[str, Any] = {}
    for name, value in (("since", since), ("until", until)):
        if value is not None:
            try:
                bounds[name] = parse_instant(value)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), param_hint=f"--{name}") from exc
    if project is not None:
        try:
            validate_id(project, "project_id")
        except InvalidIdError as exc:
            raise typer.BadParameter(str(exc), param_hint="--project") from exc
    if publish_to is not None and publish_to in {
        getattr(StreamKeys(settings.stream_prefix, s), kind)
        for s in range(settings.shards)
        for kind in ("lifecycle", "dlq")
    }:
        raise typer.BadParameter(
            "results may not be published on a lifecycle or DLQ stream", param_hint="--publish-to"
        )
    selected = ResultRange(start, end, project=project, **bounds)

    async def go(redis: Redis) -> dict[str, int]:
        from worker.lifecycle.replay import count_range

        total = 0
        if source == "postgres":
            from worker.consolidation.replay import count_archived
            from worker.db.engine import create_database_engine

            engine = create_database_engine(settings.database_url)
            try:
                total = await count_archived(engine, selected)
            finally:
                await engine.dispose()
        else:
            low, high = selected.stream_bounds() if what == "results" else (start, end)
            for s in shards:
                total += await count_range(
                    redis, getattr(StreamKeys(settings.stream_prefix, s), what), low, high
                )
            if what == "results":
                await _warn_if_older_than_the_stream(redis, settings, shards, selected)
        summary: dict[str, int] = {}
        with Progress(
            TextColumn("replaying {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        ) as progress:
            task = progress.add_task(what, total=total)

            def advance(n: int) -> None:
                progress.advance(task, n)

            if source == "postgres":
                from worker.consolidation.replay import replay_results_from_postgres

                counts = await replay_results_from_postgres(
                    redis, settings, shards, selected, publish_to, advance
                )
                for k, v in counts.items():
                    summary[k] = summary.get(k, 0) + v
                return summary
            for s in shards:
                if what == "lifecycle":
                    from worker.lifecycle.replay import replay_lifecycle

                    counts = await replay_lifecycle(redis, settings, s, start, end, advance)
                else:
                    from worker.consolidation.replay import replay_results_from_stream

                    counts = await replay_results_from_stream(
                        redis, settings, s, selected, publish_to, advance
                    )
                for k, v in counts.items():
                    summary[k] = summary.get(k, 0) + v
        return summary

    summary = run_async(with_redis(settings, go))
    out.print(" ".join(f"{k}={v}" for k, v in sorted(summary.items())) or "nothing to replay")


async def _warn_if_older_than_the_stream(
    redis: Redis, settings: Settings, shards: list[int], selected: Any
) -> None:
    """Say so when the range starts before what the stream still holds (trimmed by
    retention): those results are in Postgres."""
    from worker.consolidation.replay import starts_before
    from worker.ops.capacity import stream_usage

    low, _high = selected.stream_bounds()
    names = [StreamKeys(settings.stream_prefix, s).results for s in shards]
    for usage in await stream_usage(redis, names):
        if usage.entries_added <= usage.length:
            continue  # nothing was ever trimmed
        if usage.first_ms is None:
            held = "holds no results any more"
        elif starts_before(low, usage.first_ms):
            oldest = datetime.fromtimestamp(usage.first_ms / 1000, UTC)
            held = f"holds results from {oldest.isoformat(timespec='seconds')} on"
        else:
            continue
        err.print(
            f"note: {usage.stream} {held} (MEMWORKER_RETENTION_SECONDS="
            f"{settings.retention_seconds:g}); older ones are in Postgres: "
            "replay them with --source postgres --since/--until",
            highlight=False,
        )


@app.command()
def schema(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write into.")] = Path(
        "schema"
    ),
) -> None:
    """Write the JSON Schema of every event and the AsyncAPI 3 document."""
    from worker.ops.spec import write_schemas

    for path in write_schemas(out_dir, settings_from_env()):
        out.print(str(path))


# -- dead letters ----------------------------------------------------------------------------


def _dlq_streams(settings: Settings, shard: int | None) -> list[str]:
    shards = [shard] if shard is not None else list(range(settings.shards))
    streams = [StreamKeys(settings.stream_prefix, s).dlq for s in shards]
    if shard is None:  # the indexer's (P:episodes is not sharded)
        from worker.episodes.indexer import indexer_dlq

        streams.append(indexer_dlq(settings.stream_prefix))
    return streams


@dlq_app.command("list")
def dlq_list(
    shard: Annotated[int | None, typer.Option(help="One shard (default: all).")] = None,
    count: Annotated[int, typer.Option(help="At most this many per shard.")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List dead letters, oldest first."""
    settings = settings_from_env()

    async def go(redis: Redis) -> list[tuple[str, str, dict[str, str]]]:
        from worker.consumers.dead_letters import list_dead_letters

        rows = []
        for stream in _dlq_streams(settings, shard):
            rows += [(stream, i, f) for i, f in await list_dead_letters(redis, stream, count)]
        return rows

    rows = run_async(with_redis(settings, go))
    if as_json:
        print(json.dumps([{"stream": s, "id": i, **f} for s, i, f in rows], indent=2))
        return
    table = Table("id", "reason", "source", "deliveries", "error")
    for _stream, entry_id, f in rows:
        table.add_row(
            entry_id,
            f.get("reason", ""),
            f.get("source_id", ""),
            f.get("deliveries", ""),
            f.get("error", "")[:80],
        )
    out.print(table)


@dlq_app.command("show")
def dlq_show(
    entry_id: Annotated[str, typer.Argument(help="The dead letter's id.")],
    shard: Annotated[int, typer.Option(help="Its shard.")] = 0,
) -> None:
    """Show one dead letter in full."""
    settings = settings_from_env()

    async def go(redis: Redis) -> list[tuple[str, dict[str, str]]]:
        from worker.consumers.dead_letters import list_dead_letters

        rows = await list_dead_letters(redis, _dlq_streams(settings, shard)[0], 1, entry_id)
        return [r for r in rows if r[0] == entry_id]

    rows = run_async(with_redis(settings, go))
    if not rows:
        fail(f"no dead letter {entry_id} on shard {shard}")
    print(json.dumps({"id": rows[0][0], **rows[0][1]}, indent=2))


@dlq_app.command("redrive")
def dlq_redrive(
    entry_ids: Annotated[list[str] | None, typer.Argument(help="Ids (default: all).")] = None,
    shard: Annotated[int | None, typer.Option(help="One shard (default: all).")] = None,
) -> None:
    """Publish dead letters back to their source stream and remove them from the DLQ."""
    settings = settings_from_env()

    async def go(redis: Redis) -> int:
        from worker.consumers.dead_letters import redrive

        return sum(
            [await redrive(redis, s, entry_ids or None) for s in _dlq_streams(settings, shard)]
        )

    out.print(f"redriven: {run_async(with_redis(settings, go))}")


@dlq_app.command("purge")
def dlq_purge(
    entry_ids: Annotated[list[str] | None, typer.Argument(help="Ids (default: all).")] = None,
    shard: Annotated[int | None, typer.Option(help="One shard (default: all).")] = None,
    yes: Annotated[bool, typer.Option("--yes", help="Required to purge everything.")] = False,
) -> None:
    """Delete dead letters for good."""
    if not entry_ids and not yes:
        raise typer.BadParameter("purging every dead letter needs --yes", param_hint="--yes")
    settings = settings_from_env()

    async def go(redis: Redis) -> int:
        from worker.consumers.dead_letters import purge

        return sum(
            [await purge(redis, s, entry_ids or None) for s in _dlq_streams(settings, shard)]
        )

    out.print(f"purged: {run_async(with_redis(settings, go))}")


# -- episodes (long-term memory in Postgres) -------------------------------------------------

episodes_app = typer.Typer(
    help="Read the episodes the consolidator stored in Postgres.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(episodes_app, name="episodes")


async def _with_episode_store(settings: Settings, use: Callable[[Any], Awaitable[T]]) -> T:
    from worker.db.engine import create_database_engine
    from worker.episodes.store import EpisodeStore

    engine = create_database_engine(settings.database_url, pool=False)
    try:
        return await use(EpisodeStore(engine))
    finally:
        await engine.dispose()


@episodes_app.command("list")
def episodes_list(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[str | None, typer.Option("--session", "-s")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of a table.")] = False,
) -> None:
    """A project's episodes, newest first (one per finished session)."""
    check_ids(project_id=project, **({"session_id": session} if session else {}))
    settings = settings_from_env()

    async def go(store: Any) -> list[Any]:
        return list(await store.list_episodes(project, session_id=session, limit=limit))

    rows = run_async(_with_episode_store(settings, go))
    if as_json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    table = Table("episode id", "session", "outcome", "finished", "task")
    for r in rows:
        table.add_row(
            str(r.id),
            r.session_id,
            r.outcome,
            r.occurred_at.isoformat(timespec="seconds"),
            (r.task_description or "")[:60],
        )
    out.print(table)


@episodes_app.command("show")
def episodes_show(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="The session's episode.")
    ] = None,
    episode_id: Annotated[
        str | None, typer.Argument(help="An episode id (from `episodes list`).")
    ] = None,
) -> None:
    """One episode in full (JSON): lessons, context summary, snapshot of working memory."""
    if session is None and episode_id is None:
        raise typer.BadParameter("give an EPISODE_ID or --session (`episodes list` shows both)")
    if session is not None and episode_id is not None:
        raise typer.BadParameter("give an EPISODE_ID or --session, not both")
    check_ids(project_id=project, **({"session_id": session} if session else {}))
    settings = settings_from_env()

    async def go(store: Any) -> Any:
        if episode_id is not None:
            return await store.get_episode(project, episode_id)
        found = await store.list_episodes(project, session_id=session, limit=1)
        return found[0] if found else None

    episode = run_async(_with_episode_store(settings, go))
    if episode is None:
        which = f"session {project}/{session}" if session else f"id {episode_id} in {project}"
        fail(
            f"no episode for {which} (not terminated yet, consolidate: false, or not consolidated)"
        )
    print(json.dumps(episode.to_dict(), indent=2))


@app.command()
def shard(
    project: Annotated[str, typer.Option("--project", "-p")],
    session: Annotated[str, typer.Option("--session", "-s")],
) -> None:
    """Print the shard of a session: crc32(project/session) mod MEMWORKER_SHARDS."""
    check_ids(project_id=project, session_id=session)
    settings = settings_from_env()
    out.print(str(shard_of(project, session, settings.shards)))


@app.command()
def recall(
    query: Annotated[str, typer.Argument(help="What to recall, in your own words.")],
    project: Annotated[str, typer.Option("--project", "-p")],
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many episodes.")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="JSON array, best first.")] = False,
) -> None:
    """Recall a project's episodes by meaning and words (hybrid: vectors + full-text)."""
    settings = settings_from_env()
    try:
        validate_id(project, "project_id")
    except InvalidIdError as exc:
        raise typer.BadParameter(str(exc)) from exc
    configure_logging(settings.log_level, settings.log_json)

    async def go() -> list[dict[str, Any]]:
        from worker.db.engine import create_database_engine
        from worker.episodes.embedding import embedder_from_settings
        from worker.episodes.store import EpisodeStore

        engine = create_database_engine(settings.database_url, pool=False)
        try:
            store = EpisodeStore(engine, embedder_from_settings(settings))
            return [hit.to_dict() for hit in await store.recall(project, query, limit)]
        finally:
            await engine.dispose()

    hits = run_async(go())
    if as_json:
        print(json.dumps(hits, indent=2))
        return
    table = Table("score", "occurred at", "outcome", "session", "task", "lessons")
    for hit in hits:
        table.add_row(
            f"{hit['score']:.3f}",
            hit["occurred_at"][:19],
            hit["outcome"],
            hit["session_id"],
            hit["task_description"] or "",
            "; ".join(str(lesson) for lesson in hit["lessons_learned"]),
        )
    out.print(table)


@app.command()
def index(
    metrics_port: MetricsPort = None,
) -> None:
    """Run the indexer (group `indexer` on P:episodes): embed every new episode."""
    settings = settings_from_env()
    configure_logging(settings.log_level, settings.log_json)
    if settings.index_nice:
        os.nice(settings.index_nice)  # embedding yields the CPU to the hot path

    from worker.episodes.indexer import Indexer

    run_async(serve_consumer(settings, metrics_port, Indexer.from_settings(settings)))


@app.command()
def reindex(
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Only this project.")
    ] = None,
) -> None:
    """Embed episodes that have no vector, or one of another model (a backfill)."""
    settings = settings_from_env()
    configure_logging(settings.log_level, settings.log_json)

    async def go() -> int:
        from worker.db.engine import create_database_engine
        from worker.episodes.embedding import embedder_from_settings
        from worker.episodes.indexer import reindex as backfill

        engine = create_database_engine(settings.database_url, pool=False)
        try:
            return await backfill(engine, embedder_from_settings(settings), project_id=project)
        finally:
            await engine.dispose()

    from worker.episodes.embedding import EmbeddingError

    try:
        count = run_async(go())
    except EmbeddingError as exc:
        fail(str(exc))
    out.print(f"embedded {count} episodes")


@app.command()
def remember(
    project: Annotated[str, typer.Option("--project", "-p")],
    memory_id: Annotated[str, typer.Option("--id", help="Your id: remembering twice is once.")],
    task: Annotated[str, typer.Option("--task", help="What the episode was about.")],
    lesson: Annotated[list[str] | None, typer.Option("--lesson", help="A lesson (repeat).")] = None,
    outcome: Annotated[str, typer.Option(help="success, failure, partial, abandoned.")] = "success",
    importance: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.5,
) -> None:
    """Write an episode directly (no session needed); it is announced and indexed."""
    settings = settings_from_env()

    async def go(redis: Redis) -> Any:
        from worker.db.engine import create_database_engine
        from worker.episodes.remember import remember as store

        engine = create_database_engine(settings.database_url, pool=False)
        try:
            return await store(
                engine,
                redis,
                settings.stream_prefix,
                project,
                memory_id,
                task_description=task,
                lessons_learned=lesson or [],
                outcome=outcome,
                importance=importance,
            )
        finally:
            await engine.dispose()

    try:
        remembered = run_async(with_redis(settings, go))
    except (ValueError, InvalidIdError) as exc:
        fail(str(exc))
    out.print(f"episode {remembered.episode_id}")


def plain_help(typer_app: typer.Typer) -> None:
    """Click's plain help for ``typer_app`` and every sub-app registered on it, whoever added
    them: flags show as flags (rich help labels each one ``<bool>``)."""
    typer_app.rich_markup_mode = None
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)


def main() -> None:
    """Entry point: map failures to one stderr line and the contract's exit statuses.

    Usage errors are Typer's (exit status 2, with the usage line); everything raised by a
    command is reported here as ``memworker: error: …`` with exit status 1, translated to one
    line a person can act on by ``worker.errors.one_line``.
    """
    plain_help(app)
    try:
        app()
    except (CliError, RedisConditionError) as exc:
        print(f"memworker: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("MEMWORKER_DEBUG"):
            raise
        print(f"memworker: error: {one_line(exc)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
