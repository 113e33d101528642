"""Events on the streams other than commands and results: dead letters, episodes,
forgetting, and the change feed of user memory."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter


class DeadLetter(BaseModel):
    """An entry on ``P:dlq:{i}``; every field is a string on the wire (a stream entry's field)."""

    data: str = Field(description="The original entry's fields, as a JSON object.")
    source_stream: str
    source_id: str
    group: str
    reason: str = Field(description="unparseable, seq_gap, max_deliveries, storage_failed, …")
    error: str
    deliveries: int = Field(ge=0)
    failed_at: datetime


class EpisodeRecorded(BaseModel):
    """Published on ``P:episodes`` when the consolidator writes a new episode."""

    type: Literal["episode.recorded"] = "episode.recorded"
    event_id: str
    episode_id: str
    project_id: str
    session_id: str
    causation_id: str = Field(description="The event_id of the agent.terminated result.")


class MemoryForgotten(BaseModel):
    """Published on ``P:episodes`` by ``memworker forget``: ids, times and counts, no content.
    A subscriber that keeps copies deletes its own of the project (or session) on it."""

    type: Literal["memory.forgotten"] = "memory.forgotten"
    event_id: str = Field(description="The erasure's id (a row of the table erasures).")
    project_id: str
    session_id: str | None = Field(description="Null when the whole project was forgotten.")
    user_id: str | None = Field(
        default=None,
        description="The user forgotten ('' the data of no user); null: not a user's forget.",
    )
    before: datetime | None = Field(description="Only history older than this, when given.")
    since: datetime | None = Field(
        default=None,
        description="A range's start: only history at or after it (and before the cutoff).",
    )
    cutoff: datetime | None = Field(description="What occurred before it is forgotten.")
    occurred_at: datetime
    counts: dict[str, dict[str, Any]] = Field(
        description='{"postgres": {table: n}, "redis": {what: n}, "streams": {stream: n}}'
    )
    complete: bool = Field(description="False when something could not be removed.")


EpisodesEvent = Annotated[EpisodeRecorded | MemoryForgotten, Field(discriminator="type")]
EPISODES_EVENT_ADAPTER: TypeAdapter[EpisodesEvent] = TypeAdapter(EpisodesEvent)


class _Change(BaseModel):
    """Common to every event of the change feed ``P:changes:{j}``: ids, never content."""

    event_id: str = Field(description="Deterministic per change: a subscriber drops a duplicate.")
    project_id: str
    user_id: str | None = Field(description="Null: the anonymous bucket.")
    occurred_at: datetime


class BlockUpdated(_Change):
    type: Literal["block.updated"] = "block.updated"
    name: str
    pinned_order: int
    change: Literal["replace", "append"]
    size: int = Field(ge=0, description="The block's size now, in bytes.")


class EpisodeRemembered(_Change):
    type: Literal["episode.remembered"] = "episode.remembered"
    episode_id: str = Field(description="The turn's own id.")
    session_id: str


class EpisodeRecallable(_Change):
    type: Literal["episode.recallable"] = "episode.recallable"
    episode_id: str = Field(description="A turn's id, or a session episode's uuid.")
    model: str = Field(description="The embedding model it is findable by.")


class FactAdded(_Change):
    type: Literal["fact.added"] = "fact.added"
    fact_id: str


class FactSuperseded(_Change):
    type: Literal["fact.superseded"] = "fact.superseded"
    fact_id: str
    superseded_by: str
    valid_until: datetime


class UserMemoryForgotten(_Change):
    """``Memory.forget``: what went, counted."""

    type: Literal["memory.forgotten"] = "memory.forgotten"
    session_id: str | None
    before: datetime | None
    since: datetime | None = Field(
        default=None, description="A range's start: only what occurred at or after it."
    )
    counts: dict[str, int] = Field(description='{"episodes": n, "facts": n, "blocks": n}')


ChangeEvent = Annotated[
    BlockUpdated
    | EpisodeRemembered
    | EpisodeRecallable
    | FactAdded
    | FactSuperseded
    | UserMemoryForgotten,
    Field(discriminator="type"),
]
CHANGE_EVENT_ADAPTER: TypeAdapter[ChangeEvent] = TypeAdapter(ChangeEvent)
