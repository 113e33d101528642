"""Entries and replies as data: the one place bytes from Redis become text, and a stream
entry's ``data`` field (or FastStream's ``__data__`` envelope) becomes its JSON object.

A reply field may come back as ``bytes`` (the default client) or ``str`` (a client built with
``decode_responses``); every room reads both through ``text``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import orjson

from schemas.inputs import InvalidInputError, json_text_problem
from schemas.limits import MAX_ID_CHARS

FASTSTREAM_DATA_FIELD = "__data__"
"""Where a FastStream publisher puts its (binary-framed) body instead of ``data``."""


class UnusableEntryError(ValueError):
    """A stream entry that can never be handled: its DLQ ``reason`` says why."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason


def text(value: bytes | str) -> str:
    """``value`` as text; undecodable bytes are kept as ``\\x..`` escapes, never dropped."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def entry_data(fields: Mapping[Any, Any]) -> bytes | str | None:
    """The JSON text of an entry: its ``data`` field, or the body of FastStream's ``__data__``
    envelope; None when it has neither. Field names may be bytes (as Redis returns them, the
    lifecycle's hot path: one lookup) or text. A broken envelope raises ``ValueError``."""
    raw = fields.get(b"data")
    if raw is None:
        raw = fields.get("data")
    if raw is None:
        envelope = fields.get(b"__data__")
        if envelope is None:
            envelope = fields.get(FASTSTREAM_DATA_FIELD)
        if envelope is not None:
            from faststream.redis.parser.binary import BinaryMessageFormatV1

            raw, _headers = BinaryMessageFormatV1.parse(
                envelope if isinstance(envelope, bytes) else envelope.encode()
            )
    return raw


def decode_entry(fields: Mapping[Any, Any]) -> dict[str, Any]:
    """The JSON object an entry carries (``entry_data``), or ``UnusableEntryError``."""
    raw = entry_data(fields)
    if raw is None:
        raise UnusableEntryError("unparseable", "the entry has no 'data' field")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UnusableEntryError("unparseable", f"'data' is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise UnusableEntryError("unparseable", "'data' is not a JSON object")
    return value


def json_bytes(value: Any, what: str) -> bytes:
    """``value`` as JSON, as every boundary that takes values from callers writes it (a
    command's body, a working-memory value). NaN and Infinity are refused with a
    ``ValueError`` naming where they are (JSON has no such numbers; written as ``null`` they
    would be lost silently); a datetime without a zone is taken as UTC and written with
    ``+00:00``; anything else JSON cannot hold raises a ``TypeError`` naming ``what``. Text
    that cannot be stored as text (a NUL, a lone surrogate, at any depth, in a key or a value:
    Postgres cannot hold either) raises ``schemas.inputs.InvalidInputError`` (a
    ``ValueError``) naming where."""
    try:
        text = orjson.dumps(value, option=orjson.OPT_NAIVE_UTC)
    except TypeError as exc:
        if (bad := json_text_problem(value, what)) is not None:  # a lone surrogate
            raise InvalidInputError(*bad) from exc
        raise TypeError(f"{what} is not JSON-serializable: {exc}") from exc
    # A NUL is written \u0000: looked for in the bytes (one scan), found exactly by the walk.
    if b"\\u0000" in text and (bad := json_text_problem(value, what)) is not None:
        raise InvalidInputError(*bad)
    if b"null" in text and (where := _non_finite(value, what)) is not None:
        raise ValueError(
            f"{where} is not a JSON number (NaN and Infinity have no JSON form); "
            "send null or a string instead"
        )
    return text


def _non_finite(value: Any, where: str) -> str | None:
    """Where in ``value`` a NaN or an infinity is (``what['key'][2]``), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where} ({value!r})"
    if isinstance(value, Mapping):
        for key, item in value.items():
            if (found := _non_finite(item, f"{where}[{key!r}]")) is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (found := _non_finite(item, f"{where}[{i}]")) is not None:
                return found
    return None


def _skip_blanks(source: str, at: int) -> int:
    while at < len(source) and source[at] in " \t\n\r":
        at += 1
    return at


RECORDED_IDS = (
    "project_id",
    "session_id",
    "user_id",
    "type",
    "event_id",
    "causation_id",
    "spawn_event_id",
    "episode_id",
)
"""The top-level fields of a command a forget tells whose it is by (``worker.erasure``): a dead
letter kept as an excerpt records each found anywhere in the whole entry beside the excerpt,
as ``original_<name>`` (``recorded_ids``)."""
RECORDED_ID_PREFIX = "original_"
RECORDED_ID_CHARS = MAX_ID_CHARS + 1
"""A recorded value longer than an id may be is cut to this: still longer than any id, so it
names nobody, as the whole value did."""


UNKNOWN_USER = "\x00unknown"
"""The ``user_id`` a forget gives an entry that may name a user it cannot read
(``worker.erasure.erased.lenient_body``, ``with_bare``; recorded on a dead letter by
``entry_ids``): no id (ids never hold a NUL), so no user's forget (nor the anonymous
bucket's) takes the entry; a forget of its project or session does."""


def entry_ids(fields: Mapping[Any, Any], scan_bytes: int) -> dict[str, str]:
    """The ``original_<name>`` fields of a dead letter kept as an excerpt: each of
    ``RECORDED_IDS`` whole among the top-level fields of the entry's JSON (``entry_data``; the
    last of a name given twice, as a parser takes it) within its first ``scan_bytes``, when it
    is text, cut to ``RECORDED_ID_CHARS``. At most ``len(RECORDED_IDS)`` fields of bounded size
    whatever the entry holds; nested objects' fields are never taken. An entry with no JSON
    body (bare fields, no ``data``), or whose ``data`` names no project (``data ''``, ``'x'``,
    ``'{}'``) beside bare ids, records its own top-level fields of those names; its
    ``user_id`` as ``UNKNOWN_USER`` when the ``data`` may name a user."""
    try:
        raw: bytes | str | None = entry_data(fields)
        found: dict[str, Any] = {}
        if raw is not None:
            found = leading_fields(raw[:scan_bytes], only=RECORDED_IDS)
    except ValueError:  # a broken FastStream envelope
        raw, found = fields.get(b"__data__", fields.get(FASTSTREAM_DATA_FIELD, b"")), {}
    if not isinstance(found.get("project_id"), str):
        bare = {}
        for name in RECORDED_IDS:
            value = fields.get(name.encode(), fields.get(name))
            if value is not None:
                bare[name] = text(value[: 4 * RECORDED_ID_CHARS])
        if "project_id" in bare:
            source = text(raw[:scan_bytes]) if isinstance(raw, bytes | str) else ""
            if "user_id" in source or "\\u" in source:
                bare["user_id"] = UNKNOWN_USER  # the data may name another user
            found = bare
    return {
        f"{RECORDED_ID_PREFIX}{name}": value[:RECORDED_ID_CHARS]
        for name, value in found.items()
        if isinstance(value, str)
    }


def recorded_ids(fields: Mapping[Any, Any]) -> dict[str, str]:
    """What ``entry_ids`` recorded on a dead letter (field names bytes or text), by the
    original field's name."""
    out = {}
    for name in RECORDED_IDS:
        key = RECORDED_ID_PREFIX + name
        value = fields.get(key, fields.get(key.encode()))
        if value is not None:
            out[name] = text(value)
    return out


def leading_fields(raw: bytes | str, only: Collection[str] | None = None) -> dict[str, Any]:
    """The top-level fields of a JSON object that are whole before it is cut or broken (the
    excerpt of a dead letter too large to keep whole: ``worker.consumers.dead_letters``), in
    order (the last of a name given twice); a nested object's fields are never taken for the
    top level's. ``{}`` when ``raw`` starts no object. With ``only``, those names alone are
    kept (each other value is read past and dropped)."""
    source = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    decoder = json.JSONDecoder()
    out: dict[str, Any] = {}
    at = _skip_blanks(source, 0)
    if not source.startswith("{", at):
        return out
    at += 1
    while True:
        at = _skip_blanks(source, at)
        if not source.startswith('"', at):
            return out
        try:
            key, at = scanstring(source, at + 1)
            at = _skip_blanks(source, at)
            if not source.startswith(":", at):
                return out
            at = _skip_blanks(source, at + 1)
            value, at = decoder.raw_decode(source, at)
        except (ValueError, RecursionError):
            return out  # cut here: what came before is whole
        if only is None or key in only:
            out[key] = value
        at = _skip_blanks(source, at)
        if not source.startswith(",", at):
            return out
        at += 1
