"""WorkingMemory against both backends: one suite, run on real Redis and in memory.

Tests marked ``redis_only`` are about Redis itself (the worker's key layout, outages, the
client's lifetime); everything else must behave the same on both backends.
"""

from __future__ import annotations

import asyncio
import math
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog
from redis.asyncio import Redis

from schemas.inputs import InvalidInputError
from tests.redis_process import RedisProcess
from worker.ids import InvalidIdError
from worker.keys import SessionKeys, escape_glob
from worker.memory import (
    CheckpointNotFoundError,
    InvalidKeyError,
    InvalidValueError,
    LimitExceededError,
    MemoryNotFoundError,
    RedisUnavailableError,
    ReservedKeyError,
    SessionPausedError,
    SessionTerminatedError,
    TaskState,
    WorkingMemory,
)
from worker.memory.inmemory_backend import InMemoryBackend
from worker.memory.patterns import glob_match
from worker.memory.redis_backend import RedisBackend
from worker.scripts import _read
from worker.settings import Settings


@dataclass
class Harness:
    """Opens sessions on one backend and plays the lifecycle worker's part (meta state)."""

    kind: str
    settings: Settings
    redis: Redis | None = None

    async def open(
        self,
        session_id: str | uuid.UUID = "s-1",
        project_id: str | uuid.UUID | None = "p-1",
        **overrides: Any,
    ) -> WorkingMemory:
        settings = self.settings.model_copy(update=overrides) if overrides else self.settings
        if self.kind == "redis":
            memory = await WorkingMemory.for_session(
                session_id, project_id, redis=self.redis, settings=settings
            )
        else:
            memory = WorkingMemory.in_memory(session_id, project_id, settings=settings)
        return memory

    async def set_state(self, memory: WorkingMemory, state: str) -> None:
        """What the worker's pause/resume/terminate do to the session's meta state."""
        if isinstance(memory.backend, RedisBackend):
            await memory.backend.redis.hset(memory.backend.keys.meta, "state", state)  # type: ignore[misc]
        else:
            assert isinstance(memory.backend, InMemoryBackend)
            memory.backend.state = state


@pytest.fixture(params=["redis", "memory"])
def harness(request: pytest.FixtureRequest) -> Harness:
    """Sync on purpose: it pulls the async ``redis`` fixture in only for the Redis runs."""
    if request.param == "redis":
        redis: Redis = request.getfixturevalue("redis")
        settings: Settings = request.getfixturevalue("settings")
        return Harness("redis", settings, redis)
    return Harness("memory", Settings(stream_prefix="unused"))


@pytest.fixture
async def memory(harness: Harness) -> WorkingMemory:
    return await harness.open()


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


redis_only = pytest.mark.parametrize("harness", ["redis"], indirect=True)


# Variables.

JSON_VALUES = [
    "text",
    "ünïcødé ✓",
    "",
    0,
    -17,
    12345678901234567890,
    3.25,
    True,
    False,
    None,
    [],
    {},
    [1, "two", [3.0], {"four": None}],
    {"nested": {"list": [], "empty": {}, "n": 2**60}, "slash/key": "a/b"},
]


@pytest.mark.parametrize("value", JSON_VALUES, ids=repr)
async def test_any_json_value_round_trips_unchanged(memory: WorkingMemory, value: Any) -> None:
    await memory.set("k", value)
    assert await memory.get("k", default="missing") == value
    assert await memory.get_all() == {"k": value}


async def test_a_missing_key_reads_as_the_default(memory: WorkingMemory) -> None:
    assert await memory.get("nope") is None
    assert await memory.get("nope", default=42) == 42
    assert not await memory.exists("nope")


async def test_delete_reports_whether_the_key_was_there(memory: WorkingMemory) -> None:
    await memory.set("a", 1)
    assert await memory.exists("a")
    assert await memory.delete("a") is True
    assert await memory.delete("a") is False
    assert not await memory.exists("a")


async def test_setting_a_key_again_overwrites_it(memory: WorkingMemory) -> None:
    await memory.set("a", 1)
    await memory.set("a", {"b": 2})
    assert await memory.get("a") == {"b": 2}
    assert await memory.list_keys() == ["a"]


async def test_a_key_set_with_ttl_is_gone_after_it_expires(memory: WorkingMemory) -> None:
    await memory.set("short", "soon gone", ttl_seconds=1)
    await memory.set("long", "stays")
    assert await memory.get("short") == "soon gone"

    async def expired() -> bool:
        return await memory.get("short") is None

    await eventually(expired)
    assert not await memory.exists("short")
    assert await memory.list_keys() == ["long"]
    assert await memory.get_all() == {"long": "stays"}
    assert (await memory.get_stats())["user_keys"] == 1


