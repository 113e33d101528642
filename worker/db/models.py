"""The Postgres schema (docs/contract.md "Episodes"), as SQLAlchemy models.

The Alembic migrations in ``worker/migrations`` create exactly this schema; a test compares the
two, so a change here without a migration fails CI.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Computed,
    DateTime,
    Double,
    Identity,
    Index,
    MetaData,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

EPISODE_NAMESPACE = uuid.UUID("6f1c54b2-7d0e-5f39-9a52-3b0c1e8d4a71")
"""uuid5 namespace of episode ids: an episode's id is derived from its result's ``event_id``."""

SEARCH_CONFIG = "english"
"""The text-search configuration of ``episodes.search_vector`` and of every search query."""

SEARCH_SUMMARY_CHARS = 1_000

TASK_STATE_HEADING = "Task state"
STEPS_HEADING = "Last steps"
VARIABLES_HEADING = "Variables"
"""Headings of an episode's ``context_summary`` (``worker.episodes.summary`` writes them).
Full-text search indexes the summary from the task state (or the last steps) up to the
variables: the task and the lessons before it are indexed from their own columns."""


def _searched_summary(summary: str) -> str:
    """SQL: the part of the summary full-text search reads, the task state and the last steps
    (up to ``SEARCH_SUMMARY_CHARS`` characters); empty when it has neither."""
    end = f"length({summary}) + 1"
    start = (
        f"coalesce(nullif(strpos({summary}, '\n{TASK_STATE_HEADING}: '), 0),"
        f" nullif(strpos({summary}, '\n{STEPS_HEADING}'), 0), {end})"
    )
    stop = f"coalesce(nullif(strpos({summary}, '\n{VARIABLES_HEADING} ('), 0), {end})"
    length = f"greatest(least({stop} - {start}, {SEARCH_SUMMARY_CHARS}), 0)"
    return f"substr({summary}, {start}, {length})"


SEARCH_VECTOR_SQL = (
    f"setweight(to_tsvector('{SEARCH_CONFIG}'::regconfig,"
    " coalesce(task_description, input, '')), 'A')"
    f" || setweight(jsonb_to_tsvector('{SEARCH_CONFIG}'::regconfig, lessons_learned,"
    " '[\"string\"]'::jsonb), 'B')"
    f" || setweight(to_tsvector('{SEARCH_CONFIG}'::regconfig, coalesce(output, '')), 'B')"
    f" || setweight(to_tsvector('{SEARCH_CONFIG}'::regconfig,"
    f" CASE WHEN turn_id IS NULL THEN outcome || ' ' || {_searched_summary('context_summary')}"
    " ELSE '' END), 'C')"
)
"""Task description (a turn's input) weighs most, then lessons (a turn's output), then the
outcome, task state and last steps (from the summary; session episodes only). Each word is
indexed once: the task and lessons are not read again from the summary, and its variable
dumps are left out (JSON: noise for ranking). Parsing text into lexemes is most of what
inserting an episode costs Postgres; indexing the whole head of the summary (the first 1,000
characters) cost ~60 µs an episode more on the benchmark's results."""

FACT_SEARCH_SQL = (
    f"to_tsvector('{SEARCH_CONFIG}'::regconfig,"
    " subject || ' ' || replace(predicate, '_', ' ') || ' ' || object)"
)
"""A fact is searched by the words of its subject, predicate (``lives_in``: "lives in") and
object."""

TURN_OUTCOME = "turn"
"""``episodes.outcome`` of a turn (``worker.user_memory``): a turn has no outcome of its own."""

EPISODES_FILLFACTOR = 50
"""Room on each page for a second version of its rows, so marking an episode announced (the
one UPDATE it ever gets) is a HOT update: no new entry in any of the five indexes (the GIN
one with ~60 lexemes) and the old version is pruned in place. It costs heap space (about
twice the pages); a non-HOT update cost ~4× the CPU and left a dead entry in every index."""


