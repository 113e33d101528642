"""``memworker dlq``: inspect, redrive and purge the dead letters of every shard and of
the indexer."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from redis.asyncio import Redis

from worker.cli.common import (
    ShardOption,
    cell,
    chosen_shards,
    fail,
    json_shown,
    new_table,
    out,
    run_async,
    settings_from_env,
    with_redis,
)
from worker.keys import StreamKeys
from worker.settings import Settings

dlq_app = typer.Typer(
    help="Inspect, redrive and purge dead letters.", no_args_is_help=True, rich_markup_mode=None
)


def _dlq_streams(settings: Settings, shard: int | None) -> list[str]:
    streams = [StreamKeys(settings.stream_prefix, s).dlq for s in chosen_shards(settings, shard)]
    if shard is None:  # the indexer's (P:episodes is not sharded)
        from worker.episodes.indexer import indexer_dlq

        streams.append(indexer_dlq(settings.stream_prefix))
    return streams


@dlq_app.command("list")
def dlq_list(
    shard: ShardOption = None,
    count: Annotated[int, typer.Option(help="At most this many per shard.")] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List dead letters, oldest first."""
    settings = settings_from_env()
    streams = _dlq_streams(settings, shard)

    async def go(redis: Redis) -> list[tuple[str, str, dict[str, str]]]:
        from worker.consumers.dead_letters import list_dead_letters

        rows = []
        for stream in streams:
            rows += [(stream, i, f) for i, f in await list_dead_letters(redis, stream, count)]
        return rows

    rows = run_async(with_redis(settings, go))
    if as_json:
        print(
            json_shown(
                json.dumps(
                    [{"stream": s, "id": i, **f} for s, i, f in rows], indent=2, ensure_ascii=False
                )
            )
        )
        return
    table = new_table("id", "reason", "source", "deliveries", "error")
    for _stream, entry_id, f in rows:
        table.add_row(
            entry_id,
            cell(f.get("reason", "")),
            cell(f.get("source_id", "")),
            cell(f.get("deliveries", "")),
            cell(f.get("error", "")[:80]),
        )
    out.print(table)


@dlq_app.command("show")
def dlq_show(
    entry_id: Annotated[str, typer.Argument(help="The dead letter's id.")],
    shard: ShardOption = None,
) -> None:
    """Show one dead letter in full."""
    settings = settings_from_env()
    streams = _dlq_streams(settings, shard)

    async def go(redis: Redis) -> list[tuple[str, dict[str, str]]]:
        from worker.consumers.dead_letters import list_dead_letters

        found = []
        for stream in streams:
            rows = await list_dead_letters(redis, stream, 1, entry_id)
            found += [r for r in rows if r[0] == entry_id]
        return found

    rows = run_async(with_redis(settings, go))
    if not rows:
        fail(f"no dead letter {entry_id} in {', '.join(streams)}")
    print(json_shown(json.dumps({"id": rows[0][0], **rows[0][1]}, indent=2, ensure_ascii=False)))


@dlq_app.command("redrive")
def dlq_redrive(
    entry_ids: Annotated[list[str] | None, typer.Argument(help="Ids (default: all).")] = None,
    shard: ShardOption = None,
) -> None:
    """Publish dead letters back to their source stream and remove them from the DLQ.

    A truncated one (an excerpt of an entry over the stream door's bound) stays: purge it."""
    settings = settings_from_env()
    streams = _dlq_streams(settings, shard)

    async def go(redis: Redis) -> int:
        from worker.consumers.dead_letters import redrive
        from worker.erasure.erased import load_erased

        erased = await load_erased(redis, settings.stream_prefix)  # forgotten: never redriven
        return sum([await redrive(redis, s, entry_ids or None, erased) for s in streams])

    out.print(f"redriven: {run_async(with_redis(settings, go))}")


@dlq_app.command("purge")
def dlq_purge(
    entry_ids: Annotated[list[str] | None, typer.Argument(help="Ids (default: all).")] = None,
    shard: ShardOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Required to purge everything.")] = False,
) -> None:
    """Delete dead letters for good."""
    if not entry_ids and not yes:
        raise typer.BadParameter("purging every dead letter needs --yes", param_hint="--yes")
    settings = settings_from_env()
    streams = _dlq_streams(settings, shard)

    async def go(redis: Redis) -> int:
        from worker.consumers.dead_letters import purge

        return sum([await purge(redis, s, entry_ids or None) for s in streams])

    out.print(f"purged: {run_async(with_redis(settings, go))}")