async def test_an_expired_key_does_not_count_towards_the_key_limit(harness: Harness) -> None:
    memory = await harness.open(max_keys_per_session=2)
    await memory.set("a", 1, ttl_seconds=0.2)
    await memory.set("b", 2)
    await asyncio.sleep(0.4)
    await memory.set("c", 3)
    assert await memory.get_all() == {"b": 2, "c": 3}


async def test_the_default_key_ttl_applies_when_no_ttl_is_given(harness: Harness) -> None:
    memory = await harness.open(default_key_ttl_seconds=1)
    await memory.set("a", 1)

    async def expired() -> bool:
        return not await memory.exists("a")

    await eventually(expired)


async def test_setting_a_key_without_ttl_removes_its_earlier_expiry(
    memory: WorkingMemory,
) -> None:
    await memory.set("a", 1, ttl_seconds=0.2)
    await memory.set("a", 2)
    await asyncio.sleep(0.4)
    assert await memory.get("a") == 2


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, 10**12, timedelta(days=400)], ids=repr)
async def test_a_ttl_that_is_not_positive_finite_and_at_most_a_year_is_refused(
    memory: WorkingMemory, ttl: Any
) -> None:
    """Infinity used to escape as an OverflowError (a 500 at the doors): now every bad ttl is
    an ``InvalidInputError`` naming ``ttl_seconds``, and nothing is written."""
    with pytest.raises(InvalidInputError, match="ttl_seconds") as refused:
        await memory.set("a", 1, ttl_seconds=ttl)
    assert refused.value.field == "ttl_seconds"
    assert not await memory.exists("a")


async def test_an_idle_session_expires_entirely(harness: Harness) -> None:
    memory = await harness.open(session_ttl_seconds=1)
    await memory.set("a", 1)
    await memory.set_task_state(description="t")
    await memory.append_scratchpad("note")
    await memory.create_checkpoint("cp")
    await asyncio.sleep(1.4)  # no access meanwhile: any access would push the expiry out
    assert await memory.get_all() == {}
    stats = await memory.get_stats()
    assert (
        stats["user_keys"],
        stats["scratchpad_entries"],
        stats["checkpoint_count"],
        stats["has_task_state"],
        stats["total_keys"],
    ) == (0, 0, 0, False, 0)


async def test_every_access_pushes_the_idle_expiry_out(harness: Harness) -> None:
    memory = await harness.open(session_ttl_seconds=1)
    await memory.set("a", 1)
    for _ in range(4):
        await asyncio.sleep(0.5)
        assert await memory.get("a") == 1


async def test_a_paused_session_does_not_expire(harness: Harness) -> None:
    memory = await harness.open(session_ttl_seconds=1)
    await memory.set("a", 1)
    await harness.set_state(memory, "paused")
    assert await memory.get("a") == 1  # the access that sees the pause persists the session
    assert (await memory.get_stats())["ttl_seconds"] is None
    await asyncio.sleep(1.4)
    assert await memory.get("a") == 1
    await harness.set_state(memory, "active")
    stats = await memory.get_stats()
    assert stats["state"] == "active"
    assert stats["ttl_seconds"] is not None
    assert 0 < stats["ttl_seconds"] <= 1


# Limits and validation.


async def test_a_new_key_beyond_the_limit_is_refused_but_overwriting_is_fine(
    harness: Harness,
) -> None:
    memory = await harness.open(max_keys_per_session=3)
    for name in "abc":
        await memory.set(name, 1)
    with pytest.raises(LimitExceededError, match="MAX_KEYS_PER_SESSION") as raised:
        await memory.set("d", 1)
    assert (raised.value.limit, raised.value.maximum) == ("keys", 3)
    await memory.set("a", "overwritten")
    assert await memory.get("a") == "overwritten"
    await memory.delete("b")
    await memory.set("d", 1)
    assert await memory.list_keys() == ["a", "c", "d"]


async def test_a_value_larger_than_max_value_bytes_is_refused(harness: Harness) -> None:
    memory = await harness.open(max_value_bytes=100)
    await memory.set("fits", "x" * 98)  # 100 bytes with its quotes
    with pytest.raises(LimitExceededError, match="MAX_VALUE_BYTES") as raised:
        await memory.set("too-big", "x" * 99)
    assert raised.value.setting == "max_value_bytes"
    assert not await memory.exists("too-big")
    with pytest.raises(LimitExceededError):
        await memory.append_scratchpad("x" * 200)


async def test_the_scratchpad_keeps_only_the_newest_entries(harness: Harness) -> None:
    memory = await harness.open(max_scratchpad_entries=5)
    counts = [await memory.append_scratchpad({"n": n}) for n in range(8)]
    assert counts == [1, 2, 3, 4, 5, 5, 5, 5]
    assert await memory.get_scratchpad() == [{"n": n} for n in range(3, 8)]


