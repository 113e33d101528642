"""The cheap check of a result: exact JSON types stand in for the pydantic model.

Validating a result with pydantic cost more than writing it. Nearly every result is a
well-formed JSON object from the lifecycle worker, so a structural check of exact JSON types
stands in for the model: it accepts only what the model accepts (and reads it the same way),
and anything else (a coercible value, an unusual timestamp, an error) goes to the model
(``worker.consolidation.results.parse_result``), which accepts it or explains precisely why
not for the DLQ.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, get_args

from schemas.commands import Outcome
from schemas.results import RejectionReason, Result

Check = Callable[[Any], bool]

_INSTANT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?(?:Z|[+-][0-9]{2}:[0-9]{2})"
)


def _instant(value: Any) -> datetime | None:
    """An RFC 3339 timestamp with an offset (as Python and pydantic both read it), else None."""
    if type(value) is str and _INSTANT.fullmatch(value):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(value)
    return None


def _is_str(value: Any) -> bool:
    return type(value) is str


def _is_str_or_none(value: Any) -> bool:
    return value is None or type(value) is str


def _is_int_or_none(value: Any) -> bool:
    return value is None or type(value) is int


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_duration(value: Any) -> bool:
    return (type(value) is float or type(value) is int) and value >= 0


def _is_number_or_none(value: Any) -> bool:
    return value is None or type(value) is float or type(value) is int


def _is_fraction(value: Any) -> bool:
    return (type(value) is float or type(value) is int) and 0 <= value <= 1


def _is_bool(value: Any) -> bool:
    return type(value) is bool


def _is_object_or_none(value: Any) -> bool:
    return value is None or type(value) is dict


_STR_ONLY = frozenset({str})
_OBJECTS_ONLY = frozenset({dict})


def _is_str_list(value: Any) -> bool:
    return type(value) is list and _STR_ONLY.issuperset(map(type, value))


def _one_of(*allowed: str) -> Check:
    values = frozenset(allowed)
    return lambda value: type(value) is str and value in values


def _is_snapshot_or_none(value: Any) -> bool:
    """``SnapshotShape``, checked the same way."""
    if value is None:
        return True
    if type(value) is not dict:
        return False
    scratchpad, checkpoints = value.get("scratchpad"), value.get("checkpoints")
    return (
        type(value.get("variables")) is dict
        and _is_object_or_none(value.get("task_state"))
        and type(scratchpad) is list
        and _OBJECTS_ONLY.issuperset(map(type, scratchpad))
        and _is_str_list(checkpoints)
    )


_COMMON_FIELDS: tuple[tuple[str, Check, bool], ...] = (  # name, check, required
    ("event_id", _is_str, True),
    ("causation_id", _is_str, True),
    ("command", _is_str_or_none, True),
    ("duration_ms", _is_duration, True),
    ("project_id", _is_str_or_none, False),
    ("session_id", _is_str_or_none, False),
    ("agent_instance_id", _is_str_or_none, False),
    ("agent_type_id", _is_str_or_none, False),
    ("user_id", _is_str_or_none, False),
    ("seq", _is_int_or_none, False),
    ("correlation_id", _is_str_or_none, False),
    ("metadata", _is_object_or_none, False),
)
_TIMESTAMP_FIELDS = frozenset({"occurred_at", "started_at"})  # checked apart: parsed too
_FIELDS_OF: dict[str, tuple[tuple[str, Check, bool], ...]] = {
    "agent.spawned": (*_COMMON_FIELDS, ("initial_items", _is_count, True)),
    "agent.paused": (
        *_COMMON_FIELDS,
        ("checkpoint_id", _is_str, True),
        ("items_saved", _is_count, True),
    ),
    "agent.resumed": (
        *_COMMON_FIELDS,
        ("checkpoint_id", _is_str, True),
        ("items_restored", _is_count, True),
    ),
    "agent.terminated": (
        *_COMMON_FIELDS,
        ("outcome", _one_of(*get_args(Outcome)), True),
        ("items_cleared", _is_count, True),
        ("consolidate", _is_bool, True),
        ("task_description", _is_str_or_none, False),
        ("lessons_learned", _is_str_list, True),
        ("tokens_used", _is_int_or_none, False),
        ("importance", _is_fraction, True),
        ("duration_seconds", _is_number_or_none, False),
        ("life", _is_str_or_none, False),
        ("snapshot", _is_snapshot_or_none, False),
    ),
    "command.rejected": (
        *_COMMON_FIELDS,
        ("reason", _one_of(*get_args(RejectionReason)), True),
        ("detail", _is_str, True),
    ),
}


def _fields_match_the_models() -> None:
    """The cheap check must know every field of every result model: a field added to a model
    and not here would go unchecked."""
    for member in get_args(get_args(Result)[0]):
        kind = member.model_fields["type"].default
        known = {name for name, _check, _required in _FIELDS_OF[kind]} | {"type"}
        known |= _TIMESTAMP_FIELDS & set(member.model_fields)
        if known != set(member.model_fields):
            raise RuntimeError(f"the cheap check of {kind} is out of date with its model")


_fields_match_the_models()


def check_result(payload: Mapping[str, Any]) -> tuple[datetime, datetime | None] | None:
    """``(occurred_at, started_at)`` when ``payload`` (JSON-decoded) is certainly a valid result,
    read exactly as ``parse_result`` would read it; None when the model must decide."""
    kind = payload.get("type")
    fields = _FIELDS_OF.get(kind) if type(kind) is str else None
    if fields is None:
        return None
    for name, check, required in fields:
        if name in payload:
            if not check(payload[name]):
                return None
        elif required:
            return None
    occurred_at = _instant(payload.get("occurred_at"))
    if occurred_at is None:
        return None
    started_at = None
    if kind == "agent.terminated":
        if (raw := payload.get("started_at")) is not None and (started_at := _instant(raw)) is None:
            return None
        if payload["consolidate"] and not (payload.get("project_id") and payload.get("session_id")):
            return None  # parse_result words the error
    return occurred_at, started_at
