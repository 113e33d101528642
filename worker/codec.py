"""Entries and replies as data: the one place bytes from Redis become text, and a stream
entry's ``data`` field (or FastStream's ``__data__`` envelope) becomes its JSON object.

A reply field may come back as ``bytes`` (the default client) or ``str`` (a client built with
``decode_responses``); every room reads both through ``text``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

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