async def test_checkpoints_beyond_the_limit_are_refused(harness: Harness) -> None:
    memory = await harness.open(max_checkpoints_per_session=2)
    await memory.create_checkpoint(checkpoint_id="one")
    await memory.create_checkpoint(checkpoint_id="two")
    with pytest.raises(LimitExceededError, match="MAX_CHECKPOINTS_PER_SESSION") as raised:
        await memory.create_checkpoint(checkpoint_id="three")
    assert raised.value.limit == "checkpoints"
    await memory.create_checkpoint("replaced", checkpoint_id="two")  # replacing is fine
    assert await memory.delete_checkpoint("one")
    await memory.create_checkpoint(checkpoint_id="three")
    assert sorted(c["id"] for c in await memory.list_checkpoints()) == ["three", "two"]


@pytest.mark.parametrize("key", ["_private", "_", "__dunder__"])
async def test_reserved_keys_are_refused(memory: WorkingMemory, key: str) -> None:
    with pytest.raises(ReservedKeyError, match="reserved"):
        await memory.set(key, 1)
    for read in (memory.get, memory.exists, memory.delete):
        with pytest.raises(ReservedKeyError):
            await read(key)


@pytest.mark.parametrize("key", ["", "x" * 257, "line\nbreak", "nul\x00", "del\x7f", 7])
async def test_invalid_key_names_are_refused(memory: WorkingMemory, key: Any) -> None:
    with pytest.raises(InvalidKeyError):
        await memory.set(key, 1)


async def test_a_key_of_256_characters_is_accepted(memory: WorkingMemory) -> None:
    await memory.set("k" * 256, 1)
    assert await memory.get("k" * 256) == 1


async def test_a_value_that_is_not_json_is_refused(memory: WorkingMemory) -> None:
    with pytest.raises(InvalidValueError, match="not JSON-serializable"):
        await memory.set("a", object())
    with pytest.raises(InvalidValueError):
        await memory.append_scratchpad({1, 2})


async def test_every_bad_value_is_a_value_error_naming_what_is_wrong(harness: Harness) -> None:
    # one rule at every door: bad input is a ValueError (a generic handler catches it)
    memory = await harness.open(max_value_bytes=100)
    for bad, says in ((math.nan, "NaN"), ({1, 2}, "set"), ("x" * 200, "MAX_VALUE_BYTES")):
        with pytest.raises(ValueError, match=says):
            await memory.set("v", bad)
        assert not await memory.exists("v")


async def test_invalid_session_and_project_ids_are_refused(harness: Harness) -> None:
    with pytest.raises(InvalidIdError, match="session_id"):
        await harness.open(session_id="has space")
    with pytest.raises(InvalidIdError, match="project_id"):
        await harness.open(project_id="a/b")


async def test_ids_may_be_uuids_and_name_the_session_by_their_text(harness: Harness) -> None:
    session, project = uuid.uuid4(), uuid.uuid4()
    memory = await harness.open(session, project)
    assert (memory.session_id, memory.project_id) == (str(session), str(project))
    await memory.set("a", 1)
    stats = await memory.get_stats()
    assert (stats["scope_id"], stats["project_id"]) == (str(session), str(project))
    if harness.kind == "redis":
        same = await harness.open(str(session), str(project))
        assert await same.get("a") == 1


async def test_without_a_project_the_session_belongs_to_the_default_project(
    harness: Harness,
) -> None:
    memory = await harness.open("s-default", None)
    assert memory.project_id == "default"
    other = await harness.open("s-default", None, default_project="team-a")
    assert other.project_id == "team-a"
    await memory.set("a", "in default")
    if harness.kind == "redis":
        assert await (await harness.open("s-default", "default")).get("a") == "in default"
        assert await other.get("a") is None


# Isolation.


async def test_two_projects_with_the_same_session_id_do_not_share_memory(
    harness: Harness,
) -> None:
    first = await harness.open("same", "project-a")
    second = await harness.open("same", "project-b")
    await first.set("k", "a")
    await first.append_scratchpad("a-note")
    await first.create_checkpoint(checkpoint_id="cp")
    await second.set("k", "b")
    assert await first.get("k") == "a"
    assert await second.get("k") == "b"
    assert await second.get_scratchpad() == []
    with pytest.raises(CheckpointNotFoundError):
        await second.restore_checkpoint("cp")
    await second.clear()
    assert await first.get_all() == {"k": "a"}


async def test_two_sessions_of_one_project_do_not_share_memory(harness: Harness) -> None:
    first = await harness.open("s-a", "p")
    second = await harness.open("s-b", "p")
    await first.set("only-a", 1)
    assert await second.list_keys() == []
    assert await second.get_all() == {}
    assert not await second.exists("only-a")


GLOB_NAMES = ["star*key", "what?", "open[bracket", "plain", "back\\slash", "a:b", "{0}x"]


