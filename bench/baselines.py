"""The plain-way services the benches measure memworker against, run as subprocesses.

    python bench/baselines.py subscriber     # FastStream per-message subscriber, one EVALSHA each
    python bench/baselines.py consolidator   # one entry at a time: INSERT, COMMIT, XACK, XADD

Both read ``REDIS_URL``, ``DATABASE_URL`` and ``MEMWORKER_STREAM_PREFIX`` like ``memworker``,
work on shard 0 only, and run until SIGTERM. They do the same work as the real services (the
same parse and apply script; the same rows and ``episode.recorded`` events) the obvious way,
without batching, so a ratio against them says what the batching buys.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from typing import Any

from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, StreamSub
from harness import ensure_group
from redis.asyncio import Redis
from sqlalchemy.dialects.postgresql import insert

from schemas.results import AgentTerminated
from schemas.streams import EpisodeRecorded
from worker.codec import decode_entry
from worker.consolidation.results import ParsedResult, episode_row, event_row, parse_result
from worker.consumers.loop import StreamEntry
from worker.db.engine import create_database_engine
from worker.db.models import Episode, LifecycleEvent
from worker.keys import CONSOLIDATION_GROUP, LIFECYCLE_GROUP, StreamKeys, episodes_stream
from worker.lifecycle.apply import CommandApplier
from worker.logs import configure_logging
from worker.settings import Settings


async def keep_raw_message(message: Any, original: Any) -> StreamMessage[Any]:
    """FastStream parser that skips body decoding: junk reaches our intake, not a parser."""
    return StreamMessage(raw_message=message, body=b"")


async def raw_entries(message: StreamMessage[Any], original: Any) -> Any:
    """FastStream decoder handing the handler the raw message (``message_ids``, ``data``)."""
    return message.raw_message


def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def plain_subscriber(
    broker: RedisBroker, redis: Redis, applier: CommandApplier, stream: str
) -> None:
    """Register the plain way on ``broker``: FastStream's per-message stream subscriber, the
    same parse and apply script as the worker, one awaited EVALSHA per message through
    redis-py's client."""

    @broker.subscriber(
        stream=StreamSub(stream, group=LIFECYCLE_GROUP, consumer="plain", last_id=">"),
        parser=keep_raw_message,
        decoder=raw_entries,
        ack_policy=AckPolicy.MANUAL,
    )
    async def handle(msg: Any) -> None:
        plan = applier.plan(0, [(msg["message_ids"][0], msg["data"])])
        await redis.execute_command(*plan.commands[0])  # type: ignore[no-untyped-call]


async def subscriber(settings: Settings) -> None:
    """FastStream's per-message stream subscriber: one awaited EVALSHA per message."""
    stop = stop_on_signals()
    streams = StreamKeys(settings.stream_prefix, 0)
    redis = Redis.from_url(settings.redis_url)
    await ensure_group(redis, streams.lifecycle, LIFECYCLE_GROUP)
    broker = RedisBroker(settings.redis_url, logger=None)  # type: ignore[arg-type]
    applier = CommandApplier(redis, settings)
    await applier.ensure_scripts()

    plain_subscriber(broker, redis, applier, streams.lifecycle)
    await broker.start()
    # Redis 7.0 creates a consumer only when a blocking read is served: register it, so the
    # bench can see this service is up (as it does for memworker's, which read pending first).
    await redis.xgroup_createconsumer(streams.lifecycle, LIFECYCLE_GROUP, "plain")
    await stop.wait()
    await broker.stop()
    await redis.aclose()


async def consolidator(settings: Settings) -> None:
    """One result at a time: read it, INSERT its rows, COMMIT, XACK, announce its episode."""
    stop = stop_on_signals()
    stream = StreamKeys(settings.stream_prefix, 0).results
    episodes = episodes_stream(settings.stream_prefix)
    redis = Redis.from_url(settings.redis_url)
    engine = create_database_engine(settings.database_url)
    await ensure_group(redis, stream, CONSOLIDATION_GROUP)
    await redis.xgroup_createconsumer(stream, CONSOLIDATION_GROUP, "plain")
    while not stop.is_set():
        reply: Any = await redis.xreadgroup(
            CONSOLIDATION_GROUP, "plain", {stream: ">"}, count=1, block=100
        )
        if not reply:
            continue
        entry_id, fields = reply[0][1][0]
        entry = StreamEntry(stream, entry_id.decode(), {k.decode(): v for k, v in fields.items()})
        payload = decode_entry(entry.fields)
        parsed = ParsedResult(entry, payload, parse_result(payload))
        result = parsed.result
        consolidate = isinstance(result, AgentTerminated) and result.consolidate
        row = episode_row(parsed, settings.context_summary_max_chars) if consolidate else None
        async with engine.begin() as conn:
            await conn.execute(insert(LifecycleEvent).on_conflict_do_nothing(), [event_row(parsed)])
            if row is not None:
                await conn.execute(insert(Episode).on_conflict_do_nothing(), [row])
        await redis.xack(stream, CONSOLIDATION_GROUP, entry.entry_id)
        if row is not None:
            event = EpisodeRecorded(
                event_id=str(row["id"]) + "-recorded",
                episode_id=str(row["id"]),
                project_id=str(result.project_id),
                session_id=str(result.session_id),
                causation_id=result.event_id,
            )
            await redis.xadd(episodes, {"data": event.model_dump_json()})
    await engine.dispose()
    await redis.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("service", choices=["subscriber", "consolidator"])
    args = parser.parse_args()
    settings = Settings()
    configure_logging(settings.log_level, settings.log_json)
    runner = subscriber if args.service == "subscriber" else consolidator
    asyncio.run(runner(settings))


if __name__ == "__main__":
    main()