def episode_id_for(source_event_id: str) -> uuid.UUID:
    """The episode id of the ``agent.terminated`` result ``source_event_id``: replays agree."""
    return uuid.uuid5(EPISODE_NAMESPACE, source_event_id)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "pk": "pk_%(table_name)s",
        }
    )
    type_annotation_map = {  # noqa: RUF012 - SQLAlchemy reads it at class creation
        datetime: DateTime(timezone=True),
        str: Text(),
        int: BigInteger(),
        float: Double(),
        dict[str, Any]: JSONB(),
        list[Any]: JSONB(),
        uuid.UUID: UUID(as_uuid=True),
    }


class LifecycleEvent(Base):
    """Every result the lifecycle worker published, verbatim in ``payload``: the audit log."""

    __tablename__ = "lifecycle_events"

    event_id: Mapped[str] = mapped_column(primary_key=True)
    type: Mapped[str]
    project_id: Mapped[str | None]
    session_id: Mapped[str | None]
    agent_instance_id: Mapped[str | None]
    causation_id: Mapped[str]
    command: Mapped[str | None]
    seq: Mapped[int | None]
    occurred_at: Mapped[datetime]
    recorded_at: Mapped[datetime] = mapped_column(server_default=func.clock_timestamp())
    payload: Mapped[dict[str, Any]]

    __table_args__ = (Index(None, "project_id", "session_id", "occurred_at"),)

    def to_dict(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "type": self.type,
            "project_id": self.project_id,
            "session_id": self.session_id,
            "agent_instance_id": self.agent_instance_id,
            "causation_id": self.causation_id,
            "command": self.command,
            "seq": self.seq,
            "occurred_at": self.occurred_at.isoformat(),
            "recorded_at": self.recorded_at.isoformat(),
            "payload": self.payload,
        }