async def test_glob_patterns_match_only_this_sessions_key_names(harness: Harness) -> None:
    mine = await harness.open("s-mine", "p")
    other = await harness.open("s-other", "p")
    other_project = await harness.open("s-mine", "p-other")
    for name in GLOB_NAMES:
        await mine.set(name, 1)
    for name in ["secret", "star*secret", "plain"]:
        await other.set(name, "theirs")
        await other_project.set(name, "theirs")

    assert await mine.list_keys() == sorted(GLOB_NAMES)
    assert await mine.list_keys("star[*]*") == ["star*key"]
    assert await mine.list_keys("star\\**") == ["star*key"]
    assert await mine.list_keys("what\\?") == ["what?"]
    for name in GLOB_NAMES:
        assert await mine.list_keys(escape_glob(name)) == [name]
    # Patterns that try to reach other keys: they only ever see this session's names.
    for escape in ["*secret*", "*:s:*", "*/*", "*s-other*", "*p-other*", "*vars*", "}*", "\\"]:
        assert not {"secret", "star*secret"} & set(await mine.list_keys(escape))


async def test_the_in_memory_glob_matches_redis_glob(redis: Redis, prefix: str) -> None:
    names = [*GLOB_NAMES, "abc", "abd", "a-c", "^x", "]", "A", "ab", "", "a\nb"]
    patterns = [
        "*", "a?c", "a[bc]?", "a[^b]*", "[a-c]*", "[c-a]*", "*\\*", "[\\]]", "[]]", "[^]",
        "a[", "a\\", "?", "[!a]*", "\\[*", "*[", "a*b", "a?b",
    ]  # fmt: skip
    key = f"{prefix}:glob"
    await redis.hset(key, mapping={n: 1 for n in names})  # type: ignore[misc]
    for pattern in patterns:
        found = set()
        async for name, _ in redis.hscan_iter(key, match=pattern):
            found.add(name.decode())
        assert found == {n for n in names if glob_match(pattern, n)}, pattern


# Checkpoints.


@pytest.mark.parametrize("clear_current", [True, False])
async def test_a_checkpoint_of_1000_keys_round_trips(
    memory: WorkingMemory, clear_current: bool
) -> None:
    values = {f"key-{i}": {"i": i, "tags": ["x"] * (i % 3), "f": i / 7} for i in range(1000)}
    for name, value in values.items():
        await memory.set(name, value)
    await memory.set_task_state(description="big", total_steps=1000, current_step=500)
    await memory.append_scratchpad("before")
    checkpoint = await memory.create_checkpoint("thousand")
    [info] = await memory.list_checkpoints()
    assert (info["id"], info["description"], info["items"]) == (checkpoint, "thousand", 1002)

    assert await memory.clear() == 1002
    assert await memory.get_all() == {}
    assert await memory.get_task_state() is None
    if not clear_current:
        await memory.set("extra", "kept")
    restored = await memory.restore_checkpoint(checkpoint, clear_current=clear_current)
    expected = values if clear_current else {**values, "extra": "kept"}
    assert await memory.get_all() == expected
    task = await memory.get_task_state()
    assert task is not None
    assert (task.description, task.current_step) == ("big", 500)
    if clear_current:
        assert restored == 1002
        assert await memory.get_scratchpad() == ["before"]
    else:  # the current scratchpad (empty after clear) is kept
        assert restored == 1002
        assert await memory.get_scratchpad() == []


async def test_restoring_without_clearing_keeps_current_keys_and_scratchpad(
    memory: WorkingMemory,
) -> None:
    await memory.set("a", "saved")
    await memory.set("b", "saved")
    checkpoint = await memory.create_checkpoint()
    await memory.set("a", "changed")
    await memory.set("c", "new")
    await memory.append_scratchpad("later")
    await memory.restore_checkpoint(checkpoint, clear_current=False)
    assert await memory.get_all() == {"a": "saved", "b": "saved", "c": "new"}
    assert await memory.get_scratchpad() == ["later"]
    assert await memory.get_task_state() is None


async def test_a_restored_key_keeps_its_ttl(memory: WorkingMemory) -> None:
    await memory.set("brief", 1, ttl_seconds=0.5)
    await memory.set("lasting", 2)
    checkpoint = await memory.create_checkpoint()
    await asyncio.sleep(0.7)
    await memory.restore_checkpoint(checkpoint)
    assert await memory.get_all() == {"lasting": 2}


async def test_restoring_an_unknown_checkpoint_raises_memory_not_found(
    memory: WorkingMemory,
) -> None:
    with pytest.raises(MemoryNotFoundError, match="no checkpoint 'nope'") as raised:
        await memory.restore_checkpoint("nope")
    assert isinstance(raised.value, CheckpointNotFoundError)
    with pytest.raises(InvalidKeyError, match="checkpoint_id"):
        await memory.restore_checkpoint("bad|id")


