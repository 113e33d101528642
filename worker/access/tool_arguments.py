"""The tools' argument models (``worker.access.tools``): what each tool takes, with the
input rule of every door (``schemas.inputs``) and the limits of ``schemas.limits``; their JSON
Schema is what MCP clients and the OpenAPI document show."""

from __future__ import annotations

import sys
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue, StrictFloat, StrictInt

from schemas.inputs import EARLIEST, LATEST, IdText, When, text_rule
from schemas.limits import (
    MAX_FACT_FIELD_BYTES,
    MAX_QUERY_BYTES,
    MAX_REMEMBER_BATCH,
    MAX_TTL_SECONDS,
    MAX_TURN_TEXT_BYTES,
)

_EARLIEST = EARLIEST  # the edges the input rule takes (0001-01-01T00:00:00Z is -infinity)
_LATEST = LATEST

USER = (
    "The user whose memory this is (1-128 of A-Za-z0-9._:-). Omit it on a server pinned to a "
    "user (the server's user is used; another is refused); on other servers, omitting it "
    "means the anonymous bucket (what was stored without a user)."
)
SESSION = "The session id (1-128 of A-Za-z0-9._:-)."


TurnText = Annotated[str, text_rule(MAX_TURN_TEXT_BYTES)]
Query = Annotated[str, text_rule(MAX_QUERY_BYTES)]
FactText = Annotated[str, text_rule(MAX_FACT_FIELD_BYTES, empty=False)]
BlockText = Annotated[str, text_rule(sys.maxsize)]  # its size: MEMWORKER_MAX_VALUE_BYTES (413)


class Arguments(BaseModel):
    """Arguments of every tool: unknown names are refused, not ignored; every field follows
    the input rule (``schemas.inputs``): ids, text without NUL or lone surrogates and within
    its size, times in 0001..9999 UTC, finite numbers. Numbers are JSON numbers: ``"5"`` and
    ``true`` are refused where an integer or a number is meant (``StrictInt``,
    ``StrictFloat``; an integer is a number too)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class UserArguments(Arguments):
    user_id: IdText | None = Field(default=None, description=USER)


class RememberArguments(UserArguments):
    session_id: IdText = Field(description=SESSION)
    input: TurnText = Field(
        description="What the user said or asked (the turn's input). Input and output "
        f"together: at most {MAX_TURN_TEXT_BYTES} bytes (UTF-8)."
    )
    output: TurnText = Field(description="What the agent answered or did (the turn's output).")
    id: IdText | None = Field(
        default=None,
        description="The turn's id: the same id again stores nothing more (a retry is safe); "
        "the same id with other content is refused. Default: a new id.",
    )
    occurred_at: When | None = Field(
        default=None, description="When the turn happened (RFC 3339). Default: now."
    )


class TurnArguments(Arguments):
    session_id: IdText = Field(description=SESSION)
    input: TurnText = Field(description="What the user said or asked (the turn's input).")
    output: TurnText = Field(description="What the agent answered or did (the turn's output).")
    id: IdText | None = Field(
        default=None,
        description="The turn's id (the same id again stores nothing more). Default: a new id.",
    )
    occurred_at: When | None = Field(
        default=None, description="When the turn happened (RFC 3339). Default: now."
    )


class RememberManyArguments(UserArguments):
    turns: list[TurnArguments] = Field(
        description=f"The turns, oldest first: at most {MAX_REMEMBER_BATCH} (more is refused "
        "with 413). A batch with one bad turn, or one id already stored with other content, is "
        "refused whole (nothing stored), naming the turn's index and field."
    )


class RecallArguments(UserArguments):
    query: Query = Field(
        description="What to recall, in words ('': the most recent episodes; whitespace only "
        f"is refused); at most {MAX_QUERY_BYTES} bytes (UTF-8)."
    )
    limit: StrictInt = Field(default=5, ge=1, le=100, description="How many episodes at most.")
    min_score: StrictFloat | None = Field(
        default=None,
        ge=-1.0,
        le=1.0,
        description="Drop matches less relevant than this: a match is kept when its cosine "
        "similarity to the query (vector_score, -1..1) is at least this, or, when it has no "
        "vector yet, when words matched it. Default: keep every match.",
    )
    since: When | None = Field(
        default=None, description="Only episodes at or after this time (RFC 3339)."
    )
    until: When | None = Field(
        default=None, description="Only episodes at or before this time (RFC 3339)."
    )


class RecallFactsArguments(UserArguments):
    query: Query = Field(default="", description="Words to match ('': the most recent facts).")
    limit: StrictInt = Field(default=5, ge=1, le=100, description="How many facts at most.")
    valid_at: When | None = Field(
        default=None, description="Only facts true at this time (RFC 3339). Default: any."
    )


class AddFactArguments(UserArguments):
    subject: FactText = Field(description="Who or what the fact is about.")
    predicate: FactText = Field(description="The relation, e.g. lives_in.")
    object: FactText = Field(description="The value, e.g. Lisbon.")
    confidence: StrictFloat = Field(default=1.0, ge=0.0, le=1.0, description="How sure (0..1).")
    valid_from: When | None = Field(
        default=None,
        description="Since when it is true (RFC 3339). Default: now. A contradicting fact "
        "(same subject and predicate) is superseded from then on.",
    )


class BlockArguments(UserArguments):
    name: IdText = Field(description="The block's name, e.g. persona (an id).")
    content: BlockText = Field(description="The text.")


class SessionMessagesArguments(UserArguments):
    session_id: IdText = Field(description=SESSION)
    limit: StrictInt = Field(
        default=20, ge=1, le=1000, description="How many messages at most (two per turn)."
    )


class ForgetArguments(UserArguments):
    session_id: IdText | None = Field(
        default=None,
        description="Forget only this session's episodes. Without it, user_id must be given, "
        "and all of that user's episodes, facts and blocks are forgotten.",
    )
    before: When | None = Field(default=None, description="Only what is older than this time.")
    since: When | None = Field(default=None, description="With before: only from this time on.")


class WmGetArguments(Arguments):
    session_id: IdText = Field(description="The live session (its spawn's session_id).")
    key: str | None = Field(
        default=None, description="The variable. Default: every variable of the session."
    )


class WmSetArguments(Arguments):
    session_id: IdText = Field(description="The live session (its spawn's session_id).")
    key: str = Field(description="The variable (not starting with '_').")
    value: JsonValue = Field(description="Any JSON value.")
    ttl_seconds: StrictFloat | None = Field(
        default=None,
        gt=0,
        le=MAX_TTL_SECONDS,
        description="Forget the variable after this long (seconds, at most "
        f"{MAX_TTL_SECONDS}). Default: never.",
    )
