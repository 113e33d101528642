"""Turning a raw stream entry into something the apply function can take.

Every entry becomes exactly one of: a valid command (``Accepted``), a command to reject with a
reason (``Refused``: it has a usable ``event_id``, so it gets a ``command.rejected`` result), or
a dead letter (``Unusable``: not JSON, not an object, or no usable ``event_id``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from schemas.commands import (
    COMMAND_ADAPTER,
    COMMAND_TYPES,
    MAX_ENVELOPE_EXTRA_BYTES,
    MAX_SAFE_INT,
    MAX_TRACEPARENT_BYTES,
    Command,
    PauseCommand,
    ResumeCommand,
    SpawnCommand,
    TerminateCommand,
)
from schemas.inputs import json_text_problem
from schemas.limits import SCHEMA_VERSION
from worker.codec import entry_data
from worker.ids import is_valid_id, is_valid_write_id
from worker.keys import shard_of
from worker.settings import Settings

TRACEPARENT_FIELD = b"traceparent"


@dataclass(frozen=True, slots=True)
class Accepted:
    command: Command
    raw: dict[str, Any]
    encoded_state: list[tuple[str, bytes]]
    """Spawn only: initial_state as (key, JSON text) pairs, encoded once here."""
    traceparent: str | None


@dataclass(frozen=True, slots=True)
class Refused:
    raw: dict[str, Any]
    event_id: str
    reason: str
    detail: str
    traceparent: str | None

    @property
    def spawn_user(self) -> str:
        """The ``user_id`` a refused spawn's result carries: its own, when it is an id a write
        may name ('' otherwise, and for other commands; the apply function leaves it out when
        a forget took that user after the spawn was published)."""
        user = self.raw.get("user_id")
        return str(user) if self.raw.get("type") == "spawn" and is_valid_write_id(user) else ""


@dataclass(frozen=True, slots=True)
class Unusable:
    error: str


Intake = Accepted | Refused | Unusable


def fits_in_result(value: Any) -> bool:
    """Whether ``value`` can be encoded as a member of a result: orjson refuses deep nesting,
    and pydantic lets through a level or two more than a result can carry."""
    try:
        orjson.dumps({"v": value})
    except TypeError:
        return False
    return True


def copied_fields(raw: Mapping[str, Any], *, keep_metadata: bool) -> dict[str, Any]:
    """Fields a rejection copies from a command that failed validation, where usable (a
    project or session id by the write rule: ``..`` names no session, as ``a b`` does not)."""
    out: dict[str, Any] = {}
    for name in ("project_id", "session_id", "agent_instance_id", "agent_type_id"):
        value = raw.get(name)
        rule = is_valid_write_id if name in ("project_id", "session_id") else is_valid_id
        out[name] = value if rule(value) else None
    seq = raw.get("seq")
    usable_seq = isinstance(seq, int) and not isinstance(seq, bool) and 1 <= seq <= MAX_SAFE_INT
    out["seq"] = seq if usable_seq else None
    corr = raw.get("correlation_id")
    out["correlation_id"] = corr if isinstance(corr, str) and len(corr) <= 128 else None
    meta = raw.get("metadata")
    usable = keep_metadata and isinstance(meta, dict) and fits_in_result(meta)
    out["metadata"] = meta if usable else None
    return out


_DEPTH_IN_RESULT = 4
"""How deep a variable sits in a terminate result: result → snapshot → variables → value."""
_WRAP_OPEN = len(b'{"v":') * _DEPTH_IN_RESULT


def encode_as_nested(value: Any) -> bytes:
    """``value``'s JSON, encoded as deep as it will sit in a terminate result, so a value too
    deeply nested for orjson there (TypeError) is refused at intake, in the same single pass."""
    wrapped = value
    for _ in range(_DEPTH_IN_RESULT):
        wrapped = {"v": wrapped}
    return orjson.dumps(wrapped)[_WRAP_OPEN:-_DEPTH_IN_RESULT]


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False)[:8]:
        where = ".".join(str(p) for p in item["loc"] if p not in COMMAND_TYPES) or "command"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - len(parts)
    text = "; ".join(parts)
    return text + (f"; and {more} more" if more > 0 else "")


_COMMAND_FIELDS = frozenset(
    name
    for model in (SpawnCommand, PauseCommand, ResumeCommand, TerminateCommand)
    for name in model.model_fields
)


def _nul_in_fields(raw: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first command field holding a NUL character at any depth (``metadata['m']``,
    ``initial_state (a key, ...)``, ``correlation_id``): text cannot hold one, and the
    session's rows in Postgres would be refused. Only looked for when the entry's JSON has
    ``\\u0000`` at all (one scan of its bytes); a lone surrogate, which orjson cannot read, is
    found by ``_lenient``."""
    for name, value in raw.items():
        if name in _COMMAND_FIELDS and (bad := json_text_problem(value, name)) is not None:
            return bad
    return None


def _lenient(payload: bytes | str) -> tuple[dict[str, Any], tuple[str, str]] | None:
    """JSON orjson refuses but ``json`` reads because of a lone surrogate (``"\\ud800"``): the
    command with each such text made printable, and the first field holding one; else None."""
    try:
        raw = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    found = _nul_in_fields(raw) or json_text_problem(raw, "data")
    return None if found is None else (_printable(raw), found)


