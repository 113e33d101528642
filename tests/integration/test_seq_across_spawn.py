"""Commands published ahead of their session's spawn, on real Redis with the worker running.

An orchestrator may publish a session's commands in any order, its spawn among them: a command
ahead of a spawn not published yet waits for it (``MEMWORKER_SPAWN_WAIT_SECONDS``), and is
answered ``unknown_session`` only when none came; no rejection strands the session's later
commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.helpers import (
    all_results,
    command,
    dead_letters,
    publish,
    running_worker,
    wait_until,
)
from worker.settings import Settings

SESSIONS = 300
SHARDS = 4


@pytest.fixture
def quick(settings: Settings) -> Settings:
    """Short windows so the test runs fast: a command waits 2 s for its spawn, 4 s for a gap."""
    return settings.model_copy(
        update={
            "shards": SHARDS,
            "seq_retry_ms": 20,
            "spawn_wait_seconds": 2.0,
            "seq_gap_timeout_seconds": 4.0,
        }
    )


def _session_commands(n: int) -> dict[int, dict[str, Any]]:
    session = f"ooo{n}"
    return {
        1: command("spawn", f"{session}-1", session=session, seq=1, initial_state={"n": n}),
        2: command("pause", f"{session}-2", session=session, seq=2),
        3: command("resume", f"{session}-3", session=session, seq=3),
        4: command("terminate", f"{session}-4", session=session, seq=4),
    }


async def _every_dead_letter(redis: Redis, settings: Settings) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for shard in range(settings.shards):
        out += await dead_letters(redis, settings, shard)
    return out


@pytest.mark.parametrize("workers", [1, 2])
async def test_commands_published_ahead_of_their_spawn_apply_once_in_seq_order(
    redis: Redis, quick: Settings, workers: int
) -> None:
    """300 sessions on 4 shards, each published terminate (4), pause (2), spawn (1), resume (3)
    while the worker (or two, sharing the group) reads: the pause is often read before its spawn
    is published. Every one of the 1,200 commands applies exactly once, in seq order; none is
    rejected unknown_session and none is dead-lettered seq_gap."""
    sessions = [_session_commands(n) for n in range(SESSIONS)]
    async with contextlib.AsyncExitStack() as running:
        for n in range(workers):
            await running.enter_async_context(running_worker(quick, consumer=f"w{n}"))
        # In waves, so the worker reads each wave's terminate and pause before its spawn and
        # resume are published (the race the orchestrator hit, every time).
        for start in range(0, SESSIONS, 50):
            wave = sessions[start : start + 50]
            for bodies in wave:
                await publish(redis, quick, bodies[4])
                await publish(redis, quick, bodies[2])
            await asyncio.sleep(0.3)
            for bodies in wave:
                await publish(redis, quick, bodies[1])
                await publish(redis, quick, bodies[3])

        async def answered() -> bool:
            return len(await all_results(redis, quick)) >= 4 * SESSIONS

        # Past the gap window: a stranded command would have been dead-lettered by then.
        await wait_until(answered, timeout=quick.seq_gap_timeout_seconds + 40)
        await asyncio.sleep(quick.seq_gap_timeout_seconds + 0.5)
    out = await all_results(redis, quick)
    assert len(out) == 4 * SESSIONS, "exactly one result per command"
    rejected = [(r["causation_id"], r["reason"]) for r in out if r["type"] == "command.rejected"]
    assert rejected == []
    assert await _every_dead_letter(redis, quick) == []
    by_session: dict[str, list[tuple[int, str]]] = {}
    for row in out:  # each shard's results are in the order they were applied
        by_session.setdefault(row["session_id"], []).append((row["seq"], row["type"]))
    expected = [
        (1, "agent.spawned"),
        (2, "agent.paused"),
        (3, "agent.resumed"),
        (4, "agent.terminated"),
    ]
    assert len(by_session) == SESSIONS
    assert all(applied == expected for applied in by_session.values())


async def test_a_command_for_a_session_that_never_spawns_is_answered_within_the_window(
    redis: Redis, quick: Settings
) -> None:
    """No spawn ever comes: the pause (seq 2) is answered unknown_session once the spawn wait
    passes, well before the seq-gap window would have dead-lettered it."""
    async with running_worker(quick):
        started = time.monotonic()
        await publish(redis, quick, command("pause", "never-2", session="never", seq=2))

        async def answered() -> bool:
            return len(await all_results(redis, quick)) >= 1

        await wait_until(answered, timeout=quick.seq_gap_timeout_seconds)
        took = time.monotonic() - started
    (row,) = await all_results(redis, quick)
    assert (row["type"], row["reason"]) == ("command.rejected", "unknown_session")
    assert "spawn it first" in row["detail"]
    assert took >= quick.spawn_wait_seconds * 0.9, "it waited for a spawn first"
    assert await _every_dead_letter(redis, quick) == []


async def test_a_rejection_before_the_spawn_does_not_strand_the_later_commands(
    redis: Redis, quick: Settings
) -> None:
    """The pause (seq 2) is answered unknown_session (its spawn came after the wait); the
    spawn (1) then applies, and the resume (3) and terminate (4) are answered, not left waiting
    for seq 2 until the gap window dead-letters them."""
    bodies = _session_commands(0)
    async with running_worker(quick):
        await publish(redis, quick, bodies[2])

        async def count_at_least(n: int) -> Any:
            async def check() -> bool:
                return len(await all_results(redis, quick)) >= n

            return check

        await wait_until(await count_at_least(1), timeout=quick.seq_gap_timeout_seconds)
        for seq in (1, 3, 4):
            await publish(redis, quick, bodies[seq])
        await wait_until(await count_at_least(4), timeout=quick.seq_gap_timeout_seconds)
    out = await all_results(redis, quick)
    assert [(r["seq"], r["type"], r.get("reason")) for r in out] == [
        (2, "command.rejected", "unknown_session"),
        (1, "agent.spawned", None),
        (3, "command.rejected", "invalid_transition"),  # the pause never happened
        (4, "agent.terminated", None),
    ]
    assert await _every_dead_letter(redis, quick) == []


@pytest.mark.parametrize("order", [(1, 2, 3), (1, 3, 2)])
async def test_a_command_for_an_earlier_life_does_not_strand_the_session_at_its_seq(
    redis: Redis, quick: Settings, order: tuple[int, ...]
) -> None:
    """A command of an earlier life of the session id took seq 2 from the shared counter: it is
    rejected stale_session, and the terminate at seq 3 still applies, whichever comes first."""
    bodies = {
        1: command("spawn", "life2-1", session="reused", seq=1),
        2: command("pause", "life1-late", session="reused", seq=2, spawn_event_id="life1-spawn"),
        3: command("terminate", "life2-3", session="reused", seq=3),
    }
    async with running_worker(quick):
        for seq in order:
            await publish(redis, quick, bodies[seq])

        async def answered() -> bool:
            return len(await all_results(redis, quick)) >= 3

        await wait_until(answered, timeout=quick.seq_gap_timeout_seconds)
    out = {r["seq"]: (r["type"], r.get("reason")) for r in await all_results(redis, quick)}
    assert out == {
        1: ("agent.spawned", None),
        2: ("command.rejected", "stale_session"),
        3: ("agent.terminated", None),
    }
    assert await _every_dead_letter(redis, quick) == []
