"""Dead letters (docs/contract.md "Dead letters"): entries that cannot become a result.

A dead letter is written and its source entry acknowledged in one MULTI/EXEC, so an entry is
never both lost and acknowledged, nor dead-lettered twice by one delivery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline, RedisCluster

from worker.codec import entry_ids, text
from worker.consumers.entries import StreamEntry
from worker.metrics import DEAD_LETTERS

EXCERPT_BYTES = 4_096
"""What a dead letter keeps of an entry too large to keep whole: the first bytes of its first
fields (names included), this many in all."""
EXCERPT_FIELDS = 16
ID_SCAN_FACTOR = 4
"""How far into an entry kept as an excerpt its ids are looked for: this many times the bound
it was over (the worker never parses a ``data`` over 4 x ``MEMWORKER_MAX_EVENT_BYTES``)."""


class ErasureCheck(Protocol):
    """What a redrive asks of the erasure record (``worker.erasure.erased.ErasedIndex``)."""

    def covers_entry(
        self, entry_id: str | bytes, fields: Mapping[Any, Any], *, dead_letter: bool
    ) -> bool: ...


def entry_fields_json(fields: Mapping[Any, Any]) -> str:
    """The original entry's fields as one JSON object (bytes shown with backslash escapes)."""
    items: Any = fields.items()
    return orjson.dumps({text(k): text(v) for k, v in items}).decode()


def entry_size(fields: Mapping[Any, Any]) -> int:
    """An entry's size: its field names and values, in bytes (characters, for text)."""
    return sum(len(k) + len(v) for k, v in fields.items())


def entry_excerpt_json(fields: Mapping[Any, Any]) -> str:
    """The first ``EXCERPT_BYTES`` of an entry's first ``EXCERPT_FIELDS`` fields, as
    ``entry_fields_json`` shows a whole one."""
    out: dict[str, str] = {}
    room = EXCERPT_BYTES
    for name, value in list(fields.items())[:EXCERPT_FIELDS]:
        if room <= 0:
            break
        name = name[: min(room, 128)]
        room -= len(name)
        out[text(name)] = text(value[: max(room, 0)])
        room -= len(value)
    return orjson.dumps(out).decode()