def _printable(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


UNREAD_FACTOR = 4
"""An entry's ``data`` over this many times ``MEMWORKER_MAX_EVENT_BYTES`` is not parsed at all
(dead-lettered as an excerpt): parsing builds objects tens of times the entry's size. Up to it,
an oversized command is parsed for its ``event_id`` and answered ``limit_exceeded``."""


def parse_entry(fields: Mapping[bytes, bytes], shard: int, settings: Settings) -> Intake:
    """Classify one entry of ``P:lifecycle:{shard}``."""
    try:
        payload = entry_data(fields)
    except Exception as exc:
        return Unusable(f"FastStream envelope in __data__ could not be read: {exc}")
    if payload is None:
        return Unusable("entry has no 'data' field (nor FastStream's '__data__')")
    if len(payload) > UNREAD_FACTOR * settings.max_event_bytes:
        return Unusable(  # never parsed: its objects would take tens of times its size
            f"'data' is {len(payload)} bytes, over {UNREAD_FACTOR}x the limit of "
            f"{settings.max_event_bytes} (MEMWORKER_MAX_EVENT_BYTES): not read"
        )
    unstorable = None
    try:
        raw = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        if (lenient := _lenient(payload)) is None:
            return Unusable(f"'data' is not valid UTF-8 JSON: {exc}")
        raw, unstorable = lenient  # a lone surrogate: rejected below, naming its field
    if not isinstance(raw, dict):
        return Unusable(f"'data' is JSON {type(raw).__name__}, not an object")
    event_id = raw.get("event_id")
    if not is_valid_id(event_id):
        return Unusable(
            "no usable event_id (it must be 1-128 characters of [A-Za-z0-9._:-]); "
            f"got {event_id!r:.80}"
        )
    assert isinstance(event_id, str)
    trace = fields.get(TRACEPARENT_FIELD)
    traceparent = trace.decode("utf-8", "replace") if trace else None

    def refuse(reason: str, detail: str) -> Refused:
        return Refused(raw, event_id, reason, detail, traceparent)

    if len(payload) > settings.max_event_bytes:
        return refuse(
            "limit_exceeded",
            f"event is {len(payload)} bytes, over the limit of {settings.max_event_bytes} "
            "(MEMWORKER_MAX_EVENT_BYTES); keep large state out of commands",
        )
    if len(fields) > 1:  # more than the command: bounded too (never copied when over)
        if trace and len(trace) > MAX_TRACEPARENT_BYTES:
            return Refused(
                raw,
                event_id,
                "limit_exceeded",
                f"traceparent is {len(trace)} bytes, over the limit of {MAX_TRACEPARENT_BYTES}",
                None,
            )
        size = sum(len(k) + len(v) for k, v in fields.items())
        if size > settings.max_event_bytes + MAX_ENVELOPE_EXTRA_BYTES:
            return refuse(
                "limit_exceeded",
                f"stream entry is {size} bytes, over the limit of {settings.max_event_bytes} "
                f"(MEMWORKER_MAX_EVENT_BYTES) + {MAX_ENVELOPE_EXTRA_BYTES} for its other fields",
            )
    version = raw.get("schema_version", 1)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        return refuse(
            "unsupported_version",
            f"schema_version {version} is newer than this worker's {SCHEMA_VERSION}; "
            "upgrade the worker or publish version 1",
        )
    if raw.get("type") not in COMMAND_TYPES:
        return refuse(
            "invalid_event",
            f"type must be one of {', '.join(COMMAND_TYPES)}; got {raw.get('type')!r:.60}",
        )
    if unstorable is not None:
        return refuse("invalid_event", f"invalid fields: {unstorable[0]}: {unstorable[1]}")
    if b"\\u0000" in payload and (bad := _nul_in_fields(raw)) is not None:
        return refuse("invalid_event", f"invalid fields: {bad[0]}: {bad[1]}")
    try:
        command = COMMAND_ADAPTER.validate_python(raw)
    except ValidationError as exc:
        return refuse("invalid_event", "invalid fields: " + _describe(exc))
    if command.metadata is not None and not fits_in_result(command.metadata):
        return refuse(
            "invalid_event",
            "metadata is nested too deeply to be copied to the result; keep it under 250 levels",
        )
    expected = shard_of(command.project_id, command.session_id, settings.shards)
    if expected != shard:
        return refuse(
            "invalid_event",
            f"published on shard {shard} but this session belongs to shard {expected} "
            f"(crc32(project_id/session_id) mod {settings.shards})",
        )
    encoded: list[tuple[str, bytes]] = []
    if isinstance(command, SpawnCommand):
        if len(command.initial_state) > settings.max_keys_per_session:
            return refuse(
                "limit_exceeded",
                f"initial_state has {len(command.initial_state)} keys, over the limit of "
                f"{settings.max_keys_per_session} (MEMWORKER_MAX_KEYS_PER_SESSION)",
            )
        for key, value in command.initial_state.items():
            try:
                text = encode_as_nested(value)
            except TypeError:
                return refuse(
                    "invalid_event",
                    f"initial_state[{key!r:.60}] is nested too deeply; keep values under "
                    "250 levels",
                )
            if len(text) > settings.max_value_bytes:
                return refuse(
                    "limit_exceeded",
                    f"initial_state[{key!r:.60}] is {len(text)} bytes, over the limit of "
                    f"{settings.max_value_bytes} (MEMWORKER_MAX_VALUE_BYTES)",
                )
            encoded.append((key, text))
    return Accepted(command, raw, encoded, traceparent)
