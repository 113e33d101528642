"""The ids a command's result and checkpoint get: derived from the command, so replays agree.

A result's ``event_id`` is a uuid5 of (project, the command's ``event_id``); the same SHA-1
names the command's dedupe record in its session's meta hash.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from worker.ids import uuid5_from_sha1, uuid5_text

RESULT_NAMESPACE = uuid.UUID("6f1e4c1a-8b2d-5c3e-9a47-2d0f6b8e1c55")
CHECKPOINT_NAMESPACE = uuid.UUID("0b7d3e29-4f6a-5e18-8c92-7a1d5e3f9b04")


def result_event_id(project_id: str | None, event_id: str) -> str:
    """The result's id: the same command (project, event_id) always yields the same id."""
    return uuid5_text(RESULT_NAMESPACE, f"{project_id or ''}/{event_id}")


RECORD_MARK = b"@"
"""Starts the name of a dedupe record's field in a session's meta hash ('@' is no id
character, so no other field of the hash can start with it)."""


def result_id_and_record(project_id: str | None, event_id: str) -> tuple[str, bytes]:
    """The result's id and the name of the command's dedupe record in its session's meta hash:
    ``@`` + the first 8 bytes (64 bits) of the same SHA-1, whatever the event_id's length, so
    a record stays a small listpack entry (a session would need ~10⁹ commands for a 5 %
    chance that two of its records share a name)."""
    sha1 = hashlib.sha1(RESULT_NAMESPACE.bytes + f"{project_id or ''}/{event_id}".encode()).digest()
    return uuid5_from_sha1(sha1), RECORD_MARK + sha1[:8]


def default_checkpoint_id(project_id: str, event_id: str) -> str:
    """A pause without checkpoint_id gets this one: deterministic, so replays agree."""
    return uuid5_text(CHECKPOINT_NAMESPACE, f"{project_id}/{event_id}")


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def life_of(spawn_event_id: str | None) -> str:
    """A session's life, named by the spawn that started it: 16 hex digits of the SHA-1 of
    the spawn's event_id ('' for none), as the apply function computes it (``redis.sha1hex``)."""
    return hashlib.sha1(spawn_event_id.encode()).hexdigest()[:16] if spawn_event_id else ""


def result_head(
    result_id: str,
    event_id: str,
    command: str | None,
    copied: Mapping[str, Any],
    now_iso: str,
    duration_ms: float,
) -> str:
    """A result's JSON object up to its closing brace (the apply script adds the rest)."""
    body: dict[str, Any] = {
        "event_id": result_id,
        "causation_id": event_id,
        "command": command,
        **copied,
        "occurred_at": now_iso,
        "duration_ms": round(duration_ms, 3),
    }
    return orjson.dumps(body)[:-1].decode()
