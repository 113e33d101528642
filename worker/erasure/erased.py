"""The erasure record in Redis (``P:erased``): what ``forget`` covered, for readers of streams.

``memworker forget`` writes each erasure twice: a row of the Postgres table ``erasures`` (the
durable record: ``worker.db.models.Erasure``) and a field of the hash ``P:erased``: ``project``,
``project/session``, ``project@user`` or ``project/session@user`` (``project@``: the anonymous
bucket, data of no user) → the cutoff in ms (the latest forget's; a later one covers more). Ids
and times only (no id holds ``/`` or ``@``). The paths that read streams and may lack Postgres
(the replay of commands, the DLQ's redrive) check this hash; the consolidator checks the table.
An entry is covered when its project (and session, and user: the ``user_id`` it carries) match
and it is older than the cutoff: the time its stream id says, or the result's ``occurred_at``.
A forget of a time range (``since``) is never a cutoff here (a reader would take it as all
that is older): it is a field ``scope|since_ms`` → cutoff of ``P:erased_ranges``
(``worker.keys.erased_ranges_key``), and covers an entry from ``since_ms`` to the cutoff.
A user's erasure is also a field ``project@user`` of each shard's ``P:{i}:erased_users``
(``worker.keys.erased_users_key``), which the apply function reads in the shard's slot: a
spawn naming the user published before the cutoff is rejected ``forgotten``.

``entry_scope`` also tells forget which stream entries carry a project: a command, a result or
an announcement (its ``data``), or a dead letter of any of them (an entry of a DLQ stream,
``worker.keys.is_dlq_stream``, never one whose fields look like one: the original entry's fields;
of an excerpt, or of an entry that is no whole JSON object, the fields whole in it, and an
excerpt's ids recorded beside it). An entry whose ``data`` the worker's reader (orjson)
refuses, a lone surrogate ``"\\ud83d"`` or a number past a double ``1e400`` in it, is read
leniently (``lenient_body``), so a forget still finds it; one with no ``data`` at all, published
as bare fields, by those fields (``bare_fields``; its dead letter: ``bare_letter``), and so is
one whose ``data`` names no project beside bare id fields (``with_bare``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from worker.codec import (
    UNKNOWN_USER,
    UnusableEntryError,
    decode_entry,
    entry_data,
    leading_fields,
    recorded_ids,
    text,
)
from worker.keys import erased_key, erased_ranges_key, erased_users_key


def entry_scope(fields: Mapping[Any, Any], *, dead_letter: bool) -> tuple[str | None, str | None]:
    """``(project_id, session_id)`` an entry carries (None when it carries none); a dead
    letter's (``dead_letter``: an entry of a DLQ stream) are its original entry's."""
    body = entry_body(fields, dead_letter=dead_letter)
    project, session = body.get("project_id"), body.get("session_id")
    return (
        project if isinstance(project, str) else None,
        session if isinstance(session, str) else None,
    )


def entry_body(fields: Mapping[Any, Any], *, dead_letter: bool) -> dict[str, Any]:
    """The JSON object an entry carries (a dead letter: its original entry's); ``{}``: none.
    Whether it is a dead letter is its stream's to say (``dead_letter``: the entry is on a
    DLQ, ``worker.keys.is_dlq_stream``), never its fields': a command carrying a
    ``source_stream`` of its own beside its ``data`` is read by its ``data``. A dead letter
    whose original ``data`` is no whole JSON object (an excerpt of an entry too large to keep
    whole, or a broken one) gives the top-level fields that are whole in it
    (``codec.leading_fields``) and, over them, the ids recorded beside an excerpt from the
    whole entry (``codec.recorded_ids``: ``original_project_id`` …): those say whose it is
    wherever in the entry they were."""
    try:
        body = decode_entry(fields)
    except (UnusableEntryError, ValueError):
        return lenient_body(fields)
    if dead_letter:
        return _letter_body(body, fields)
    if isinstance(body.get("project_id"), str):
        return body  # the normal case: one lookup more
    return with_bare(body, fields, entry_data(fields))


def _letter_body(original: dict[str, Any], letter: Mapping[Any, Any]) -> dict[str, Any]:
    """``entry_body`` of a dead letter (``original``: the fields it kept)."""
    try:
        return with_bare(decode_entry(original), original, _data_text(original), letter)
    except (UnusableEntryError, ValueError):
        try:
            data = entry_data(original)
        except ValueError:  # a broken FastStream envelope
            return with_bare(recorded_ids(letter), original, _data_text(original), letter)
        if data is None:  # the original had no JSON body: its fields are its ids
            return bare_letter(original, letter)
        whole = leading_fields(data) if isinstance(data, str | bytes) else {}
        return with_bare(whole | recorded_ids(letter), original, data, letter)


_DATA_FIELDS = frozenset({"data", "__data__", b"data", b"__data__"})


def _data_text(fields: Mapping[Any, Any]) -> str:
    """The raw ``data`` (or ``__data__``) of an entry, as text, whatever it holds."""
    raw = fields.get(b"data", fields.get("data"))
    if raw is None:
        raw = fields.get(b"__data__", fields.get("__data__", ""))
    return text(raw) if isinstance(raw, str | bytes) else ""


def with_bare(
    body: dict[str, Any],
    fields: Mapping[Any, Any],
    data: str | bytes | None,
    letter: Mapping[Any, Any] | None = None,
) -> dict[str, Any]:
    """``body`` (what an entry's ``data`` gave) when it names a project; else, when they do,
    the entry's other top-level fields (``bare_fields``; ``fields`` of a dead letter,
    ``letter``: ``bare_letter``): ``data ''``, ``data 'x'``, ``data '{}'`` beside bare ids is
    still its project's, session's and user's. Its ``user_id`` is ``UNKNOWN_USER`` when the
    ``data`` (``data``: its raw text) may name a user other than the bare fields' one: an
    entry that may name another user is never taken for a user's."""
    if isinstance(body.get("project_id"), str):
        return body
    bare = (
        bare_letter(fields, letter)
        if letter is not None
        else bare_fields(fields, skip=_DATA_FIELDS)
    )
    if not isinstance(bare.get("project_id"), str):
        return body
    source = "" if data is None else text(data)
    named = set(_NAMED_USER.findall(source)) if "user_id" in source else set()
    if isinstance(body.get("user_id"), str):
        named.add(body["user_id"])
    unsure = "\\u" in source or ("user_id" in source and not named)
    own = bare.get("user_id")
    users = named | ({own} if isinstance(own, str) else set())
    if unsure or len(users) > 1:
        bare["user_id"] = UNKNOWN_USER
    elif users:
        bare["user_id"] = users.pop()
    return bare


