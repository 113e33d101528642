"""Text that cannot be stored as text (a NUL character, a lone surrogate) is refused at every
door of working memory and of the lifecycle streams, at any depth, naming where: before, it was
accepted, and the session's episode (or its audit row) was lost at consolidation."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from schemas.inputs import InvalidInputError
from tests.cli_process import Memworker
from tests.helpers import command, publish, results, running_worker, spawn_session
from tests.integration.test_access import AUTH, PROJECT, api
from tests.integration.test_client_and_cli import memworker
from worker.keys import SessionKeys
from worker.lifecycle.client import LifecycleClient
from worker.memory import WorkingMemory
from worker.settings import Settings

__all__ = ["api"]  # the served API fixture, shared with test_access

NUL_VALUES: list[tuple[Any, str]] = [
    ("x\x00y", "value of key 'note'"),
    ({"deep": [1, {"k": "a\x00"}]}, "['deep'][1]['k']"),
    ({"a\x00": 1}, "(a key, 'a\\x00')"),
    (["\ud800"], "[0]"),
]


@pytest.mark.parametrize(("value", "where"), NUL_VALUES)
async def test_python_working_memory_refuses_unstorable_text_at_any_depth(
    redis: Redis, settings: Settings, value: Any, where: str
) -> None:
    memory = await WorkingMemory.for_session("s-nul", "p-nul", redis=redis, settings=settings)
    with pytest.raises(ValueError, match=r"NUL|lone surrogate") as raised:
        await memory.set("note", value)
    assert where in str(raised.value)
    assert await memory.get_all() == {}


async def test_http_wm_set_refuses_a_nul_in_a_value_or_a_nested_key(
    api: tuple[str, Memworker], redis: Redis, settings: Settings
) -> None:
    base, _ = api
    await spawn_session(redis, settings, PROJECT, "nulhttp")
    async with httpx.AsyncClient(base_url=base, timeout=30, headers=AUTH) as http:
        for value in ["x\x00y", {"a": {"b\x00": 1}}, [[["\x00"]]]]:
            got = await http.post(
                "/v1/wm_set", json={"session_id": "nulhttp", "key": "note", "value": value}
            )
            assert got.status_code == 400, got.text
            assert "NUL" in got.json()["error"] and "note" in got.json()["error"]
        got = await http.post("/v1/wm_get", json={"session_id": "nulhttp"})
        assert got.json() == {"variables": {}}, got.text


async def test_the_stream_door_refuses_a_nul_in_any_command_field_naming_it(
    redis: Redis, settings: Settings
) -> None:
    cases: dict[str, tuple[str, dict[str, Any], str]] = {
        "m1": ("spawn", {"metadata": {"m": "\x00"}}, "metadata['m']"),
        "m2": ("spawn", {"correlation_id": "c\x00"}, "correlation_id"),
        "m3": ("spawn", {"initial_state": {"a\x00": "v"}}, "initial_state (a key"),
        "m4": ("spawn", {"initial_state": {"a": ["ok", {"b": "\x00"}]}}, "initial_state['a'][1]"),
        "m5": ("terminate", {"lessons_learned": ["nul \x00"]}, "lessons_learned"),
        "m6": ("pause", {"description": "d\x00"}, "description"),
    }
    for event_id, (kind, fields, _where) in cases.items():
        await publish(redis, settings, command(kind, event_id, session=f"s-{event_id}", **fields))
    async with running_worker(settings):
        for _ in range(200):
            if len(await results(redis, settings)) >= len(cases):
                break
            await asyncio.sleep(0.05)
    got = {r["causation_id"]: r for r in await results(redis, settings)}
    for event_id, (_kind, _fields, where) in cases.items():
        result = got[event_id]
        assert result["type"] == "command.rejected", result
        assert result["reason"] == "invalid_event", result
        assert where in result["detail"] and "NUL" in result["detail"], result["detail"]
    spawned = SessionKeys.for_session(settings.stream_prefix, settings.shards, "p1", "s-m3")
    assert await redis.exists(spawned.meta) == 0


async def test_lifecycle_client_refuses_a_nul_or_lone_surrogate_before_publishing(
    redis: Redis, settings: Settings
) -> None:
    client = LifecycleClient(redis, settings)
    for state in [{"a": "\x00"}, {"a": "\ud800"}]:
        with pytest.raises(InvalidInputError, match="initial_state"):
            await client.publish(
                {
                    "type": "spawn",
                    "project_id": "p1",
                    "session_id": "s1",
                    "agent_instance_id": "a1",
                    "initial_state": state,
                }
            )
    assert [k async for k in redis.scan_iter(match=f"{settings.stream_prefix}:*")] == []


@pytest.mark.parametrize(
    ("option", "raw"),
    [
        ("--state", '{"a":"\\u0000"}'),
        ("--state", '{"a":"\\ud800"}'),
        ("--state", '{"a":{"b\\u0000":1}}'),
        ("--set", 'lessons_learned=["nul \\u0000"]'),
    ],
)
async def test_cli_publish_refuses_unstorable_text_as_a_usage_error(
    redis: Redis, settings: Settings, option: str, raw: str
) -> None:
    done = memworker(settings, "publish", "spawn", "-p", "p1", "-s", "s1", option, raw)
    assert done.returncode == 2, done.stderr
    assert option in done.stderr and ("NUL" in done.stderr or "surrogate" in done.stderr)
    assert "unexpected" not in done.stderr
    assert [k async for k in redis.scan_iter(match=f"{settings.stream_prefix}:*")] == []


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--task", "bad\udcffbyte"], "task_description"),
        (["--task", "ok", "--lesson", "bad\udcffbyte"], "lessons_learned[0]"),
    ],
)
async def test_cli_remember_names_the_field_of_unstorable_text(
    redis: Redis, settings: Settings, database_url: str, args: list[str], field: str
) -> None:
    """Before: "memworker: error: Postgres error 22000: invalid input for query argument $17…"."""
    from tests.integration.test_access import migrated

    settings = await migrated(settings, database_url)
    done = memworker(settings, "remember", "-p", "projA", "--id", "clix1", *args)
    assert done.returncode == 2  # bad input: a usage error
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"memworker: error: {field}: contains a "), line
    assert "Postgres" not in line
