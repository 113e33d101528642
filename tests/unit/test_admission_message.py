"""The admission refusal a publisher reads (``P:admission:{i}``) shows the used memory and the
limit with enough digits to differ: never "4.51M is past 4.51M"."""

from __future__ import annotations

import re

import pytest

from worker.lifecycle.admission import nearly_full_reason

CAP = 5_011_000


@pytest.mark.parametrize("past", [1, 37, 1_000, 9_000, 2_000_000])
def test_the_value_and_the_limit_differ_in_the_message_however_close(past: int) -> None:
    limit = int(CAP * 0.9)
    message = nearly_full_reason(limit + past, limit, CAP, 0.1)
    assert message.startswith("Redis is nearly full: used_memory ")
    shown = re.match(r"Redis is nearly full: used_memory (\S+) is past the limit (\S+) ", message)
    assert shown is not None, message
    value, shown_limit = shown.groups()
    assert value != shown_limit, message
    assert float(value.removesuffix("M")) > float(shown_limit.removesuffix("M"))
    assert f"{limit + past:,}" in message and f"{limit:,}" in message  # exact bytes too
    assert "MEMWORKER_ADMISSION_RESERVE 10%" in message


def test_a_value_at_the_limit_reached_it() -> None:
    message = nearly_full_reason(4_509_900, 4_509_900, CAP, 0.1)
    assert "used_memory 4.30M reached the limit 4.30M" in message