def bare_fields(fields: Mapping[Any, Any], skip: Collection[Any] = ()) -> dict[str, Any]:
    """An entry with no JSON body (no ``data``, no ``__data__``: an orchestrator publishing
    bare fields, ``project_id projA user_id zoe …``; or one whose ``data`` names no project:
    ``with_bare``) read as its top-level fields (but those named in ``skip``), as text: the
    worker dead-letters it ``unparseable``, and it is still its project's, session's and
    user's data."""
    return {text(name): text(value) for name, value in fields.items() if name not in skip}


def bare_letter(original: Mapping[str, Any], letter: Mapping[Any, Any]) -> dict[str, Any]:
    """``bare_fields`` of the entry a dead letter kept (``original``: its fields). Kept whole,
    they are the entry's. Kept as an excerpt (``truncated``), the ids recorded beside it
    (``codec.entry_ids``: every id field of a bare entry, wherever it was) say whose it is;
    a letter without them (written before they were recorded) gives the excerpt's fields
    but its last (it may be cut), and ``UNKNOWN_USER`` when no ``user_id`` is among them: the
    cut may have taken another user's name."""
    if text(letter.get("truncated", letter.get(b"truncated", b""))) != "true":
        return bare_fields(original, skip=_DATA_FIELDS)
    recorded = recorded_ids(letter)
    if "project_id" in recorded:
        return recorded
    kept = dict(list(bare_fields(original).items())[:-1])
    for name in ("data", "__data__"):
        kept.pop(name, None)
    kept.setdefault("user_id", UNKNOWN_USER)
    return kept


_NAMED_USER = re.compile(r'"user_id"\s*:\s*"([A-Za-z0-9._:-]{1,128})"')


