"""Result events (docs/contract.md "Results"): one per applied or rejected command."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from schemas.words import Outcome

RejectionReason = Literal[
    "invalid_event",
    "unsupported_version",
    "unknown_session",
    "already_exists",
    "already_terminated",
    "invalid_transition",
    "checkpoint_not_found",
    "limit_exceeded",
    "stale_seq",
    "stale_session",
    "forgotten",
]
RESULT_TYPES: tuple[str, ...] = (
    "agent.spawned",
    "agent.paused",
    "agent.resumed",
    "agent.terminated",
    "command.rejected",
)


class ResultBase(BaseModel):
    """Fields of every result; the ids and ``metadata`` are copied from the command."""

    model_config = ConfigDict(extra="allow", frozen=True)

    event_id: str = Field(description="Deterministic from the command's event_id.")
    causation_id: str = Field(description="The command's event_id.")
    command: str | None = Field(description="The command's type, or null when unknown.")
    project_id: str | None = None
    session_id: str | None = None
    agent_instance_id: str | None = None
    agent_type_id: str | None = None
    user_id: str | None = Field(
        default=None,
        description="The user the session's spawn named (absent when it named none).",
    )
    seq: int | None = None
    correlation_id: str | None = None
    metadata: dict[str, JsonValue] | None = None
    occurred_at: datetime = Field(description="When the worker applied it (UTC).")
    duration_ms: float = Field(ge=0, description="Time the worker spent on it.")


class AgentSpawned(ResultBase):
    """A spawn was applied: the session exists, active, with ``initial_items`` variables."""

    type: Literal["agent.spawned"] = "agent.spawned"
    initial_items: int = Field(ge=0)


class AgentPaused(ResultBase):
    """A pause was applied: the session is paused, its working memory saved as ``checkpoint_id``."""

    type: Literal["agent.paused"] = "agent.paused"
    checkpoint_id: str
    items_saved: int = Field(ge=0)


class AgentResumed(ResultBase):
    """A resume was applied: checkpoint ``checkpoint_id`` restored, the session active again."""

    type: Literal["agent.resumed"] = "agent.resumed"
    checkpoint_id: str
    items_restored: int = Field(ge=0)


class ScratchpadEntry(BaseModel):
    """One scratchpad entry of a terminated session's snapshot, with its RFC 3339 time."""

    content: JsonValue
    timestamp: str


class Snapshot(BaseModel):
    """The session's working memory at terminate."""

    variables: dict[str, JsonValue]
    task_state: dict[str, JsonValue] | None = None
    scratchpad: list[ScratchpadEntry]
    checkpoints: list[str]


class AgentTerminated(ResultBase):
    """A terminate was applied: the session ended (with ``consolidate``, the consolidator
    writes its episode from this result)."""

    type: Literal["agent.terminated"] = "agent.terminated"
    outcome: Outcome
    items_cleared: int = Field(ge=0)
    consolidate: bool
    task_description: str | None = None
    lessons_learned: list[str]
    tokens_used: int | None = None
    importance: float = Field(ge=0, le=1)
    started_at: datetime | None = None
    duration_seconds: float | None = None
    life: str | None = Field(
        default=None,
        description="The life of the session id that ended (16 hex digits of the SHA-1 of the"
        " event_id of the spawn that started it); absent for a session spawned before lives"
        " were named. The consolidator records one episode per life.",
    )
    snapshot: Snapshot | None = None


class CommandRejected(ResultBase):
    """A command was not applied: ``reason`` says why (the contract lists the reasons),
    ``detail`` in words."""

    type: Literal["command.rejected"] = "command.rejected"
    reason: RejectionReason
    detail: str


Result = Annotated[
    AgentSpawned | AgentPaused | AgentResumed | AgentTerminated | CommandRejected,
    Field(discriminator="type"),
]
RESULT_ADAPTER: TypeAdapter[Result] = TypeAdapter(Result)