class Episode(Base):
    """One finished session, consolidated: what it tried, how it went, what it learned."""

    __tablename__ = "episodes"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    source_event_id: Mapped[str] = mapped_column(unique=True)
    project_id: Mapped[str]
    session_id: Mapped[str]
    agent_instance_id: Mapped[str | None]
    agent_type_id: Mapped[str | None]
    user_id: Mapped[str | None] = mapped_column(
        doc="The user the session's spawn named (null: none); recall filters by it."
    )
    life: Mapped[str] = mapped_column(
        server_default=text("''"),
        doc="A session's episode: the life of the session id it ended (16 hex digits of the"
        " SHA-1 of its spawn's event_id, ``worker.lifecycle.result_ids.life_of``; '' for one"
        " recorded before migration 0009 or of a session spawned before lives were named);"
        " one session episode per life. '' for a turn.",
    )
    task_description: Mapped[str | None]
    outcome: Mapped[str]
    lessons_learned: Mapped[list[Any]] = mapped_column(server_default=text("'[]'::jsonb"))
    context_summary: Mapped[str]
    snapshot: Mapped[dict[str, Any] | None]
    tokens_used: Mapped[int | None]
    importance_score: Mapped[float]
    duration_seconds: Mapped[float | None]
    started_at: Mapped[datetime | None]
    occurred_at: Mapped[datetime]
    recorded_at: Mapped[datetime] = mapped_column(
        server_default=func.clock_timestamp(),
        doc="When the row was written (the INSERT's clock, after the writer's project lock):"
        " what a forget covers (``worker.db.erasures``).",
    )
    announced_at: Mapped[datetime | None] = mapped_column(
        doc="When episode.recorded was published; null while it is owed (an outbox flag)."
    )
    turn_id: Mapped[str | None] = mapped_column(
        doc="A turn's own id (LoomFlow's Episode.id); null for a session's episode."
    )
    input: Mapped[str | None]
    output: Mapped[str | None]
    tool_calls: Mapped[list[Any] | None]
    tool_transcript: Mapped[list[Any] | None]
    consolidated_at: Mapped[datetime | None] = mapped_column(
        doc="When the fact extractor ran on it (``Memory.consolidate``); null: not yet."
    )
    search_vector: Mapped[str] = mapped_column(
        TSVECTOR(), Computed(SEARCH_VECTOR_SQL, persisted=True), deferred=True
    )

    __table_args__ = (
        Index(  # one session episode per life of a session id (migration 0009)
            "uq_episodes_project_id_session_id_life",
            "project_id",
            "session_id",
            "life",
            unique=True,
            postgresql_where=text("turn_id IS NULL"),
        ),
        Index(  # a turn's id is unique per (project, user) (migration 0007)
            "uq_episodes_project_id_turn_id_user_id",
            "project_id",
            "turn_id",
            "user_id",
            unique=True,
            postgresql_where=text("turn_id IS NOT NULL"),
        ),
        Index(  # the turns of no user: one bucket (Postgres takes two nulls as distinct)
            "uq_episodes_project_id_turn_id_no_user",
            "project_id",
            "turn_id",
            unique=True,
            postgresql_where=text("turn_id IS NOT NULL AND user_id IS NULL"),
        ),
        Index(
            "ix_episodes_unconsolidated_sessions",
            "id",
            postgresql_where=text("consolidated_at IS NULL AND turn_id IS NULL"),
        ),
        Index(None, "project_id", "occurred_at"),
        Index(None, "project_id", "user_id", "occurred_at"),
        Index(  # a user's turns by session: recall's context, the inspector (migration 0010)
            None,
            "project_id",
            "user_id",
            "session_id",
            postgresql_where=text("turn_id IS NOT NULL"),
        ),
        Index("ix_episodes_search_vector", "search_vector", postgresql_using="gin"),
        {"postgresql_with": {"fillfactor": EPISODES_FILLFACTOR}},
    )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": str(self.id),
            "source_event_id": self.source_event_id,
            "project_id": self.project_id,
            "session_id": self.session_id,
            "agent_instance_id": self.agent_instance_id,
            "agent_type_id": self.agent_type_id,
            "user_id": self.user_id,
            "life": self.life,
            "task_description": self.task_description,
            "outcome": self.outcome,
            "lessons_learned": self.lessons_learned,
            "context_summary": self.context_summary,
            "snapshot": self.snapshot,
            "tokens_used": self.tokens_used,
            "importance_score": self.importance_score,
            "duration_seconds": self.duration_seconds,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "occurred_at": self.occurred_at.isoformat(),
            "recorded_at": self.recorded_at.isoformat(),
            # A turn of user memory (turn_id set) is its input and output; null for a session's.
            "turn_id": self.turn_id,
            "input": self.input,
            "output": self.output,
            "tool_calls": self.tool_calls,
            "tool_transcript": self.tool_transcript,
        }


class Erasure(Base):
    """One ``forget`` (``worker.erasure.forget``): ids and times only, never content.

    What it covers: the project's (or its one session's; of its ``user_id`` only, when it names
    one: ``''`` for the data of no user) data written before ``written_before`` (when the
    forget took effect) that occurred before ``before`` (when given) and at or after ``since``
    (when given: a range, ``--since``); a row of before migration 0011 (``written_before``
    null) covers the data that occurred before ``cutoff`` (when the forget ran, or its
    ``--before`` if earlier) and at or after ``since``. The consolidator, every replay and the
    indexer skip what a row covers, so no replay brings it back. Kept for good: one small row
    per forget; delete a row only to let its data be stored again. A row covers what it names
    from the moment it is written; ``completed_at`` says when the forget was done.
    """

    __tablename__ = "erasures"

    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    project_id: Mapped[str]
    session_id: Mapped[str | None]
    before: Mapped[datetime | None]
    cutoff: Mapped[datetime]
    forgotten_at: Mapped[datetime] = mapped_column(server_default=func.now())
    counts: Mapped[dict[str, Any]] = mapped_column(server_default=text("'{}'::jsonb"))
    user_id: Mapped[str | None] = mapped_column(doc="The user the forget named (null: none).")
    completed_at: Mapped[datetime | None] = mapped_column(
        doc="When every place was cleared; null: the forget is owed (``worker.erasure.owed``)."
    )
    since: Mapped[datetime | None] = mapped_column(
        doc="A range's start (included): the row covers only what occurred in [since, cutoff)."
    )
    written_before: Mapped[datetime | None] = mapped_column(
        doc="When the forget took effect: it covers rows written (``recorded_at``) before it;"
        " null (a row of before migration 0011): it covers by ``occurred_at < cutoff``."
    )

    __table_args__ = (
        Index(None, "project_id", "session_id"),
        Index("ix_erasures_owed", "forgotten_at", postgresql_where=text("completed_at IS NULL")),
    )


