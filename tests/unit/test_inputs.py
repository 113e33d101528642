"""The input rule (``schemas.inputs``) at its edges: what every door takes and what it refuses,
each refusal an ``InvalidInputError`` (a ``ValueError``) naming the field."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from schemas.inputs import (
    InvalidInputError,
    check_id,
    check_limit,
    check_text,
    check_ttl,
    check_when,
)
from schemas.limits import MAX_TTL_SECONDS
from worker.ids import InvalidIdError, validate_id


@pytest.mark.parametrize("value", ["a", "chat-1", "ep_01ABC", "a.b:c-d_e", "x" * 128])
def test_ids_of_the_rule_pass(value: str) -> None:
    assert check_id(value, "session_id") == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "*",
        "%",
        "a?b",
        "[a]",
        "../chat-a",
        "a/b",
        "a b",
        "ｃｈａｔ",
        "é",
        "a\x00",
        "x" * 129,
        7,
        None,
    ],
)
def test_ids_outside_the_rule_are_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidInputError) as refused:
        check_id(value, "session_id")
    assert refused.value.field == "session_id"
    with pytest.raises(InvalidIdError) as legacy:  # the kernel's id check is the same rule
        validate_id(value, "session_id")
    assert isinstance(legacy.value, InvalidInputError) and legacy.value.field == "session_id"


def test_text_takes_any_unicode_within_its_size_and_refuses_nul_and_lone_surrogates() -> None:
    assert check_text("héllo * ../ ｆ 🚆", "input", 64) == "héllo * ../ ｆ 🚆"
    assert check_text("é" * 32, "input", 64)  # 64 bytes: at the limit
    for value, why in [
        ("a\x00b", "NUL"),
        ("a\ud800b", "lone surrogate"),
        ("\udfff", "lone surrogate"),
        ("é" * 33, "66 bytes"),
        (b"bytes", "must be text"),
        (None, "must be text"),
    ]:
        with pytest.raises(InvalidInputError, match=why) as refused:
            check_text(value, "input", 64)
        assert str(refused.value).startswith("input: ")
    with pytest.raises(InvalidInputError, match="empty"):
        check_text("", "object", 64, empty=False)


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC),  # EARLIEST
        datetime(9999, 12, 31, 23, 59, 59, 999998, tzinfo=UTC),  # LATEST
        datetime(1, 1, 1, 14, 0, 0, 1, tzinfo=timezone(timedelta(hours=14))),
        datetime(2026, 1, 1),  # no zone: UTC
    ],
)
def test_times_that_are_instants_in_0001_to_9999_utc_pass(value: datetime) -> None:
    assert check_when(value, "occurred_at").tzinfo is not None


@pytest.mark.parametrize(
    "value",
    [
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),  # 0000-12-31T10:00Z
        datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-14))),
        "2026-01-01T00:00:00Z",
        # the range's edges: asyncpg sends them to Postgres as -infinity and infinity
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1, 14, tzinfo=timezone(timedelta(hours=14))),
        datetime(1, 1, 1),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(9999, 12, 31, 22, 59, 59, 999999, tzinfo=timezone(timedelta(hours=-1))),
    ],
)
def test_times_outside_are_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidInputError) as refused:
        check_when(value, "before")
    assert refused.value.field == "before"


def test_limits_are_integers_from_one() -> None:
    assert check_limit(1) == 1 and check_limit(10_000) == 10_000
    for value in (0, -1, 10_001, 2.0, "5", True, None, math.nan):
        with pytest.raises(InvalidInputError) as refused:
            check_limit(value)
        assert refused.value.field == "limit"


def test_ttls_are_finite_positive_and_at_most_a_year() -> None:
    assert check_ttl(0.001) == 0.001 and check_ttl(MAX_TTL_SECONDS) == MAX_TTL_SECONDS
    for value in (0, -1, math.inf, math.nan, MAX_TTL_SECONDS + 1, 2**62, "60", True):
        with pytest.raises(InvalidInputError) as refused:
            check_ttl(value)
        assert refused.value.field == "ttl_seconds"