async def test_checkpoints_are_listed_oldest_first_as_dicts(memory: WorkingMemory) -> None:
    ids = []
    for n in range(3):
        await memory.set("n", n)
        ids.append(await memory.create_checkpoint(f"number {n}"))
        await asyncio.sleep(0.01)
    listed = await memory.list_checkpoints()
    assert [c["id"] for c in listed] == ids
    assert [c["description"] for c in listed] == ["number 0", "number 1", "number 2"]
    assert all(c["items"] == 1 for c in listed)
    created = [datetime.fromisoformat(c["created_at"]) for c in listed]
    assert created == sorted(created)
    assert all(moment.utcoffset() == timedelta(0) for moment in created)
    assert await memory.delete_checkpoint(ids[1]) is True
    assert await memory.delete_checkpoint(ids[1]) is False
    assert [c["id"] for c in await memory.list_checkpoints()] == [ids[0], ids[2]]


async def test_checkpoints_made_in_the_same_millisecond_are_listed_in_creation_order(
    memory: WorkingMemory,
) -> None:
    ids = [await memory.create_checkpoint(f"quick {n}") for n in range(6)]
    assert [c["id"] for c in await memory.list_checkpoints()] == ids


async def test_a_generated_checkpoint_id_is_a_uuid4(memory: WorkingMemory) -> None:
    checkpoint = await memory.create_checkpoint()
    assert uuid.UUID(checkpoint).version == 4
    assert str(uuid.UUID(checkpoint)) == checkpoint


async def test_reusing_a_checkpoint_id_replaces_it_entirely(memory: WorkingMemory) -> None:
    await memory.set("a", 1)
    await memory.set_task_state(description="old")
    await memory.append_scratchpad("old note")
    await memory.create_checkpoint("first", checkpoint_id="cp")
    await memory.clear()
    await memory.set("b", 2)
    await memory.create_checkpoint("second", checkpoint_id="cp")
    await memory.set("a", "current")
    await memory.set_task_state(description="current")
    await memory.restore_checkpoint("cp")
    assert await memory.get_all() == {"b": 2}
    assert await memory.get_task_state() is None
    assert await memory.get_scratchpad() == []
    [info] = await memory.list_checkpoints()
    assert info["description"] == "second"


async def test_clear_keeps_checkpoints(memory: WorkingMemory) -> None:
    await memory.set("a", 1)
    await memory.set_task_state(description="t")
    await memory.append_scratchpad("s")
    checkpoint = await memory.create_checkpoint()
    assert await memory.clear() == 3
    assert await memory.clear() == 0
    assert [c["id"] for c in await memory.list_checkpoints()] == [checkpoint]


# Session state.


async def test_a_terminated_session_refuses_writes_but_allows_reads(
    harness: Harness, memory: WorkingMemory
) -> None:
    await memory.set("a", 1)
    await memory.set_task_state(description="t")
    checkpoint = await memory.create_checkpoint()
    await harness.set_state(memory, "terminated")
    writes: list[Callable[[], Awaitable[Any]]] = [
        lambda: memory.set("b", 2),
        lambda: memory.delete("a"),
        lambda: memory.clear(),
        lambda: memory.set_task_state(description="x"),
        lambda: memory.update_task_progress(progress_percent=5),
        lambda: memory.append_scratchpad("x"),
        lambda: memory.clear_scratchpad(),
        lambda: memory.create_checkpoint(),
        lambda: memory.restore_checkpoint(checkpoint),
        lambda: memory.delete_checkpoint(checkpoint),
    ]
    for write in writes:
        with pytest.raises(SessionTerminatedError, match="terminated"):
            await write()
    assert await memory.get_all() == {"a": 1}
    assert (await memory.get_stats())["state"] == "terminated"


async def test_a_paused_sessions_memory_refuses_writes_resume_would_undo(
    harness: Harness,
) -> None:
    # Resume restores the checkpoint over the variables: a write accepted while paused would
    # be lost without a word. It is refused, naming the state; reads and checkpoints still work.
    memory = await harness.open()
    await memory.set("a", 1)
    checkpoint = await memory.create_checkpoint()
    await harness.set_state(memory, "paused")
    writes: list[Callable[[], Awaitable[Any]]] = [
        lambda: memory.set("b", 2),
        lambda: memory.set("a", 3),
        lambda: memory.delete("a"),
        lambda: memory.clear(),
        lambda: memory.set_task_state(description="x"),
        lambda: memory.update_task_progress(progress_percent=5),
        lambda: memory.append_scratchpad("x"),
        lambda: memory.clear_scratchpad(),
        lambda: memory.restore_checkpoint(checkpoint),
    ]
    for write in writes:
        with pytest.raises(SessionPausedError, match=r"is paused; .* resume it first"):
            await write()
    assert await memory.get_all() == {"a": 1}
    assert await memory.create_checkpoint(checkpoint_id="while-paused") == "while-paused"
    await harness.set_state(memory, "active")
    await memory.set("b", 2)
    assert await memory.get_all() == {"a": 1, "b": 2}