def lenient_body(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """The JSON object of an entry orjson refuses (``{}``: none), read as Python's ``json``
    reads it: a lone surrogate (a Node publisher cutting an emoji), ``1e400`` or ``NaN`` are
    read whole. JSON no reader takes whole gives its top-level fields whole before the break
    (``codec.leading_fields``); when its ``user_id`` is not among them and the entry may name
    one further on, it is the one ``"user_id":"…"`` the entry holds if there is exactly one,
    else ``UNKNOWN_USER``: an entry naming another user is never taken for a user's. An entry
    with no JSON body at all gives its bare top-level fields (``bare_fields``)."""
    try:
        raw = entry_data(fields)
    except ValueError:  # a broken FastStream envelope
        return with_bare({}, fields, _data_text(fields))
    if raw is None:
        return bare_fields(fields)
    source = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        whole = json.loads(source)
    except (ValueError, RecursionError):
        whole = None
    if whole is not None:
        return with_bare(whole if isinstance(whole, dict) else {}, fields, source)
    found = leading_fields(source)
    if found and "user_id" not in found and ("user_id" in source or "\\u" in source):
        named = set(_NAMED_USER.findall(source))
        one = len(named) == 1 and "\\u" not in source
        found["user_id"] = named.pop() if one else UNKNOWN_USER
    return with_bare(found, fields, source)


def user_of(body: Mapping[str, Any]) -> str | None:
    """The user an entry's body is data of: its ``user_id``; ``''`` (no user) when it has none
    and would name one if it had (a result, a spawn, a change-feed event); None when it cannot
    say (a session's later command: its session's spawn named the user)."""
    user = body.get("user_id")
    if isinstance(user, str) and user:
        return user
    if "user_id" in body or "causation_id" in body or body.get("type") == "spawn":
        return ""
    return None


def scope_field(project_id: str, session_id: str | None, user_id: str | None) -> str:
    """The field of ``P:erased`` for a scope (module doc)."""
    field_ = project_id if session_id is None else f"{project_id}/{session_id}"
    return field_ if user_id is None else f"{field_}@{user_id}"


_STREAM_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")


def stream_id_parts(value: str | bytes) -> tuple[int, int] | None:
    """``(ms, seq)`` of a stream id (``1700000000000-0``; the ms alone: seq 0); None when
    ``value`` is no stream id."""
    match = _STREAM_ID.fullmatch(text(value))
    return None if match is None else (int(match[1]), int(match[2] or 0))


def entry_ms(entry_id: str | bytes) -> int:
    """The millisecond a stream id says its entry was added (0 for no stream id)."""
    return (stream_id_parts(entry_id) or (0, 0))[0]


def letter_source_id(fields: Mapping[Any, Any]) -> tuple[int, int] | None:
    """``(ms, seq)`` of the entry a dead letter kept (its ``source_id``); None when it has
    none or it is no stream id (the letter is then dated by its own id). Only for an entry of
    a DLQ stream: on any other stream a ``source_id`` is a publisher's field, meaningless."""
    source = fields.get("source_id", fields.get(b"source_id"))
    return stream_id_parts(source) if source else None


def added_ms(entry_id: str | bytes, fields: Mapping[Any, Any], *, dead_letter: bool) -> int:
    """The millisecond an entry was added: its id's; a dead letter's, its source entry's
    (``letter_source_id``), or its own id's when that says nothing."""
    source = letter_source_id(fields) if dead_letter else None
    return source[0] if source is not None else entry_ms(entry_id)


@dataclass(slots=True)
class ErasedIndex:
    """``P:erased`` as read once: cutoffs (ms) by project and by ``project/session``; and
    ``P:erased_ranges``: ``(since, cutoff)`` (ms) by the same names."""

    cutoffs: dict[str, int] = field(default_factory=dict)
    ranges: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def covers(
        self, project: str | None, session: str | None, at_ms: int, user: str | None = None
    ) -> bool:
        """True when a forget covered data of ``project``/``session`` (of ``user``: ``''``
        for data of no user, None when unknown) from ``at_ms``."""
        if project is None:
            return False
        fields = [project]
        if session is not None:
            fields.append(f"{project}/{session}")
        if user is not None:
            fields += [f"{name}@{user}" for name in fields]
        for name in fields:
            cutoff = self.cutoffs.get(name)
            if cutoff is not None and at_ms < cutoff:
                return True
            if any(since <= at_ms < end for since, end in self.ranges.get(name, ())):
                return True
        return False

    def covers_entry(
        self, entry_id: str | bytes, fields: Mapping[Any, Any], *, dead_letter: bool
    ) -> bool:
        """True when a forget covered this stream entry (``dead_letter``: an entry of a DLQ
        stream, dated by its source id; any other by its own id, whatever fields it carries)."""
        if not self.cutoffs and not self.ranges:
            return False
        body = entry_body(fields, dead_letter=dead_letter)
        project, session = body.get("project_id"), body.get("session_id")
        at = added_ms(entry_id, fields, dead_letter=dead_letter)
        return self.covers(
            project if isinstance(project, str) else None,
            session if isinstance(session, str) else None,
            at,
            user_of(body),
        )


async def load_erased(redis: Redis, prefix: str) -> ErasedIndex:
    """The record as it is now."""
    raw: Any = await redis.hgetall(erased_key(prefix))  # type: ignore[misc]
    index = ErasedIndex({text(k): int(v) for k, v in raw.items()})
    ranges: Any = await redis.hgetall(erased_ranges_key(prefix))  # type: ignore[misc]
    for key, value in ranges.items():
        name, _, since = text(key).rpartition("|")
        index.ranges.setdefault(name, []).append((int(since), int(value)))
    return index


async def record_erased(
    redis: Redis,
    prefix: str,
    project_id: str,
    session_id: str | None,
    cutoff_ms: int,
    *,
    user_id: str | None = None,
    shards: int = 1,
    since_ms: int | None = None,
) -> None:
    """Add one erasure to ``P:erased`` (keeping the later cutoff of a scope forgotten twice);
    a named user's (of the whole project) to every shard's ``P:{i}:erased_users`` too. A
    range's (``since_ms``) to ``P:erased_ranges`` only."""
    if since_ms is not None:
        name = f"{scope_field(project_id, session_id, user_id)}|{since_ms}"
        await _keep_later(redis, erased_ranges_key(prefix), name, cutoff_ms)
        return
    await _keep_later(
        redis, erased_key(prefix), scope_field(project_id, session_id, user_id), cutoff_ms
    )
    if user_id and session_id is None:
        for shard in range(shards):
            await _keep_later(
                redis, erased_users_key(prefix, shard), f"{project_id}@{user_id}", cutoff_ms
            )


async def _keep_later(redis: Redis, key: str, name: str, cutoff_ms: int) -> None:
    known = await redis.hget(key, name)  # type: ignore[misc]
    if known is None or int(known) < cutoff_ms:
        await redis.hset(key, name, str(cutoff_ms))  # type: ignore[misc]
