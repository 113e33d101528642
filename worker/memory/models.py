"""The shapes working memory hands back: task state, scratchpad entries, checkpoints, stats.

``TaskState`` is a model (it is stored and validated); the others are plain dicts, typed here,
because that is what code written against the syndarix / LoomFlow working memory indexes
(``entry["content"]``, ``checkpoint["id"]``, ``stats["user_keys"]``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal, TypedDict

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

TaskStatus = Literal["pending", "in_progress", "completed", "failed", "cancelled"]


def utc_now() -> datetime:
    return datetime.now(UTC)


def rfc3339(moment: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, as every timestamp in the session's data is written."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def clamp_progress(value: float) -> float:
    """Progress is a percentage: anything outside 0-100 is pulled to the nearest bound."""
    return min(100.0, max(0.0, float(value)))


class TaskState(BaseModel):
    """What the agent is doing and how far it got; stored as the session's ``task`` JSON.

    ``progress_percent`` is 0-100 (clamped). Task states stored by earlier versions under
    ``progress`` read as ``progress_percent``.
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    description: str = ""
    current_step: int = Field(default=0, ge=0)
    total_steps: int = Field(default=0, ge=0)
    status: TaskStatus = "pending"
    progress_percent: float = Field(
        default=0.0, validation_alias=AliasChoices("progress_percent", "progress")
    )
    started_at: datetime = Field(default_factory=utc_now)
    updated_at: datetime = Field(default_factory=utc_now)
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("progress_percent", mode="before")
    @classmethod
    def _clamp(cls, value: Any) -> float:
        return clamp_progress(value)


class ScratchpadEntry(TypedDict):
    """One scratchpad note and when it was appended (RFC 3339, UTC)."""

    content: Any
    timestamp: str


class CheckpointInfo(TypedDict):
    """A saved copy of the session's variables, task state and scratchpad.

    ``created_at`` is RFC 3339 (UTC); ``items`` counts variables + scratchpad entries + 1 for
    a task state, as when it was made.
    """

    id: str
    checkpoint_id: str
    """The same id under the name results, ``tail``, ``memworker inspect`` and the
    ``checkpoint_id`` parameters use (``id`` is the seed API's)."""
    description: str
    created_at: str
    items: int


class MemoryStats(TypedDict):
    """A summary of one session's working memory, as ``get_stats()`` returns it.

    The first eight keys are the syndarix working memory's: ``scope_type`` is always
    ``"session"``, ``scope_id`` the session id, ``user_keys`` the variables, ``total_keys``
    everything stored for the session (variables, + 1 for a task state, + 1 for a non-empty
    scratchpad, + each checkpoint). The rest are ours: ``state`` is the lifecycle state the
    worker set (``None`` before any spawn), ``ttl_seconds`` the time left before idle expiry
    (``None``: it does not expire, e.g. while paused, or holds nothing yet),
    ``approximate_bytes`` Redis's own estimate (``MEMORY USAGE``) or, in memory, the size of
    the stored JSON.
    """

    scope_type: str
    scope_id: str
    using_fallback: bool
    total_keys: int
    user_keys: int
    checkpoint_count: int
    scratchpad_entries: int
    has_task_state: bool
    project_id: str
    session_id: str
    agent_instance_id: str | None
    backend: Literal["redis", "memory"]
    state: str | None
    approximate_bytes: int
    ttl_seconds: float | None