# Task state.


async def test_task_progress_is_clamped_to_0_100(memory: WorkingMemory) -> None:
    await memory.set_task_state(description="work", total_steps=4, progress_percent=250)
    task = await memory.get_task_state()
    assert task is not None
    assert task.progress_percent == 100.0
    task = await memory.update_task_progress(progress_percent=-3)
    assert task.progress_percent == 0.0
    task = await memory.update_task_progress(2, 50.5, "in_progress")
    assert (task.current_step, task.progress_percent, task.status) == (2, 50.5, "in_progress")
    assert TaskState(progress_percent=40).progress_percent == 40.0


async def test_updating_progress_without_a_task_state_creates_one(memory: WorkingMemory) -> None:
    assert await memory.get_task_state() is None
    created = await memory.update_task_progress(current_step=1, progress_percent=33)
    assert (created.current_step, created.progress_percent) == (1, 33.0)
    assert (created.description, created.status, created.total_steps) == ("", "pending", 0)
    assert await memory.get_task_state() == created
    later = await memory.update_task_progress(status="in_progress")
    assert (later.current_step, later.progress_percent, later.status) == (1, 33.0, "in_progress")
    assert later.started_at == created.started_at
    stats = await memory.get_stats()
    assert stats["has_task_state"] is True


async def test_a_task_state_stored_with_the_old_progress_name_reads_as_progress_percent() -> None:
    stored = b'{"description": "old", "progress": 60, "status": "in_progress"}'
    assert TaskState.model_validate_json(stored).progress_percent == 60.0


async def test_a_task_update_changes_only_what_it_names(memory: WorkingMemory) -> None:
    original = await memory.set_task_state(
        description="write report",
        total_steps=3,
        data={"sources": [], "big": 2**63 + 1, "keep": {"nested": [1, {}]}},
    )
    await asyncio.sleep(0.01)
    updated = await memory.update_task_progress(
        current_step=1, status="in_progress", data={"sources": ["a"], "added": True}
    )
    assert updated.description == "write report"
    assert updated.total_steps == 3
    assert updated.started_at == original.started_at
    assert updated.updated_at > original.updated_at
    assert updated.data == {
        "sources": ["a"],
        "big": 2**63 + 1,
        "keep": {"nested": [1, {}]},
        "added": True,
    }
    again = await memory.update_task_progress(
        total_steps=5, description='new words "quoted" \\ {}', status="completed"
    )
    assert (again.total_steps, again.description, again.status) == (
        5,
        'new words "quoted" \\ {}',
        "completed",
    )
    assert again.data == updated.data
    assert await memory.get_task_state() == again


async def test_task_updates_are_validated(memory: WorkingMemory) -> None:
    await memory.set_task_state(description="t")
    with pytest.raises(ValueError, match="status"):
        await memory.update_task_progress(status="done")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="current_step"):
        await memory.update_task_progress(current_step=-1)


async def test_a_task_state_model_can_be_stored_as_is(memory: WorkingMemory) -> None:
    state = TaskState(description="m", current_step=1, total_steps=2, data={"x": [1]})
    stored = await memory.set_task_state(state)
    assert stored.description == "m"
    assert await memory.get_task_state() == stored


# Scratchpad and stats.


async def test_the_scratchpad_returns_the_newest_entries_oldest_first(
    memory: WorkingMemory,
) -> None:
    for n in range(5):
        await memory.append_scratchpad(f"note {n}")
    assert await memory.get_scratchpad(limit=2) == ["note 3", "note 4"]
    assert await memory.get_scratchpad(limit=0) == []
    entries = await memory.get_scratchpad_with_timestamps()
    assert [e["content"] for e in entries] == [f"note {n}" for n in range(5)]
    assert all(set(e) == {"content", "timestamp"} for e in entries)
    moments = [datetime.fromisoformat(e["timestamp"]) for e in entries]
    assert all(moment.utcoffset() == timedelta(0) for moment in moments)
    assert moments == sorted(moments)
    with pytest.raises(ValueError, match="limit"):
        await memory.get_scratchpad(limit=-1)
    assert await memory.clear_scratchpad() == 5
    assert await memory.get_scratchpad() == []


SEED_STATS_KEYS = (
    "scope_type",
    "scope_id",
    "using_fallback",
    "total_keys",
    "user_keys",
    "checkpoint_count",
    "scratchpad_entries",
    "has_task_state",
)