def dead_letter(
    *,
    fields: Mapping[Any, Any],
    source_stream: str,
    source_id: str,
    group: str,
    reason: str,
    error: str,
    deliveries: int,
    keep_bytes: int | None = None,
) -> dict[str, str]:
    """The fields of a DLQ entry, all strings as a stream entry needs. An entry over
    ``keep_bytes`` (the stream door's bound: ``worker.lifecycle.apply``) is kept as an excerpt
    (``entry_excerpt_json``), ``truncated`` true, with the ids whole in it anywhere (not only
    in the excerpt) beside it (``codec.entry_ids``: ``original_project_id`` …), so a forget
    finds whose it is; ``original_bytes`` is its whole size."""
    size = entry_size(fields)
    truncated = keep_bytes is not None and size > keep_bytes
    ids = entry_ids(fields, ID_SCAN_FACTOR * keep_bytes) if keep_bytes and truncated else {}
    return {
        "data": entry_excerpt_json(fields) if truncated else entry_fields_json(fields),
        "original_bytes": str(size),
        "truncated": "true" if truncated else "false",
        **ids,
        "source_stream": source_stream,
        "source_id": source_id,
        "group": group,
        "reason": reason,
        "error": error[:2000],
        "deliveries": str(deliveries),
        "failed_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }


def queue_dead_letter(
    pipe: Pipeline | ClusterPipeline,
    dlq_stream: str,
    letter: dict[str, str],
) -> None:
    """Add the XADD to the DLQ and the XACK of the source entry to a transaction pipeline."""
    pipe.xadd(dlq_stream, letter)  # type: ignore[arg-type]
    pipe.xack(letter["source_stream"], letter["group"], letter["source_id"])


async def write_dead_letters(
    redis: Redis | RedisCluster,
    group: str,
    dlq_stream: Callable[[str], str],
    letters: Sequence[tuple[str, str, Mapping[Any, Any], str, str]],
    deliveries: int = 1,
) -> None:
    """Each ``(stream, entry_id, fields, reason, error)`` to ``dlq_stream(stream)``, atomically
    with its XACK (one MULTI per source stream)."""
    by_stream: dict[str, list[tuple[str, str, Mapping[Any, Any], str, str]]] = {}
    for letter in letters:
        by_stream.setdefault(letter[0], []).append(letter)
    for stream, stream_letters in by_stream.items():
        pipe = redis.pipeline(transaction=True)
        for _stream, entry_id, fields, reason, error in stream_letters:
            fields_of = dead_letter(
                fields=fields,
                source_stream=stream,
                source_id=entry_id,
                group=group,
                reason=reason,
                error=error,
                deliveries=deliveries,
            )
            queue_dead_letter(pipe, dlq_stream(stream), fields_of)
        await pipe.execute()


async def dead_letter_entries(
    redis: Redis | RedisCluster,
    group: str,
    dlq_stream: Callable[[str], str],
    items: Sequence[tuple[StreamEntry, str, str]],
    deliveries: int,
    log: Any,
) -> None:
    """Each ``(entry, reason, error)`` of ``group`` to ``dlq_stream(entry.stream)``, counted
    (``memworker_dead_letters_total``) and logged, atomically with its XACK."""
    for entry, reason, _error in items:
        DEAD_LETTERS.labels(group, reason).inc()
        log.warning(
            "entry dead-lettered", stream=entry.stream, entry_id=entry.entry_id, reason=reason
        )
    letters = [(e.stream, e.entry_id, e.fields, reason, error) for e, reason, error in items]
    await write_dead_letters(redis, group, dlq_stream, letters, deliveries)


async def list_dead_letters(
    redis: Redis, stream: str, count: int = 100, start: str = "-"
) -> list[tuple[str, dict[str, str]]]:
    """The oldest ``count`` dead letters of one DLQ stream from ``start``."""
    rows: Any = await redis.xrange(stream, min=start, max="+", count=count)
    return [
        (i.decode(), {k.decode(): v.decode("utf-8", "replace") for k, v in f.items()})
        for i, f in rows
    ]


async def redrive(
    redis: Redis,
    stream: str,
    entry_ids: list[str] | None = None,
    erased: ErasureCheck | None = None,
) -> int:
    """Publish dead letters' original entries back to their source streams, then drop them.

    Each entry is re-added and deleted in one MULTI/EXEC, so a redrive is never lost or
    doubled. ``stream`` is a DLQ (``worker.keys.is_dlq_stream``): only there do an entry's
    ``source_stream`` and ``source_id`` say where it came from. Without ``entry_ids`` every
    dead letter of the stream is redriven. A dead letter
    a ``memworker forget`` covered (``erased``, ``worker.erasure.erased``) is dropped, never
    republished. A truncated one (an excerpt of an entry over the bound: ``dead_letter``) is
    left in place: its entry is not kept whole, and it would be refused again.
    """
    rows: Any
    if entry_ids is None:
        rows = await redis.xrange(stream, min="-", max="+")
    else:
        rows = []
        for entry_id in entry_ids:
            rows += await redis.xrange(stream, min=entry_id, max=entry_id)
    moved = 0
    for entry_id, fields in rows:
        if erased is not None and erased.covers_entry(entry_id, fields, dead_letter=True):
            await redis.xdel(stream, entry_id)
            continue
        if fields.get(b"truncated") == b"true":
            continue
        original = orjson.loads(fields[b"data"])
        source = fields[b"source_stream"].decode()
        async with redis.pipeline(transaction=True) as pipe:
            pipe.xadd(
                source, {k: v.encode("utf-8", "surrogateescape") for k, v in original.items()}
            )
            pipe.xdel(stream, entry_id)
            await pipe.execute()
        moved += 1
    return moved


async def purge(redis: Redis, stream: str, entry_ids: list[str] | None = None) -> int:
    """Delete dead letters (all of the stream's when no ids are given)."""
    if entry_ids:
        return int(await redis.xdel(stream, *entry_ids))
    length = int(await redis.xlen(stream))
    await redis.delete(stream)
    return length
