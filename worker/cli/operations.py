"""Operating a deployment: ``migrate`` the schema, ``stats`` of streams and capacity,
``replay`` a range, and write the event ``schema``."""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from redis.asyncio import Redis

from worker.cli.common import (
    ShardOption,
    chosen_shards,
    database_engine,
    err,
    new_table,
    out,
    run_async,
    settings_from_env,
    with_redis,
)
from worker.ids import InvalidIdError, validate_id
from worker.keys import StreamKeys, own_key_family
from worker.settings import Settings


def migrate() -> None:
    """Create or upgrade the Postgres schema (safe to run from several replicas at once)."""
    settings = settings_from_env()
    from worker.db.migrate import migrate_reporting

    revision, vectors = run_async(
        migrate_reporting(settings.database_url, dimension=settings.vector_dimension)
    )
    out.print(f"schema at revision {revision}")
    if vectors is not None:
        print(f"warning: {vectors}", file=sys.stderr)  # one line, never wrapped


MAX_RATE_SECONDS = 3600.0
"""``stats --rate-seconds``: the longest wait between its two readings (an hour)."""


def _finite(value: float) -> float:
    if not math.isfinite(value):  # nan passes a range's min and max
        raise typer.BadParameter(f"{value} is not a number of seconds")
    return value


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
            max=MAX_RATE_SECONDS,
            callback=_finite,
            help="Seconds between the two readings of the lifecycle streams' entries-added "
            "that give the command rate (0: the average over what the streams retain; at most "
            f"{MAX_RATE_SECONDS:.0f}).",
        ),
    ] = 2.0,
    sample_keys: Annotated[
        int,
        typer.Option(
            min=1, help="Keys SCAN visits to measure sessions and dedupe records (a sample)."
        ),
    ] = 2_000,
) -> None:
    """Streams and groups (length, lag, pending, consumers, dead consumers), the indexing
    backlog (episodes announced, not indexed yet; the oldest's age) and Redis capacity:
    memory, bytes per session, per dedupe record and per stream entry, and time until full."""
    settings = settings_from_env()

    shard_nodes: dict[int, str] = {}
    if settings.redis_cluster:
        from worker.connections import cluster_shard_nodes

        found = run_async(cluster_shard_nodes(settings))
        shard_nodes = {shard: f"{host}:{port}" for shard, (host, port) in found.items()}

    async def go(redis: Redis) -> tuple[list[Any], Any, list[tuple[str, str, str]], Any]:
        from worker.episodes.backlog import indexing_backlog
        from worker.ops.capacity import measure_capacity
        from worker.ops.inspection import prune_dead_consumers as prune
        from worker.ops.inspection import stream_stats

        pruned = await prune(redis, settings, dead_after) if prune_dead_consumers else []
        rows = await stream_stats(redis, settings, dead_after)
        backlog = await indexing_backlog(redis, settings.stream_prefix)
        if settings.redis_cluster:  # keys spread over the nodes: no one SCAN sees them
            return rows, None, pruned, backlog
        capacity = await measure_capacity(
            redis, settings, rate_seconds=rate_seconds, max_keys=sample_keys
        )
        return rows, capacity, pruned, backlog

    rows, capacity, pruned, backlog = run_async(with_redis(settings, go))
    if as_json:
        print(
            json.dumps(
                {
                    "streams": [r.as_dict() for r in rows],
                    "indexing": backlog.as_dict(),
                    "capacity": None if capacity is None else capacity.as_dict(),
                    "pruned_consumers": [
                        {"stream": s, "group": g, "consumer": c} for s, g, c in pruned
                    ],
                    "shard_nodes": {str(k): v for k, v in shard_nodes.items()} or None,
                },
                indent=2,
            )
        )
        return
    # Fits 80 columns with the default prefix: no frame, short headings; a name is never cut.
    table = new_table(box=None, pad_edge=False)
    for heading in ("stream", "length", "group", "lag", "pending", "oldest", "consumers"):
        table.add_column(heading, no_wrap=heading in ("stream", "group"), overflow="fold")
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
    for r in rows:
        if r.removed_unread:
            out.print(
                f"[bold red]{r.stream}: entries were removed before group {r.group} read "
                "them[/] (an XADD … MAXLEN or XTRIM by a user allowed to write it)"
            )
    for stream in sorted({r.stream for r in rows if r.ahead_seconds is not None}):
        ahead = next(r.ahead_seconds for r in rows if r.stream == stream)
        out.print(
            f"[bold red]{stream}: its last id is {ahead:.0f} s ahead of the clock[/] (an entry "
            "XADDed with an explicit future id; later ids keep that time)"
        )
    age = backlog.oldest_age_s()
    out.print(
        f"indexing: {backlog.episodes} episodes announced, not indexed yet"
        + ("" if age is None else f" (oldest {age:.1f}s ago)"),
        highlight=False,
    )
    if any(r.dead_consumers for r in rows) and not prune_dead_consumers:
        out.print("remove dead consumers with: memworker stats --prune-dead-consumers")
    if shard_nodes:
        by_node: dict[str, list[int]] = {}
        for shard, node in shard_nodes.items():
            by_node.setdefault(node, []).append(shard)
        for node, shards in sorted(by_node.items()):
            listed = " ".join(str(s) for s in shards)
            out.print(f"shards on {node}: {listed}", highlight=False)
    if capacity is None:
        out.print("capacity: not measured on a Redis Cluster (keys are spread over the nodes)")
        return
    from worker.ops.capacity import render_capacity

    out.print(render_capacity(capacity, settings), highlight=False)


