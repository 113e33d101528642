"""LoomFlow 0.20's memory types, field for field: what ``Memory`` takes and returns.

Every model also accepts an object of LoomFlow's own class of the same name (or any object with
the same attributes: ``from_attributes``), so a LoomFlow program passes its ``Episode`` or
``Fact`` unchanged; ``as_episode``/``as_fact`` convert one.
"""

from __future__ import annotations

import re
import secrets
import sys
import time
import warnings
from datetime import UTC, datetime
from enum import StrEnum
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.inputs import When
from worker.ids import validate_id

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id(prefix: str = "") -> str:
    """A ULID (time-ordered, 26 characters), ``prefix_`` first as LoomFlow's ids are."""
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    text = "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))
    return f"{prefix}_{text}" if prefix else text


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(when: datetime) -> datetime:
    """A naive datetime read as UTC (aware ones pass through), as LoomFlow does."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_NON_WORD = re.compile(r"[^A-Za-z0-9]+")


def normalize_predicate(value: str) -> str:
    """LoomFlow's canonical predicate: "Name_Is", "name-is", "nameIs", "name is" → "name_is"."""
    return _NON_WORD.sub("_", _CAMEL.sub(r"\1_\2", value)).lower().strip("_")


def check_user_id(user_id: str | None) -> str | None:
    """A user id (None: the anonymous bucket) follows the id rule of every id memworker
    keeps (``worker.ids``: 1-128 characters of ``[A-Za-z0-9._:-]``), as a spawn's ``user_id``
    does, so a session's user and a turn's are one user: map other text (an email address)
    to an id first."""
    return None if user_id is None else validate_id(user_id, "user_id")


class IsolationWarning(UserWarning):
    """A recall without ``user_id`` on a store that holds named users' data: it sees only the
    anonymous bucket, which is rarely what the caller meant."""


@lru_cache(maxsize=2)
def _isolation_warning(loomflow_class: type[Warning] | None) -> type[Warning]:
    if loomflow_class is None:
        return IsolationWarning
    return type("IsolationWarning", (IsolationWarning, loomflow_class), {})


def warn_isolation(message: str, stacklevel: int) -> None:
    """Warn ``IsolationWarning``; in a program that uses LoomFlow, one that is LoomFlow's
    ``IsolationWarning`` too, so the filters and ``pytest.warns`` it has keep working."""
    context = sys.modules.get("loomflow.core.context")
    category = _isolation_warning(getattr(context, "IsolationWarning", None))
    warnings.warn(message, category, stacklevel=stacklevel + 1)