async def test_stats_count_everything_in_the_session(memory: WorkingMemory) -> None:
    await memory.set("a", "x" * 100)
    await memory.set("b", 2)
    await memory.append_scratchpad("s")
    await memory.set_task_state(description="t")
    await memory.create_checkpoint()
    stats = await memory.get_stats()
    assert {k: v for k, v in stats.items() if k in SEED_STATS_KEYS} == {
        "scope_type": "session",
        "scope_id": "s-1",
        "using_fallback": False,
        "total_keys": 5,  # 2 keys + task state + scratchpad + 1 checkpoint
        "user_keys": 2,
        "checkpoint_count": 1,
        "scratchpad_entries": 1,
        "has_task_state": True,
    }
    assert stats["approximate_bytes"] > 100
    assert stats["ttl_seconds"] is not None
    assert 0 < stats["ttl_seconds"] <= memory.settings.session_ttl_seconds
    assert (stats["project_id"], stats["session_id"]) == ("p-1", "s-1")


async def test_a_working_store_is_healthy(memory: WorkingMemory) -> None:
    assert await memory.is_healthy()


async def test_the_context_manager_closes_the_memory(harness: Harness) -> None:
    async with await harness.open() as memory:
        await memory.set("a", 1)
    if harness.kind == "memory":
        assert not await memory.is_healthy()


# Redis itself.


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_an_unreachable_redis_raises_redis_unavailable() -> None:
    port = closed_port()
    settings = Settings(redis_url=f"redis://127.0.0.1:{port}/0", stream_prefix="t-unreachable")
    async with await WorkingMemory.for_session("s", project_id="p", settings=settings) as memory:
        with pytest.raises(RedisUnavailableError, match=f"redis://127.0.0.1:{port}/0") as raised:
            await memory.get("a")
        assert "REDIS_URL" in str(raised.value)
        with pytest.raises(RedisUnavailableError):
            await memory.set("a", 1)
        assert not await memory.is_healthy()


@redis_only
async def test_close_closes_an_owned_client_only(harness: Harness, settings: Settings) -> None:
    owned = await WorkingMemory.for_session("s", project_id="p", settings=settings)
    await owned.set("a", 1)
    assert isinstance(owned.backend, RedisBackend)
    owned_id = await owned.backend.redis.client_id()
    await owned.close()
    assert harness.redis is not None

    async def disconnected() -> bool:
        assert harness.redis is not None
        return str(owned_id) not in {str(c["id"]) for c in await harness.redis.client_list()}

    await eventually(disconnected)

    borrowed = await harness.open("s", "p")
    await borrowed.close()
    assert await harness.redis.ping()  # type: ignore[misc]


@redis_only
async def test_memory_is_stored_in_the_workers_key_layout(
    harness: Harness, redis: Redis, settings: Settings
) -> None:
    memory = await harness.open("s-layout", "p-layout")
    await memory.set("answer", {"n": 42})
    await memory.set("brief", "x", ttl_seconds=60)
    await memory.set_task_state(description="t", current_step=1)
    await memory.append_scratchpad({"thought": "hm"})
    checkpoint = await memory.create_checkpoint("d")

    keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, "p-layout", "s-layout")
    assert orjson.loads(await redis.hget(keys.vars, "answer") or b"") == {"n": 42}  # type: ignore[misc]
    assert await redis.zscore(keys.vexp, "brief") is not None
    assert orjson.loads(await redis.get(keys.task) or b"")["current_step"] == 1
    [entry] = await redis.lrange(keys.scratch, 0, -1)  # type: ignore[misc]
    assert set(orjson.loads(entry)) == {"content", "timestamp"}
    assert await redis.zscore(keys.cps, checkpoint) is not None
    info = orjson.loads(await redis.hget(keys.cpdata, f"{checkpoint}|info") or b"")  # type: ignore[misc]
    assert info["checkpoint_id"] == checkpoint
    assert 0 < await redis.pttl(keys.vars) <= settings.session_ttl_seconds * 1000

    # The worker's own snapshot (the prelude's snapshot_json) sees the same data.
    snapshot_script = _read("_session.lua") + "\nbind_session(KEYS)\nreturn snapshot_json()"
    snapshot = orjson.loads(await redis.eval(snapshot_script, 7, *keys.all()))  # type: ignore[misc]
    assert snapshot["variables"] == {"answer": {"n": 42}, "brief": "x"}
    assert snapshot["task_state"]["description"] == "t"
    assert snapshot["scratchpad"][0]["content"] == {"thought": "hm"}
    assert snapshot["checkpoints"] == [checkpoint]


@redis_only
async def test_an_expired_key_is_removed_from_redis_not_just_hidden(
    harness: Harness, redis: Redis
) -> None:
    memory = await harness.open()
    await memory.set("gone", 1, ttl_seconds=0.1)
    await asyncio.sleep(0.2)
    assert await memory.list_keys() == []
    assert isinstance(memory.backend, RedisBackend)
    assert not await redis.hexists(memory.backend.keys.vars, "gone")  # type: ignore[misc]
    assert await redis.zcard(memory.backend.keys.vexp) == 0


