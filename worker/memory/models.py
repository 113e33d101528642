"""The shapes working memory hands back: task state, scratchpad entries, checkpoints, stats."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
    """What the agent is doing and how far it got; stored as the session's ``task`` JSON."""

    model_config = ConfigDict(extra="ignore")

    description: str = ""
    current_step: int = Field(default=0, ge=0)
    total_steps: int = Field(default=0, ge=0)
    status: TaskStatus = "pending"
    progress: float = 0.0
    started_at: datetime = Field(default_factory=utc_now)
    updated_at: datetime = Field(default_factory=utc_now)
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("progress", mode="before")
    @classmethod
    def _clamp(cls, value: Any) -> float:
        return clamp_progress(value)


class ScratchpadEntry(BaseModel):
    """One scratchpad note and when it was appended."""

    content: Any
    timestamp: datetime


class CheckpointInfo(BaseModel):
    """A saved copy of the session's variables, task state and scratchpad."""

    checkpoint_id: str
    description: str = ""
    created_at: datetime
    items: int = 0


class MemoryStats(BaseModel):
    """A summary of one session's working memory.

    ``ttl_seconds`` is the time left before idle expiry (``None``: the session does not expire,
    e.g. while paused, or holds nothing yet); ``approximate_bytes`` is Redis's own estimate
    (``MEMORY USAGE``) or, in memory, the size of the stored JSON.
    """

    project_id: str
    session_id: str
    state: str | None
    keys: int
    scratchpad_entries: int
    checkpoints: int
    has_task: bool
    approximate_bytes: int
    ttl_seconds: float | None
