"""What a forget covers (``row_scope``, ``user_key``) and what it says it removed
(``ForgetReceipt``): ``worker.erasure.forget``."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement

from worker.db.models import Episode, LifecycleEvent
from worker.erasure.users import episode_user, event_user
from worker.ids import validate_id


@dataclass(slots=True)
class ForgetReceipt:
    """What one forget removed, where, and how many; ``errors``: what it could not remove."""

    project_id: str
    session_id: str | None = None
    before: datetime | None = None
    dry_run: bool = False
    user_id: str | None = None
    """The user forgotten (``''``: the anonymous bucket); None: no user selector."""
    erasure_id: str | None = None
    cutoff: datetime | None = None
    postgres: dict[str, int] = field(default_factory=dict)
    redis: dict[str, int] = field(default_factory=dict)
    streams: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def counts(self) -> dict[str, Any]:
        return {
            "postgres": dict(self.postgres),
            "redis": dict(self.redis),
            "streams": dict(self.streams),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "project_id": self.project_id,
            "session_id": self.session_id,
            "user_id": self.user_id,
            "before": self.before.isoformat() if self.before else None,
            "dry_run": self.dry_run,
            "erasure_id": self.erasure_id,
            "cutoff": self.cutoff.isoformat() if self.cutoff else None,
            **self.counts(),
            "errors": list(self.errors),
        }

    def lines(self) -> list[str]:
        """The receipt as a person reads it: one line per place."""
        scope = f"project {self.project_id}"
        if self.user_id is not None:
            scope += f", user {self.user_id}" if self.user_id else ", the anonymous user"
        if self.session_id:
            scope += f", session {self.session_id}"
        if self.before:
            scope += f", history before {self.before.isoformat()}"
        head = "would forget" if self.dry_run else "forgot"
        out = [f"{head} {scope}" + (f" (erasure {self.erasure_id})" if self.erasure_id else "")]
        for where, counts in (("postgres", self.postgres), ("redis", self.redis)):
            for what, n in counts.items():
                out.append(f"  {where} {what}: {n}")
        for stream, n in sorted(self.streams.items()):
            out.append(f"  stream {stream}: {n} entries")
        return out


def row_scope(
    model: type[Episode] | type[LifecycleEvent],
    project_id: str,
    session_id: str | None,
    before: datetime | None,
    user: str | None = None,
    sessions: Collection[str] = (),
) -> list[ColumnElement[bool]]:
    """The rows a forget removes (and an export returns); with ``user``, that user's only
    (results: of the user's ``sessions`` too)."""
    conditions = [model.project_id == project_id]
    if session_id is not None:
        conditions.append(model.session_id == session_id)
    if before is not None:
        conditions.append(model.occurred_at < before)
    if user is not None:
        conditions.append(episode_user(user) if model is Episode else event_user(user, sessions))
    return conditions


def user_key(user_id: str | None, anonymous_user: bool) -> str | None:
    """The user selector: a named user, ``''`` (the anonymous bucket: only when asked for with
    ``anonymous_user``), or None (no selector: the whole project or session)."""
    if anonymous_user:
        if user_id is not None:
            raise ValueError("user_id and anonymous_user: choose one")
        return ""
    return None if user_id is None else validate_id(user_id, "user_id")
