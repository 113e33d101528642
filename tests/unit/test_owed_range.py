"""An owed forget of a time range keeps its start, so finishing it removes that range only."""

from __future__ import annotations

from datetime import UTC, datetime

from worker.erasure.owed import Owed
from worker.erasure.scope import ForgetScope


def test_an_owed_range_kept_in_redis_comes_back_with_its_since() -> None:
    since, before = datetime(2026, 1, 15, tzinfo=UTC), datetime(2026, 2, 15, tzinfo=UTC)
    owed = Owed("e1", "p", None, "ann", before, before, datetime.now(UTC), "redis", since)
    again = Owed.from_json("e1", owed.to_json())
    assert again == owed
    scope = ForgetScope.checked(again.project_id, None, again.before, "ann", since=again.since)
    assert (scope.since, scope.before) == (since, before)
    plain = Owed("e2", "p", None, None, None, before, datetime.now(UTC), "redis")
    assert Owed.from_json("e2", plain.to_json()).since is None
