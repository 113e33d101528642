"""What a forget says it removed (``ForgetReceipt``: where, how many, what it could not) and
what it met on the way (``Found``): ``worker.erasure.forget``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


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
    since: datetime | None = None
    """The range's start (included) when the forget was of ``[since, before)``."""
    written_before: datetime | None = None
    """When the forget took effect: it covers what was written before it (None: a forget
    recorded before migration 0011, still owed: it covers by ``cutoff``)."""
    owed: str | None = None
    """Where the record of this forget, still owed, is kept (``postgres`` or ``redis``:
    ``worker.erasure.owed``); None: complete, or not recorded."""

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
            "since": self.since.isoformat() if self.since else None,
            "dry_run": self.dry_run,
            "erasure_id": self.erasure_id,
            "cutoff": self.cutoff.isoformat() if self.cutoff else None,
            **self.counts(),
            "errors": list(self.errors),
            "owed": self.owed,
        }

    def lines(self) -> list[str]:
        """The receipt as a person reads it: one line per place."""
        scope = f"project {self.project_id}"
        if self.user_id is not None:
            scope += f", user {self.user_id}" if self.user_id else ", the anonymous user"
        if self.session_id:
            scope += f", session {self.session_id}"
        if self.since and self.before:
            scope += f", history from {self.since.isoformat()} to before {self.before.isoformat()}"
        elif self.before:
            scope += f", history before {self.before.isoformat()}"
        head = "would forget" if self.dry_run else "forgot"
        out = [f"{head} {scope}" + (f" (erasure {self.erasure_id})" if self.erasure_id else "")]
        for where, counts in (("postgres", self.postgres), ("redis", self.redis)):
            for what, n in counts.items():
                out.append(f"  {where} {what}: {n}")
        for stream, n in sorted(self.streams.items()):
            out.append(f"  stream {stream}: {n} entries")
        if self.owed:
            out.append(f"  owed (recorded in {self.owed}): a retry finishes it to this scope")
        return out


@dataclass(slots=True)
class Found:
    """Sessions of the scope seen anywhere, those marked, the ids of deleted results, episodes
    and facts (their dedupe records, announcements and change-feed events go too), and who
    holds each session id now (``holders``)."""

    sessions: set[str] = field(default_factory=set)
    marked: set[str] = field(default_factory=set)
    result_ids: set[str] = field(default_factory=set)
    episode_ids: set[str] = field(default_factory=set)
    fact_ids: set[str] = field(default_factory=set)
    """A session's forget: the facts made only from it, deleted (their change-feed entries go
    too: ``worker.erasure.session_facts``)."""
    holders: dict[str, str] = field(default_factory=dict)
    """A user's forget: the user of each of its session ids' latest life (``''``: none), as
    the streams (else Postgres) show it; a session id another user spawned since is theirs."""


def add(counts: dict[str, int], name: str, n: int) -> None:
    counts[name] = counts.get(name, 0) + n