def replay(
    what: Annotated[
        str, typer.Argument(help="lifecycle (into the worker) or results (into the consolidator).")
    ],
    shard: ShardOption = None,
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
    shards = chosen_shards(settings, shard)
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
    under = f"{settings.stream_prefix}:"
    if publish_to is not None and (not publish_to.startswith(under) or publish_to == under):
        raise typer.BadParameter(
            f"must name a stream under the prefix, {under}NAME (a forget erases there); "
            f"got {publish_to!r:.80}",
            param_hint="--publish-to",
        )
    if publish_to is not None and publish_to in {
        getattr(StreamKeys(settings.stream_prefix, s), kind)
        for s in range(settings.shards)
        for kind in ("lifecycle", "dlq")
    }:
        raise typer.BadParameter(
            "results may not be published on a lifecycle or DLQ stream", param_hint="--publish-to"
        )
    if publish_to is not None and (family := own_key_family(settings.stream_prefix, publish_to)):
        raise typer.BadParameter(
            f"{publish_to!r:.80} is one of memworker's own keys ({under}{family}…): "
            f"name a stream of its own, e.g. {under}replayed:NAME",
            param_hint="--publish-to",
        )
    selected = ResultRange(start, end, project=project, **bounds)

    async def go(redis: Redis) -> dict[str, int]:
        from worker.lifecycle.replay import count_range

        if publish_to is not None:  # a new stream, or one that is a stream already
            from worker.codec import text

            kind = text(await redis.type(publish_to))
            if kind not in ("none", "stream"):
                raise typer.BadParameter(
                    f"{publish_to!r:.80} holds a Redis {kind}, not a stream: name a new "
                    "stream or a stream",
                    param_hint="--publish-to",
                )
        total = 0
        if source == "postgres":
            from worker.consolidation.replay import count_archived

            async with database_engine(settings, pool=True) as engine:
                total = await count_archived(engine, selected)
        else:
            low, high = selected.stream_bounds() if what == "results" else (start, end)
            for s in shards:
                total += await count_range(
                    redis, getattr(StreamKeys(settings.stream_prefix, s), what), low, high
                )
            if what == "results":
                await _warn_if_older_than_the_stream(redis, settings, shards, selected)
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

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
    from worker.ops.capacity_sampling import stream_usage

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


def schema(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write into.")] = Path(
        "schema"
    ),
) -> None:
    """Write the JSON Schema of every event and the AsyncAPI 3 document."""
    from worker.ops.spec import write_schemas

    for path in write_schemas(out_dir, settings_from_env()):
        out.print(str(path))