class _Model(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    def __eq__(self, other: object) -> bool:
        """Equal to an object of LoomFlow's class of the same name with the same fields."""
        if isinstance(other, BaseModel) and type(other).__name__ == type(self).__name__:
            return bool(self.model_dump() == other.model_dump())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as pydantic's


class Role(StrEnum):
    """Who said a ``Message``."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ToolCall(_Model):
    """A tool an assistant called, with its arguments."""

    id: str = Field(default_factory=lambda: new_id("tcall"))
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    tool_def: dict[str, Any] | None = None
    destructive: bool = False

    @field_validator("tool_def", mode="before")
    @classmethod
    def _tool_def(cls, value: Any) -> Any:
        return value.model_dump() if isinstance(value, BaseModel) else value


class Image(_Model):
    """An image in a ``Message``: its ``data`` as text, and its ``media_type``."""

    data: str
    media_type: str = "image/png"


class Message(_Model):
    """One message of a conversation (LoomFlow's): an episode's ``tool_transcript``, or a
    session's turns as messages (``Memory.session_messages``)."""

    role: Role
    content: str
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    images: tuple[Image, ...] = ()


class MemoryBlock(_Model):
    """A named block of text pinned to a user (``pinned_order``: its place in the profile)."""

    name: str
    content: str
    updated_at: datetime = Field(default_factory=utcnow)
    pinned_order: int = 0

    def format(self) -> str:
        """The block as a prompt fragment: ``<name>content</name>``."""
        return f"<{self.name}>\n{self.content}\n</{self.name}>"


class Episode(_Model):
    """One turn (``input`` → ``output``), or a finished session read as one (its task as
    ``input``, its outcome and lessons as ``output``)."""

    id: str = Field(default_factory=lambda: new_id("ep"))
    session_id: str
    user_id: str | None = None
    occurred_at: When = Field(default_factory=utcnow)
    input: str
    output: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    embedding: list[float] | None = None
    tool_transcript: list[Message] | None = None

    @field_validator("user_id")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return check_user_id(value)

    def format(self) -> str:
        """The turn as one line: ``[when] input -> output``."""
        return f"[{self.occurred_at.isoformat()}] {self.input!r} -> {self.output!r}"


class EpisodeMatch(_Model):
    """A recalled episode and its scores: ``score`` orders them (higher is better);
    ``vector_score`` is the cosine similarity (-1..1, None: not embedded yet or no vector
    search); ``bm25_score`` the lexical part (Postgres ``ts_rank``, None: no word matched);
    ``unindexed``: the episode has no vector of the recall's model yet (not embedded, or no
    vector search), so meaning could not rank it (memworker's, not LoomFlow's)."""

    episode: Episode
    score: float
    vector_score: float | None = None
    bm25_score: float | None = None
    rerank_score: float | None = None
    unindexed: bool = False


class ScoredMatches(list[EpisodeMatch]):
    """``recall_scored``'s matches, best first (a list), and ``unindexed``: how many of the
    episodes the recall looked at (its word matches and what it returns) had no vector of its
    model, so a recall that ran without some vectors says so (0: none)."""

    unindexed: int = 0


class Fact(_Model):
    """A bi-temporal claim: true in the world from ``valid_from`` until ``valid_until``
    (None: still), learned at ``recorded_at``."""

    id: str = Field(default_factory=lambda: new_id("fact"))
    user_id: str | None = None
    subject: str
    predicate: str
    object: str
    confidence: float = 1.0
    valid_from: When = Field(default_factory=utcnow)
    valid_until: When | None = None
    recorded_at: When = Field(default_factory=utcnow)
    sources: list[str] = Field(default_factory=list)

    @field_validator("predicate")
    @classmethod
    def _canonical(cls, value: str) -> str:
        return normalize_predicate(value)

    @field_validator("user_id")
    @classmethod
    def _user(cls, value: str | None) -> str | None:
        return check_user_id(value)

    @field_validator("valid_from", "recorded_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return as_utc(value)

    @field_validator("valid_until")
    @classmethod
    def _aware_or_none(cls, value: datetime | None) -> datetime | None:
        return None if value is None else as_utc(value)

    def format(self) -> str:
        """The fact as one line: subject, predicate, object, confidence, until when."""
        suffix = "" if self.valid_until is None else f" (until {self.valid_until.isoformat()})"
        return (
            f"{self.subject} {self.predicate} {self.object}"
            f" [confidence {self.confidence:.2f}]{suffix}"
        )


class FactMatch(_Model):
    """A recalled fact and its scores (``FactStore.recall_scored``, memworker's): ``score``
    orders them (higher is better): reciprocal rank fusion, ``1 / (60 + rank)`` summed over
    the rankings that found the fact (by words, by meaning; 1.0 for each fact of an empty
    query, the most recently recorded); ``vector_score`` is the cosine similarity of its
    vector to the query's (-1..1; None: it has no vector of the query's model, or the recall
    was by words alone); ``word_score`` its full-text rank (Postgres ``ts_rank``; None: no
    word of the query is in it, or the recall was by meaning alone). Facts have no relevance
    floor: every fact with a vector is ranked by meaning."""

    fact: Fact
    score: float
    vector_score: float | None = None
    word_score: float | None = None


class MemoryProfile(_Model):
    """What memory holds about a user, in short (``Memory.profile``)."""

    user_id: str | None
    episode_count: int = 0
    fact_count: int = 0
    last_seen: datetime | None = None
    recent_sessions: list[str] = Field(default_factory=list)
    sample_facts: list[Fact] = Field(default_factory=list)


class MemoryExport(_Model):
    """Everything kept about a user (``Memory.export``): episodes, facts, blocks."""

    user_id: str | None
    episodes: list[Episode] = Field(default_factory=list)
    facts: list[Fact] = Field(default_factory=list)
    blocks: list[MemoryBlock] = Field(default_factory=list)
    exported_at: datetime = Field(default_factory=utcnow)


def as_episode(value: Any) -> Episode:
    """``value`` as our ``Episode`` (LoomFlow's, a dict, or ours)."""
    return value if isinstance(value, Episode) else Episode.model_validate(value)


def as_fact(value: Any) -> Fact:
    """``value`` as our ``Fact`` (LoomFlow's, a dict, or ours)."""
    return value if isinstance(value, Fact) else Fact.model_validate(value)
