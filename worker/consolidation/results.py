"""A result entry into rows: the one decoder of a ``P:results:{i}`` entry.

``decode_entry`` reads the result object out of an entry (its ``data`` field, or FastStream's
``__data__`` body); ``prepare_result`` turns it into the ``lifecycle_events`` row and (an
``agent.terminated`` with ``consolidate``) the ``episodes`` row the consolidator writes, as
tuples (``worker.db.batch``). A result is checked by the cheap structural test of
``worker.consolidation.result_check``; the pydantic model (``parse_result``) decides only what
that test cannot vouch for. ``ParsedResult``, ``event_row`` and ``episode_row`` are the same rows
made from the model, as dicts: the ORM path the benchmarks (``bench/``) measure against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from schemas.results import RESULT_ADAPTER, AgentTerminated, Result
from worker.codec import UnusableEntryError, decode_entry
from worker.consolidation.result_check import check_result
from worker.consumers.loop import StreamEntry
from worker.db.models import EPISODE_NAMESPACE, episode_id_for
from worker.episodes.summary import build_context_summary, summarise
from worker.ids import uuid5_text


@dataclass(frozen=True, slots=True)
class ParsedResult:
    """A result validated by the model, with the JSON it came from (``event_row``,
    ``episode_row``)."""

    entry: StreamEntry
    payload: dict[str, Any]
    result: Result


def _aware(value: datetime | None) -> datetime | None:
    return None if value is None else _utc(value)


def _utc(value: datetime) -> datetime:
    """A timestamp without an offset is UTC's."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


class SnapshotShape(BaseModel):
    """The snapshot's structure, checked without validating each value as JSON again (it came
    out of a JSON parser): a full ``Snapshot`` validation costs more than the INSERT."""

    variables: dict[str, Any]
    task_state: dict[str, Any] | None = None
    scratchpad: list[dict[str, Any]]
    checkpoints: list[str]


_SNAPSHOT_SHAPE = TypeAdapter(SnapshotShape)


def parse_result(payload: dict[str, Any]) -> Result:
    """The validated result; a ``snapshot`` is shape-checked apart (see ``SnapshotShape``)."""
    snapshot = payload.get("snapshot")
    try:
        if snapshot is None:
            result = RESULT_ADAPTER.validate_python(payload)
        else:
            result = RESULT_ADAPTER.validate_python({**payload, "snapshot": None})
            _SNAPSHOT_SHAPE.validate_python(snapshot)
    except ValidationError as exc:
        raise UnusableEntryError("invalid_result", str(exc)) from exc
    needs_ids = isinstance(result, AgentTerminated) and result.consolidate
    if needs_ids and (not result.project_id or not result.session_id):
        raise UnusableEntryError(
            "invalid_result", "agent.terminated with consolidate needs project_id, session_id"
        )
    return result


def event_row(parsed: ParsedResult) -> dict[str, Any]:
    result = parsed.result
    return {
        "event_id": result.event_id,
        "type": result.type,
        "project_id": result.project_id,
        "session_id": result.session_id,
        "agent_instance_id": result.agent_instance_id,
        "causation_id": result.causation_id,
        "command": result.command,
        "seq": result.seq,
        "occurred_at": _aware(result.occurred_at),
        "payload": event_payload(parsed.payload),
    }


def event_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The result as stored in ``lifecycle_events``: all of it but the snapshot, which is
    kept once, in ``episodes.snapshot`` (it can be most of the bytes)."""
    if "snapshot" not in payload:
        return payload
    return {k: v for k, v in payload.items() if k != "snapshot"}


def episode_row(parsed: ParsedResult, summary_max_chars: int) -> dict[str, Any]:
    result = parsed.result
    assert isinstance(result, AgentTerminated)
    return {
        "id": episode_id_for(result.event_id),
        "source_event_id": result.event_id,
        "project_id": result.project_id,
        "session_id": result.session_id,
        "agent_instance_id": result.agent_instance_id,
        "agent_type_id": result.agent_type_id,
        "task_description": result.task_description,
        "outcome": result.outcome,
        "lessons_learned": list(result.lessons_learned),
        "context_summary": build_context_summary(
            result, parsed.payload.get("snapshot"), summary_max_chars
        ),
        "snapshot": parsed.payload.get("snapshot"),
        "tokens_used": result.tokens_used,
        "importance_score": result.importance,
        "duration_seconds": result.duration_seconds,
        "started_at": _aware(result.started_at),
        "occurred_at": _aware(result.occurred_at),
        "user_id": result.user_id,
        "life": result.life or "",
    }


_VALUE_FIELDS = (
    "event_id",
    "type",
    "project_id",
    "session_id",
    "agent_instance_id",
    "agent_type_id",
    "user_id",
    "causation_id",
    "command",
    "seq",
    "consolidate",
    "task_description",
    "outcome",
    "lessons_learned",
    "tokens_used",
    "importance",
    "duration_seconds",
    "life",
)


@dataclass(frozen=True, slots=True)
class PreparedResult:
    """One result as rows: ``EVENT_COLUMNS`` and (when consolidated) ``EPISODE_COLUMNS`` values."""

    entry: StreamEntry
    event: tuple[Any, ...]
    episode: tuple[Any, ...] | None

    @property
    def event_id(self) -> str:
        return str(self.event[0])


def prepare_result(entry: StreamEntry, summary_max_chars: int) -> PreparedResult:
    """The rows of one entry; raises ``UnusableEntryError`` for an entry that has none."""
    payload = decode_entry(entry.fields)
    checked = check_result(payload)
    values: Mapping[str, Any]
    if checked is not None:
        occurred_at, started_at = checked
        values = payload
    else:
        result = parse_result(payload)
        values = {name: getattr(result, name, None) for name in _VALUE_FIELDS}
        occurred_at = _utc(result.occurred_at)
        started_at = _aware(result.started_at) if isinstance(result, AgentTerminated) else None
    get = values.get
    event_id, project_id, session_id = values["event_id"], get("project_id"), get("session_id")
    event = (
        event_id,
        values["type"],
        project_id,
        session_id,
        get("agent_instance_id"),
        values["causation_id"],
        values["command"],
        get("seq"),
        occurred_at,
        orjson.dumps(event_payload(payload)).decode(),
    )
    if values["type"] != "agent.terminated" or not values["consolidate"]:
        return PreparedResult(entry, event, None)
    snapshot = payload.get("snapshot")
    lessons = values["lessons_learned"]
    duration = get("duration_seconds")
    episode = (
        uuid5_text(EPISODE_NAMESPACE, event_id),  # episode_id_for, as text
        event_id,
        project_id,
        session_id,
        get("agent_instance_id"),
        get("agent_type_id"),
        get("task_description"),
        values["outcome"],
        orjson.dumps(lessons).decode(),
        summarise(get("task_description"), values["outcome"], lessons, snapshot, summary_max_chars),
        None if snapshot is None else orjson.dumps(snapshot).decode(),
        get("tokens_used"),
        float(values["importance"]),
        None if duration is None else float(duration),
        started_at,
        occurred_at,
        get("user_id"),
        get("life") or "",  # '' for a session spawned before lives were named
    )
    return PreparedResult(entry, event, episode)
