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

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from worker import codec

XRANGE_BATCH = 1_000

_IDS = ("project_id", "session_id", "user_id", "type", "causation_id")
_DATA = ("data", "__data__")
SCOPE_NAMES = frozenset({n for name in (*_DATA, *_IDS) for n in (name, name.encode())})
"""The fields whose values say whose an entry is (its JSON ``data``, or bare ids beside it):
an entry's other readings vary only these, and carry only these (a few names each, whatever
the entry holds: a name given thousands of times costs a forget the entry's size, not its
size times its names)."""

_DATA_NAMES = frozenset({n for name in _DATA for n in (name, name.encode())})


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry: ``fields`` as redis-py gives them (the last value of a name given
    twice), ``readings`` (``(fields,)``, then, for an entry giving one of ``SCOPE_NAMES`` more
    than once, one for each other value of it; and for an entry whose ``data`` sits beside a
    bare ``project_id``, one of its bare ids alone) and ``pairs`` (every field/value pair, in
    order, when a name is given more than once; None otherwise)."""

    entry_id: Any
    fields: dict[Any, Any]
    readings: tuple[dict[Any, Any], ...]
    pairs: list[tuple[Any, Any]] | None = None


def _other_project(fields: dict[Any, Any]) -> bool:
    """Whether the entry has a ``data`` and a bare ``project_id`` its ``data`` does not name
    (the worker reads the ``data``; the bare fields say another project's data is here too)."""
    project = fields.get(b"project_id", fields.get("project_id"))
    if project is None or _DATA_NAMES.isdisjoint(fields):
        return False
    data = fields.get(b"data", fields.get("data", fields.get(b"__data__", fields.get("__data__"))))
    named = re.escape(codec.text(project))
    return re.search(rf'"project_id"\s*:\s*"{named}"', codec.text(data or b"")) is None


def entry_of(entry_id: Any, flat: list[Any]) -> Entry:
    """An ``Entry`` from a raw reply's flat ``[name, value, name, value, …]``."""
    fields = dict(zip(flat[::2], flat[1::2], strict=True))
    twice = 2 * len(fields) != len(flat)
    bare = _other_project(fields)
    if not twice and not bare:
        return Entry(entry_id, fields, (fields,))
    scope = {name: value for name, value in fields.items() if name in SCOPE_NAMES}
    readings = [fields]
    if bare:  # data naming one project, bare ids another: each is read
        readings.append({n: v for n, v in scope.items() if n not in _DATA_NAMES})
    if not twice:
        return Entry(entry_id, fields, tuple(readings))
    pairs = list(zip(flat[::2], flat[1::2], strict=True))
    seen: set[tuple[Any, Any]] = set()
    for name, value in pairs:
        if name not in SCOPE_NAMES or value == fields[name] or (name, value) in seen:
            continue
        seen.add((name, value))
        readings.append({**scope, name: value})
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
