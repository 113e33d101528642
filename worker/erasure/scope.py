"""What a forget covers: the selector (``ForgetScope``), checked whole before anything is
touched, and the rows it selects (``row_scope``, ``user_key``): ``worker.erasure.forget``.

A selector is a project, narrowed by a session, a user (``''``: the anonymous bucket, data of
no user) and a time (``before``: only what occurred before it; with ``since`` too, only what
occurred in ``[since, before)``: a range needs both bounds). Every part is checked first: an id
that breaks the id rule (``InvalidIdError``), a user named twice, a time Postgres and the
streams cannot hold (before year 1 in UTC, as ``0001-01-01T00:00:00+14:00`` is, one of the edge
instants Postgres stores as infinity, or not a time at all, a ``since`` not earlier than
``before`` or without it: ``InvalidForgetError``) is refused with a ``ValueError`` naming the
field, and nothing is touched.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import ColumnElement

from schemas.inputs import when_problem
from worker.db.models import Episode, LifecycleEvent
from worker.erasure.users import episode_user, event_user
from worker.ids import validate_id


class InvalidForgetError(ValueError):
    """A forget's selector that cannot be honoured exactly: nothing was touched."""


def check_before(before: datetime | None, name: str = "before") -> datetime | None:
    """``before`` as an aware UTC time every store can hold (a naive time is read as UTC), or
    ``InvalidForgetError`` naming ``name`` (``before``, or ``since``)."""
    if before is None:
        return None
    if not isinstance(before, datetime):
        raise InvalidForgetError(f"{name} must be a time (RFC 3339); got {before!r:.80}")
    try:
        utc = (before if before.tzinfo else before.replace(tzinfo=UTC)).astimezone(UTC)
        utc.timestamp()
    except (OverflowError, ValueError):
        raise InvalidForgetError(
            f"{name} must be a time between years 1 and 9999 in UTC; got {before.isoformat()}"
        ) from None
    if (problem := when_problem(utc)) is not None:  # the input rule's edges (infinity)
        raise InvalidForgetError(f"{name} must be a time Postgres holds as given: {problem}")
    return utc


def check_range(
    since: datetime | None, before: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """``(since, before)`` checked: each a time the stores hold, and ``since`` (the range's
    start, included) only with a later ``before`` (its end, excluded)."""
    start, end = check_before(since, "since"), check_before(before)
    if start is not None and end is None:
        raise InvalidForgetError("since needs before: a range is [since, before)")
    if start is not None and end is not None and start >= end:
        raise InvalidForgetError(
            f"since must be earlier than before; got since {start.isoformat()}, "
            f"before {end.isoformat()}"
        )
    return start, end


@dataclass(frozen=True, slots=True)
class ForgetScope:
    """What one forget covers, checked: ``project_id`` (and ``session_id``), of ``user`` only
        (``''``: the data of no user; None: no user selector), what occurred before ``before`` (and
    at or after ``since``, when given)."""

    project_id: str
    session_id: str | None = None
    user: str | None = None
    before: datetime | None = None
    since: datetime | None = None

    @classmethod
    def checked(
        cls,
        project_id: str,
        session_id: str | None = None,
        before: datetime | None = None,
        user_id: str | None = None,
        anonymous_user: bool = False,
        since: datetime | None = None,
    ) -> ForgetScope:
        """The selector, every part checked: an ``InvalidIdError`` or ``InvalidForgetError``
        (both ``ValueError``) naming the field."""
        validate_id(project_id, "project_id")  # an InvalidIdError (a ValueError) names it
        if session_id is not None:
            validate_id(session_id, "session_id")
        user = user_key(user_id, anonymous_user)
        start, end = check_range(since, before)
        return cls(project_id, session_id, user, end, start)


def row_scope(
    model: type[Episode] | type[LifecycleEvent],
    project_id: str,
    session_id: str | None,
    before: datetime | None,
    user: str | None = None,
    sessions: Collection[str] = (),
    since: datetime | None = None,
    written_before: datetime | None = None,
) -> list[ColumnElement[bool]]:
    """The rows a forget removes (and an export returns); with ``user``, that user's only
    (results: of the user's ``sessions`` too); with ``written_before``, only rows written
    (``recorded_at``) before it: what was written after a forget is never its to remove."""
    conditions = [model.project_id == project_id]
    if written_before is not None:
        conditions.append(model.recorded_at < written_before)
    if session_id is not None:
        conditions.append(model.session_id == session_id)
    if before is not None:
        conditions.append(model.occurred_at < before)
    if since is not None:
        conditions.append(model.occurred_at >= since)
    if user is not None:
        conditions.append(episode_user(user) if model is Episode else event_user(user, sessions))
    return conditions


def user_key(user_id: str | None, anonymous_user: bool) -> str | None:
    """The user selector: a named user, ``''`` (the anonymous bucket: only when asked for with
    ``anonymous_user``), or None (no selector: the whole project or session)."""
    if anonymous_user:
        if user_id is not None:
            raise InvalidForgetError("user_id and anonymous_user: choose one")
        return ""
    return None if user_id is None else validate_id(user_id, "user_id")
