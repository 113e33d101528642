"""Stream entries as Redis keeps them, for forget and export (``worker.erasure.streams``).

A stream entry may give a field name twice (``XADD … data A data B``): Redis keeps every
pair, and redis-py's XRANGE reply makes a dict of them, the last value winning (as the worker
reads it). A forget reads every pair (``raw_batches``: XRANGE with its reply kept as Redis
sent it) and judges such an entry by each of its readings (``Entry.readings``: one for each
value of a name given more than once), so a value the worker never read is not left behind.
An entry with one value per name costs what the parsed reply did: one reading, its fields.
A Redis Cluster client's reply is read as redis-py parses it (the last value of a name).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from worker import codec

XRANGE_BATCH = 1_000

READINGS_CAP = 64
"""The most readings an entry is judged by: a name given thousands of times with as many values
would make a forget copy the entry's fields for each (a publisher's junk, never read by the
worker, which reads the last value: always the first reading). The values past the cap are
left unjudged; the entry is still taken by the forget its first readings fall in."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry: ``fields`` as redis-py gives them (the last value of a name given
    twice), ``readings`` (``(fields,)``; an entry giving a name more than once: a copy of its
    fields for each other value of such a name) and ``pairs`` (every field/value pair, in
    order, when a name is given more than once; None otherwise)."""

    entry_id: Any
    fields: dict[Any, Any]
    readings: tuple[dict[Any, Any], ...]
    pairs: list[tuple[Any, Any]] | None = None


def entry_of(entry_id: Any, flat: list[Any]) -> Entry:
    """An ``Entry`` from a raw reply's flat ``[name, value, name, value, …]``."""
    fields = dict(zip(flat[::2], flat[1::2], strict=True))
    if 2 * len(fields) == len(flat):
        return Entry(entry_id, fields, (fields,))
    pairs = list(zip(flat[::2], flat[1::2], strict=True))
    readings = [fields]
    seen: set[tuple[Any, Any]] = set()
    for name, value in pairs:
        if value == fields[name] or (name, value) in seen:
            continue
        seen.add((name, value))
        readings.append({**fields, name: value})
        if len(readings) > READINGS_CAP:
            break
    return Entry(entry_id, fields, tuple(readings), pairs)


def _raw(response: Any, **_options: Any) -> Any:
    return response


def _raw_client(redis: Redis) -> Redis | None:
    """A client on ``redis``'s connections whose XRANGE reply is Redis's own (every pair);
    None for a client of another kind (a Redis Cluster's: its parsed reply is read)."""
    if not isinstance(redis, Redis):
        return None
    client = Redis(connection_pool=redis.connection_pool)
    client.set_response_callback("XRANGE", _raw)
    return client


async def raw_batches(redis: Redis, stream: str) -> AsyncIterator[list[Entry]]:
    """Every entry of ``stream``, oldest first, ``XRANGE_BATCH`` at a time."""
    client = _raw_client(redis)
    low = "-"
    while True:
        rows: Any = await (client or redis).xrange(stream, min=low, max="+", count=XRANGE_BATCH)
        if rows and client is None:
            yield [Entry(entry_id, fields, (fields,)) for entry_id, fields in rows]
        elif rows:
            yield [entry_of(entry_id, flat or []) for entry_id, flat in rows]
        if len(rows) < XRANGE_BATCH:
            return
        ms, _, seq = codec.text(rows[-1][0]).partition("-")
        low = f"{ms}-{int(seq) + 1}"
