"""A forget's selector is checked whole before anything is touched (``worker.erasure.scope``):
a time no store can hold, an id that breaks the rule, a user named twice are each a
``ValueError`` naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from worker.erasure.scope import ForgetScope, InvalidForgetError, check_before
from worker.ids import InvalidIdError


@pytest.mark.parametrize(
    "when",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),  # year 0 in UTC
        datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-14))),  # year 10000
        datetime.min.replace(tzinfo=timezone(timedelta(minutes=1))),
    ],
)
def test_a_time_before_year_one_or_after_9999_in_utc_is_refused_naming_before(
    when: datetime,
) -> None:
    with pytest.raises(InvalidForgetError, match=r"^before must be"):
        check_before(when)
    with pytest.raises(ValueError, match="before"):
        ForgetScope.checked("p", before=when, user_id="zoe")


def test_a_time_every_store_holds_is_kept_exactly_in_utc() -> None:
    plus_14 = datetime(2026, 1, 1, 10, tzinfo=timezone(timedelta(hours=14)))
    assert check_before(plus_14) == datetime(2025, 12, 31, 20, tzinfo=UTC)
    assert check_before(datetime(2026, 1, 1)) == datetime(2026, 1, 1, tzinfo=UTC)  # naive: UTC
    assert check_before(datetime(1, 1, 1, 14, 0, 0, 1, tzinfo=timezone(timedelta(hours=14)))) == (
        datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    )
    for edge in (datetime(1, 1, 1, tzinfo=UTC), datetime.max.replace(tzinfo=UTC)):  # infinity
        with pytest.raises(InvalidForgetError, match=r"^before must be .*infinity"):
            check_before(edge)
    assert check_before(None) is None


def test_ids_and_the_user_selector_are_checked_too() -> None:
    with pytest.raises(InvalidIdError, match="session_id"):
        ForgetScope.checked("p", session_id="../chat")
    with pytest.raises(InvalidIdError, match="user_id"):
        ForgetScope.checked("p", user_id="*")
    with pytest.raises(InvalidForgetError, match="user_id and anonymous_user"):
        ForgetScope.checked("p", user_id="zoe", anonymous_user=True)
    assert ForgetScope.checked("p", anonymous_user=True).user == ""
    assert ForgetScope.checked("p").user is None
