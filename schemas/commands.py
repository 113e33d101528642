"""Lifecycle commands (docs/contract.md "Commands"): what orchestrators XADD to the lifecycle
streams ``P:lifecycle:{i}``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    TypeAdapter,
    field_validator,
)

from schemas.ids import Id, WriteId
from schemas.inputs import When, json_text_problem
from schemas.limits import MAX_CORRELATION_ID_CHARS, MAX_TASK_DESCRIPTION_CHARS
from schemas.limits import MAX_SESSION_TTL_SECONDS as MAX_SESSION_TTL_SECONDS
from schemas.limits import MAX_TRACEPARENT_BYTES as MAX_TRACEPARENT_BYTES
from schemas.words import COMMAND_TYPES as COMMAND_TYPES
from schemas.words import CommandType as CommandType
from schemas.words import Outcome as Outcome

# -- Bounds at the stream door (docs/contract.md "Commands": each field's bound) -------------
# Every field of a command, and of the stream entry that carries it, has one; a command over
# one is rejected (``invalid_event`` naming the field, or ``limit_exceeded``), never stored.

MAX_SAFE_INT = 2**53 - 1
"""The largest ``seq``, ``tokens_used`` and ``schema_version``: the largest integer a double
holds exactly (Lua in Redis, JavaScript), within Postgres' bigint."""
MAX_LESSONS = 100
"""Entries of a terminate's ``lessons_learned`` at most, each of at most
``MAX_TASK_DESCRIPTION_CHARS`` characters."""
MAX_ENVELOPE_EXTRA_BYTES = 4_096
"""What a stream entry may carry besides its command's JSON (``MEMWORKER_MAX_EVENT_BYTES``):
field names, ``traceparent``, FastStream's envelope headers, fields the worker ignores."""


def _storable(value: str) -> str:
    if (bad := json_text_problem(value, "text")) is not None:
        raise ValueError(bad[1])
    return value


Text = Annotated[str, AfterValidator(_storable)]
"""A command's text field: no NUL character, no lone surrogate (the input rule,
``schemas.inputs``); ``metadata`` and ``initial_state`` get the same rule at any depth at the
stream door (``worker.lifecycle.intake``) and in ``LifecycleClient.publish``."""


class CommandBase(BaseModel):
    """Fields every command carries. Unknown fields are ignored, as the contract promises.

    ``metadata`` and ``initial_state`` hold any JSON values: commands arrive as parsed JSON, so
    their values are JSON by construction (validating them as ``JsonValue`` cost 3x the time).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    event_id: Id = Field(description="Idempotency key: a second command with it has no effect.")
    project_id: WriteId = Field(description="The tenant; nothing crosses projects.")
    session_id: WriteId
    agent_instance_id: Id
    agent_type_id: Id | None = None
    seq: Annotated[StrictInt, Field(ge=1, le=MAX_SAFE_INT)] | None = Field(
        default=None,
        description="Per-session order; 1 for the spawn of a new session id (a spawn starts "
        "a session at its seq).",
    )
    spawn_event_id: Id | None = Field(
        default=None,
        description="Pause, resume, terminate: the event_id of the spawn that started the life "
        "of the session this command is meant for. A command for an earlier life of a reused "
        "session id is then rejected stale_session, never applied to the new one. "
        "LifecycleClient sets it for the sessions it spawned.",
    )
    correlation_id: Annotated[Text, Field(max_length=MAX_CORRELATION_ID_CHARS)] | None = None
    occurred_at: When | None = None
    metadata: dict[str, Any] | None = None
    schema_version: Annotated[StrictInt, Field(ge=-MAX_SAFE_INT, le=MAX_SAFE_INT)] = 1


class SpawnCommand(CommandBase):
    """Create the session and load its initial working memory."""

    type: Literal["spawn"] = "spawn"
    user_id: WriteId | None = Field(
        default=None,
        description="The user the session works for: its episode belongs to that user "
        "(EpisodeStore.recall(user_id=...)), and every result of the session carries it.",
    )
    initial_state: dict[str, Any] = Field(default_factory=dict)
    ttl_seconds: Annotated[StrictInt, Field(ge=1, le=MAX_SESSION_TTL_SECONDS)] | None = Field(
        default=None,
        description="Idle expiry of the session's working memory (at most 30 days).",
    )

    @field_validator("initial_state")
    @classmethod
    def _no_reserved_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        reserved = sorted(k for k in value if k.startswith("_") or not k)
        if reserved:
            raise ValueError(
                f"keys may not be empty or start with '_' (reserved): {', '.join(reserved[:5])}"
            )
        return value


class PauseCommand(CommandBase):
    """Checkpoint the session; it does not expire while paused."""

    type: Literal["pause"] = "pause"
    checkpoint_id: Id | None = Field(
        default=None, description="Generated deterministically from event_id when absent."
    )
    description: Annotated[Text, Field(max_length=MAX_TASK_DESCRIPTION_CHARS)] | None = None


class ResumeCommand(CommandBase):
    """Restore a checkpoint (the newest by default) and make the session active again."""

    type: Literal["resume"] = "resume"
    checkpoint_id: Id | None = None
    clear_current: StrictBool = True


class TerminateCommand(CommandBase):
    """Snapshot the session, clear its working memory and leave a tombstone."""

    type: Literal["terminate"] = "terminate"
    outcome: Outcome = "success"
    task_description: Annotated[Text, Field(max_length=MAX_TASK_DESCRIPTION_CHARS)] | None = None
    lessons_learned: Annotated[
        list[Annotated[Text, Field(max_length=MAX_TASK_DESCRIPTION_CHARS)]],
        Field(max_length=MAX_LESSONS),
    ] = Field(default_factory=list)
    tokens_used: Annotated[StrictInt, Field(ge=0, le=MAX_SAFE_INT)] | None = None
    importance: Annotated[float, Field(ge=0, le=1)] = 0.6
    consolidate: StrictBool = True
    cleanup: StrictBool = True


Command = Annotated[
    SpawnCommand | PauseCommand | ResumeCommand | TerminateCommand,
    Field(discriminator="type"),
]
COMMAND_ADAPTER: TypeAdapter[Command] = TypeAdapter(Command)
