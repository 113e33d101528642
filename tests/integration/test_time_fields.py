"""Time fields take RFC 3339 text only, at every door: a number or numeric text is not a Unix
time here. Before, ``forget {"before": -1}`` answered 200 (a cutoff in 1969), ``"before": "5"``
too, ``remember_many`` stored a turn at ``occurred_at: 1.5`` and ``add_fact`` took
``valid_from: -1``; now each is a 422 naming the field, and nothing is stored."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.cli_process import Memworker
from tests.helpers import worker_env
from tests.integration.test_access import AUTH, api
from worker.settings import Settings

__all__ = ["api"]

TURN = {"session_id": "t1", "input": "hello", "output": "hi"}
BAD_TIMES: list[Any] = [
    -1,
    1.5,
    "5",
    "-1",
    True,
    "2026-11-20",
    "20261120T080000Z",
    "2026-02-30T00:00:00Z",
]
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("forget", {}, "before"),
    ("recall", {"query": "x"}, "until"),
    ("recall", {"query": "x"}, "since"),
    ("recall_facts", {}, "valid_at"),
    ("recall_facts_scored", {}, "valid_at"),
    ("add_fact", {"subject": "a", "predicate": "b", "object": "c"}, "valid_from"),
    ("remember", TURN, "occurred_at"),
]


@pytest.mark.parametrize("bad", BAD_TIMES)
async def test_a_time_that_is_not_rfc3339_text_is_refused_naming_the_field(
    api: tuple[str, Memworker], bad: Any
) -> None:
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as http:
        for tool, body, field in CASES:
            got = await http.post(f"/v1/{tool}", json={"user_id": "ann", **body, field: bad})
            assert got.status_code == 422, (tool, field, bad, got.text)
            assert field in got.json()["error"], got.text
        batch = {"user_id": "ann", "turns": [TURN, {**TURN, "occurred_at": bad}]}
        got = await http.post("/v1/remember_many", json=batch)
        assert got.status_code == 422, (bad, got.text)
        assert "occurred_at" in got.json()["error"]
        # nothing was stored by any of them
        got = await http.post("/v1/session_messages", json={"user_id": "ann", "session_id": "t1"})
        assert got.status_code == 200, got.text
        assert "hello" not in got.text
        facts = await http.post("/v1/recall_facts", json={"user_id": "ann"})
        assert facts.status_code == 200, facts.text
        assert '"predicate"' not in facts.text


async def test_rfc3339_times_are_still_taken(api: tuple[str, Memworker]) -> None:
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as http:
        for when in [
            "2026-11-20T08:00:00Z",
            "2026-11-20T08:00:00.123456789+01:00",
            "2026-11-20 08:00:00",
        ]:
            got = await http.post(
                "/v1/remember", json={"user_id": "ann", **TURN, "occurred_at": when}
            )
            assert got.status_code == 200, (when, got.text)
            got = await http.post("/v1/forget", json={"user_id": "nobody", "before": when})
            assert got.status_code == 200, (when, got.text)


@pytest.mark.parametrize("bad", ["5", "2026-11-20", "20261120T080000Z", "99999999999999d"])
def test_the_cli_refuses_a_time_that_is_not_rfc3339_as_a_usage_error(
    settings: Settings, bad: str
) -> None:
    for args in (
        ["forget", "-p", "pr", "-u", "ann", "--before", bad, "--dry-run"],
        ["memory", "recall", "-u", "ann", "--since", bad, "x"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", *args],
            env=worker_env(settings),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "unexpected" not in done.stderr and "Traceback" not in done.stderr