async def test_a_client_with_decoded_responses_works_too(
    redis_url: str, settings: Settings
) -> None:
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        memory = await WorkingMemory.for_session(
            "s-decoded", project_id="p", redis=client, settings=settings
        )
        await memory.set("a", [1])
        await memory.append_scratchpad("n")
        await memory.set_task_state(description="d")
        checkpoint = await memory.create_checkpoint()
        assert await memory.get("a") == [1]
        assert await memory.list_keys() == ["a"]
        assert await memory.get_all() == {"a": [1]}
        assert await memory.get_scratchpad() == ["n"]
        assert await memory.get_task_state() is not None
        assert (await memory.update_task_progress(progress_percent=3)).progress_percent == 3
        assert [c["id"] for c in await memory.list_checkpoints()] == [checkpoint]
        assert (await memory.get_stats())["user_keys"] == 1
        await memory.close()
        assert await client.ping()  # type: ignore[misc]
    finally:
        for key in SessionKeys.for_session(
            settings.stream_prefix, settings.shards, "p", "s-decoded"
        ).all():
            await client.delete(key)
        await client.aclose()


# The opt-in fallback to process memory.


def unreachable(settings: Settings, **update: Any) -> Settings:
    """``settings`` pointing at a port nothing listens on."""
    return settings.model_copy(
        update={"redis_url": f"redis://127.0.0.1:{closed_port()}/0", **update}
    )


async def test_with_fallback_opted_in_an_unreachable_redis_runs_in_memory_with_one_warning(
    settings: Settings,
) -> None:
    nowhere = unreachable(settings)
    with structlog.testing.capture_logs() as logs:
        memory = await WorkingMemory.for_session(
            "s", "p", "agent-1", settings=nowhere, fallback_to_memory=True
        )
        await memory.set("a", 1, ttl_seconds=60)
        await memory.append_scratchpad("note")
        checkpoint = await memory.create_checkpoint("cp")
        await memory.restore_checkpoint(checkpoint)
        assert await memory.get("a") == 1
        stats = await memory.get_stats()
    assert memory.is_using_fallback
    assert (stats["using_fallback"], stats["backend"], stats["user_keys"]) == (True, "memory", 1)
    warnings = [line for line in logs if line["log_level"] == "warning"]
    assert [w["event"] for w in warnings] == ["working_memory_fallback"]
    assert nowhere.redis_url in warnings[0]["redis"]
    assert "this process only" in warnings[0]["detail"]


async def test_the_fallback_can_be_opted_in_by_setting_and_opted_out_per_call(
    settings: Settings,
) -> None:
    nowhere = unreachable(settings, memory_fallback=True)
    by_setting = await WorkingMemory.for_session("s", "p", settings=nowhere)
    assert by_setting.is_using_fallback
    refused = await WorkingMemory.for_session("s", "p", settings=nowhere, fallback_to_memory=False)
    assert not refused.is_using_fallback
    with pytest.raises(RedisUnavailableError, match="REDIS_URL"):
        await refused.set("a", 1)
    await refused.close()


async def test_without_the_opt_in_an_unreachable_redis_never_falls_back(
    settings: Settings,
) -> None:
    with structlog.testing.capture_logs() as logs:
        memory = await WorkingMemory.for_session("s", "p", settings=unreachable(settings))
        with pytest.raises(RedisUnavailableError):
            await memory.set("a", 1)
    assert not memory.is_using_fallback
    assert logs == []
    await memory.close()


async def test_with_fallback_opted_in_a_reachable_redis_is_used(
    settings: Settings, redis: Redis
) -> None:
    async with await WorkingMemory.for_session(
        "s-reachable", "p", settings=settings, fallback_to_memory=True
    ) as memory:
        await memory.set("a", 1)
        assert not memory.is_using_fallback
        assert (await memory.get_stats())["backend"] == "redis"
    keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, "p", "s-reachable")
    assert await redis.hexists(keys.vars, "a")  # type: ignore[misc]


async def test_a_fallen_back_session_stays_in_memory_and_a_redis_one_never_falls_back(
    settings: Settings, tmp_path: Path
) -> None:
    server = RedisProcess(tmp_path, persistent=False)
    later = settings.model_copy(update={"redis_url": server.url})
    fallen = await WorkingMemory.for_session("s", "p", settings=later, fallback_to_memory=True)
    assert fallen.is_using_fallback
    server.start()
    try:
        await fallen.set("a", "process only")  # Redis is up now: still in memory, not split
        client = Redis.from_url(server.url)
        try:
            assert await client.dbsize() == 0
            on_redis = await WorkingMemory.for_session(
                "s", "p", redis=client, settings=later, fallback_to_memory=True
            )
            assert not on_redis.is_using_fallback
            await on_redis.set("b", "in redis")
            server.stop()
            with pytest.raises(RedisUnavailableError):  # an outage later is an error, not a switch
                await on_redis.get("b")
            assert not on_redis.is_using_fallback
        finally:
            await client.aclose()
        assert await fallen.get_all() == {"a": "process only"}
    finally:
        server.stop()
