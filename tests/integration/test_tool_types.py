"""The tools take numbers as JSON numbers, at every door alike: ``"5"`` and ``true`` are
refused (422 naming the field) where an integer or a number is meant. Before,
``session_messages {"limit": "5"}`` and ``wm_set {"ttl_seconds": true}`` (a 1 s TTL) were
accepted while ``recall`` refused ``"5"``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.cli_process import Memworker
from tests.helpers import spawn_session
from tests.integration.test_access import AUTH, PROJECT, api
from worker.settings import Settings

__all__ = ["api"]

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("session_messages", {"session_id": "c1", "limit": "5"}, "limit"),
    ("session_messages", {"session_id": "c1", "limit": True}, "limit"),
    ("recall", {"query": "x", "limit": True}, "limit"),
    ("recall", {"query": "x", "min_score": "0.5"}, "min_score"),
    ("recall_facts", {"limit": "2"}, "limit"),
    ("recall_facts_scored", {"limit": "2"}, "limit"),
    ("recall_facts_scored", {"limit": True}, "limit"),
    (
        "add_fact",
        {"subject": "a", "predicate": "b", "object": "c", "confidence": True},
        "confidence",
    ),
    ("wm_set", {"session_id": "typed", "key": "k", "value": 1, "ttl_seconds": True}, "ttl_seconds"),
    ("wm_set", {"session_id": "typed", "key": "k", "value": 1, "ttl_seconds": "5"}, "ttl_seconds"),
]


@pytest.mark.parametrize(("tool", "body", "field"), CASES)
async def test_a_number_given_as_text_or_bool_is_refused_naming_the_field(
    api: tuple[str, Memworker], tool: str, body: dict[str, Any], field: str
) -> None:
    base, _ = api
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as http:
        got = await http.post(
            f"/v1/{tool}", json={"user_id": "ann", **body} if tool != "wm_set" else body
        )
    assert got.status_code == 422, got.text
    assert field in got.json()["error"]


async def test_json_numbers_are_still_taken(
    api: tuple[str, Memworker], redis: Redis, settings: Settings
) -> None:
    base, _ = api
    await spawn_session(redis, settings, PROJECT, "typed")
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as http:
        for tool, body in [
            ("wm_set", {"session_id": "typed", "key": "k", "value": 1, "ttl_seconds": 5}),
            ("wm_set", {"session_id": "typed", "key": "k", "value": 1, "ttl_seconds": 2.5}),
            ("recall", {"user_id": "ann", "query": "x", "limit": 3, "min_score": 0}),
            ("session_messages", {"user_id": "ann", "session_id": "c1", "limit": 5}),
        ]:
            got = await http.post(f"/v1/{tool}", json=body)
            assert got.status_code == 200, (tool, got.text)
