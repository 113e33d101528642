"""The input rule (``schemas.inputs``) at ``Memory``'s entry: what a turn, a fact, a block and a
recall may hold, checked before anything is read or written. Every refusal is an
``InvalidInputError`` (a ``ValueError``) naming the argument; nothing reaches Postgres that it
would refuse (a NUL, a lone surrogate, a time it cannot hold, a text too large to index).

Recall: ``query`` is text of at most ``MAX_QUERY_BYTES``; ``""`` asks for the most recent
(LoomFlow's rule), a query of whitespace only is refused (say ``""`` for the most recent);
``kind`` is LoomFlow's ``"episodic"`` or ``"semantic"`` (both recall episodes here); ``limit``
is an integer from 1 to ``MAX_RESULTS``.
"""

from __future__ import annotations

from typing import Any

import orjson

from schemas.inputs import (
    InvalidInputError,
    check_id,
    check_limit,
    check_text,
    check_when,
)
from schemas.limits import (
    MAX_FACT_FIELD_BYTES,
    MAX_QUERY_BYTES,
    MAX_RESULTS,
    MAX_TURN_TEXT_BYTES,
    MAX_VALUE_BYTES,
)
from worker.user_memory.models import Episode, Fact

KINDS = ("episodic", "semantic")


def check_query(query: Any, field: str = "query") -> str:
    """A recall query (module doc)."""
    check_text(query, field, MAX_QUERY_BYTES)
    if query and not query.strip():
        raise InvalidInputError(
            field, "is only whitespace; pass '' for the most recent, or words to match"
        )
    return str(query)


def check_kind(kind: Any) -> str:
    if kind not in KINDS:
        raise InvalidInputError("kind", f"must be one of {', '.join(KINDS)}; got {kind!r:.60}")
    return str(kind)


def check_recall(query: Any, limit: Any, kind: Any = "episodic", time_range: Any = None) -> None:
    check_query(query)
    check_limit(limit)
    check_kind(kind)
    if time_range is not None:
        if not isinstance(time_range, tuple | list) or len(time_range) != 2:
            raise InvalidInputError("time_range", "must be a (start, end) pair of times")
        check_when(time_range[0], "time_range")
        check_when(time_range[1], "time_range")


def check_recall_facts(query: Any, limit: Any, valid_at: Any) -> None:
    check_query(query)
    check_limit(limit)
    if valid_at is not None:
        check_when(valid_at, "valid_at")


def check_session(session_id: Any, limit: Any) -> None:
    """``session_messages``' arguments: a session id, a limit of messages."""
    check_id(session_id, "session_id")
    check_limit(limit, maximum=2 * MAX_RESULTS)


def _stored_json(value: Any, field: str, max_bytes: int) -> str:
    """``value`` (tool calls, a transcript) as the JSON text Postgres keeps, checked: valid
    UTF-8, no NUL escape (``jsonb`` refuses ``\\u0000``), at most ``max_bytes``."""
    try:
        text = orjson.dumps(value)
    except TypeError as exc:
        raise InvalidInputError(field, f"cannot be stored as JSON: {exc}") from exc
    if b"\\u0000" in text:
        raise InvalidInputError(
            field, "contains a NUL character (\\u0000), which JSON text in Postgres cannot hold"
        )
    if len(text) > max_bytes:
        raise InvalidInputError(field, f"is {len(text)} bytes as JSON; the most is {max_bytes}")
    return text.decode()


def check_episode(episode: Episode) -> Episode:
    """A turn ``remember`` may store (module doc of ``schemas.inputs``)."""
    checked_tool_json(episode)
    return episode


def checked_tool_json(episode: Episode) -> tuple[str, str | None]:
    """``check_episode``, giving the turn's tool calls and transcript as the JSON text it
    stores (``turns.insert_pairs`` takes them: a batch encodes each once)."""
    check_id(episode.id, "id")
    check_id(episode.session_id, "session_id")
    if episode.user_id is not None:
        check_id(episode.user_id, "user_id")
    check_when(episode.occurred_at, "occurred_at")
    check_text(episode.input, "input", MAX_TURN_TEXT_BYTES)
    check_text(episode.output, "output", MAX_TURN_TEXT_BYTES)
    size = len(episode.input.encode()) + len(episode.output.encode())
    if size > MAX_TURN_TEXT_BYTES:
        raise InvalidInputError(
            "input",
            f"input and output are {size} bytes together (UTF-8); a turn holds at most "
            f"{MAX_TURN_TEXT_BYTES}",
        )
    calls, transcript = "[]", None if episode.tool_transcript is None else "[]"
    if episode.tool_calls:
        calls = _stored_json(
            [c.model_dump(mode="json") for c in episode.tool_calls], "tool_calls", MAX_VALUE_BYTES
        )
    if episode.tool_transcript:
        transcript = _stored_json(
            [m.model_dump(mode="json") for m in episode.tool_transcript],
            "tool_transcript",
            MAX_VALUE_BYTES,
        )
    return calls, transcript


def check_fact(fact: Fact) -> Fact:
    """A fact ``append`` may store: an id, non-empty subject, predicate and object, a finite
    confidence in 0..1, storable times."""
    check_id(fact.id, "id")
    if fact.user_id is not None:
        check_id(fact.user_id, "user_id")
    for field in ("subject", "predicate", "object"):
        check_text(getattr(fact, field), field, MAX_FACT_FIELD_BYTES, empty=False)
        if not getattr(fact, field).strip():
            raise InvalidInputError(field, "is only whitespace")
    if not 0.0 <= fact.confidence <= 1.0:  # NaN fails too
        raise InvalidInputError("confidence", f"must be from 0 to 1; got {fact.confidence!r}")
    for field in ("valid_from", "valid_until", "recorded_at"):
        value = getattr(fact, field)
        if value is not None:
            check_when(value, field)
    for source in fact.sources:
        check_text(source, "sources", MAX_FACT_FIELD_BYTES)
    return fact