class MemoryBlockRow(Base):
    """A user's pinned block (``worker.user_memory.blocks``); ``user_key`` '' is anonymous."""

    __tablename__ = "memory_blocks"

    project_id: Mapped[str] = mapped_column(primary_key=True)
    user_key: Mapped[str] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(primary_key=True)
    content: Mapped[str]
    pinned_order: Mapped[int]
    updated_at: Mapped[datetime] = mapped_column(
        server_default=func.clock_timestamp(),
        doc="When the block was last written (the statement's clock): the end of its text's"
        " time, for a forget's ``since``.",
    )
    content_since: Mapped[datetime] = mapped_column(
        server_default=func.clock_timestamp(),
        doc="When the oldest text still in the block was written: set by an insert and a whole"
        " replace, kept by an append (migration 0013); a forget covers the block when it is"
        " before the forget's instant (and its ``before``).",
    )


class FactRow(Base):
    """A bi-temporal fact (``worker.user_memory.facts``): LoomFlow's ``Fact``, per project."""

    __tablename__ = "facts"

    project_id: Mapped[str] = mapped_column(primary_key=True)
    id: Mapped[str] = mapped_column(primary_key=True)
    user_id: Mapped[str | None]
    subject: Mapped[str]
    predicate: Mapped[str]
    object: Mapped[str]
    confidence: Mapped[float]
    valid_from: Mapped[datetime]
    valid_until: Mapped[datetime | None]
    recorded_at: Mapped[datetime] = mapped_column(
        doc="When the caller says the fact was recorded: a forget's range (before, since)."
    )
    written_at: Mapped[datetime] = mapped_column(
        server_default=func.clock_timestamp(),
        doc="When the row was written (the INSERT's clock): a forget covers a fact written"
        " before it took effect (``worker.erasure.users``).",
    )
    sources: Mapped[list[Any]] = mapped_column(server_default=text("'[]'::jsonb"))
    embedding: Mapped[list[float] | None] = mapped_column(
        ARRAY(Double()), doc="The triple's vector (``FactStore`` with an embedder); null: none."
    )
    embedding_model: Mapped[str | None]
    search_vector: Mapped[str] = mapped_column(
        TSVECTOR(), Computed(FACT_SEARCH_SQL, persisted=True), deferred=True
    )

    __table_args__ = (
        Index(None, "project_id", "user_id", "subject", "predicate"),
        Index(None, "project_id", "user_id", "recorded_at"),
        Index("ix_facts_search_vector", "search_vector", postgresql_using="gin"),
    )


class MemoryChange(Base):
    """The change feed's outbox (``worker.user_memory.changes``): an event committed with its
    change, deleted once published on the project's changes stream."""

    __tablename__ = "memory_changes"

    seq: Mapped[int] = mapped_column(Identity(always=True), primary_key=True)
    project_id: Mapped[str]
    payload: Mapped[dict[str, Any]]

    __table_args__ = (Index(None, "project_id", "seq"),)
