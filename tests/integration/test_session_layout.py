"""The steady-state session layout: dedupe records kept with their session, folded into a
compact tombstone at terminate, still deduping, still answering late commands, per project."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from tests.helpers import command, publish, results, running_worker, stream_len_at_least
from worker.keys import SessionKeys, StreamKeys
from worker.lifecycle.result_ids import result_id_and_record
from worker.settings import Settings

FINISHED_SESSION_BYTES = 160
"""The key layout (docs/concepts/working-memory.md): `MEMORY USAGE` of what a finished session
(short ids like these) keeps."""


async def run(redis: Redis, settings: Settings, bodies: list[Any], total: int) -> list[Any]:
    """Publish bodies, run the worker until ``total`` results exist; every result so far."""
    for body in bodies:
        await publish(redis, settings, body)
    async with running_worker(settings):
        await stream_len_at_least(redis, StreamKeys(settings.stream_prefix, 0).results, total)
        await asyncio.sleep(0.2)  # a second result, if one were coming, would show up
    return await results(redis, settings)


LIFECYCLE_RESULTS = ["agent.spawned", "agent.paused", "agent.resumed", "agent.terminated"]
"""The result types of ``lifecycle()``, in order."""


def lifecycle(project: str = "p1", session: str = "s1") -> list[dict[str, Any]]:
    return [
        command("spawn", "e-spawn", session, project, initial_state={"a": 1, "b": "two"}),
        command("pause", "e-pause", session, project),
        command("resume", "e-resume", session, project),
        command("terminate", "e-term", session, project, outcome="success"),
    ]


async def test_an_event_id_republished_after_its_sessions_terminate_has_no_second_effect(
    redis: Redis, settings: Settings
) -> None:
    first = await run(redis, settings, lifecycle(), 4)
    assert [r["type"] for r in first] == LIFECYCLE_RESULTS
    # The orchestrator republishes the whole session: no command applies again (the spawn
    # does not bring the session back), and no second result appears.
    again = await run(redis, settings, lifecycle(), 4)
    assert again == first
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "s1")
    assert await redis.hget(keys.meta, "state") == b"terminated"  # type: ignore[misc]
    assert not await redis.exists(keys.vars)


async def test_a_late_command_to_a_terminated_session_is_answered_already_terminated(
    redis: Redis, settings: Settings
) -> None:
    late = [
        command("pause", "late-pause"),
        command("spawn", "late-spawn"),
        command("resume", "late-resume", seq=9),
    ]
    out = await run(redis, settings, [*lifecycle(), *late], 7)
    assert [(r["command"], r.get("reason")) for r in out[4:]] == [
        ("pause", "already_terminated"),
        ("spawn", "already_terminated"),
        ("resume", "already_terminated"),
    ]


async def test_spawning_a_terminated_session_with_seq_is_answered_already_terminated_first_time(
    redis: Redis, settings: Settings
) -> None:
    """LifecycleClient restarts seq at 1 for a spawn: the answer is already_terminated, not a
    stale_seq whose advice (publish with seq 3) would only lead to already_terminated."""
    bodies = [
        command("spawn", "q-1", seq=1),
        command("terminate", "q-2", seq=2),
        command("spawn", "q-3", seq=1),
    ]
    out = await run(redis, settings, bodies, 3)
    assert out[2]["reason"] == "already_terminated"
    assert "spawn a new session_id" in out[2]["detail"]


async def test_identical_event_ids_in_two_projects_never_collide(
    redis: Redis, settings: Settings
) -> None:
    # alpha: the pause comes before any spawn (rejected, recorded outside any session);
    # beta: the same event_ids, a whole lifecycle.
    bodies = [command("pause", "e-pause", "s1", "alpha"), *lifecycle("beta")]
    out = await run(redis, settings, bodies, 5)
    assert [(r["project_id"], r["type"]) for r in out] == [
        ("alpha", "command.rejected"),
        ("beta", "agent.spawned"),
        ("beta", "agent.paused"),
        ("beta", "agent.resumed"),
        ("beta", "agent.terminated"),
    ]
    # alpha now spawns s1 and republishes its pause: its own record makes it a duplicate,
    # while beta's records of the same event_ids play no part.
    bodies = [
        command("spawn", "e-spawn", "s1", "alpha"),
        command("pause", "e-pause", "s1", "alpha"),
    ]
    out = await run(redis, settings, bodies, 6)
    assert [(r["project_id"], r["type"]) for r in out[5:]] == [("alpha", "agent.spawned")]
    alpha = SessionKeys.for_session(settings.stream_prefix, 1, "alpha", "s1")
    assert await redis.hget(alpha.meta, "state") == b"active"  # type: ignore[misc]


async def test_a_finished_session_leaves_one_small_key_once_streams_are_trimmed(
    redis: Redis, settings: Settings
) -> None:
    await run(redis, settings, lifecycle(), 4)
    streams = StreamKeys(settings.stream_prefix, 0)
    await redis.delete(streams.lifecycle, streams.results, streams.dlq)
    left = [k async for k in redis.scan_iter(match=f"{settings.stream_prefix}:*")]
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "s1")
    assert left == [keys.meta.encode()]
    used = await redis.memory_usage(keys.meta, samples=0)
    assert used is not None and used <= FINISHED_SESSION_BYTES, used
    window = max(settings.tombstone_ttl_seconds, settings.dedupe_ttl_seconds) * 1000
    assert 0 < await redis.pttl(keys.meta) <= window


async def test_a_long_sessions_packed_tombstone_and_a_late_commands_record_still_dedupe(
    redis: Redis, settings: Settings
) -> None:
    bodies = [command("spawn", "l-0")]
    for n in range(1, 6):
        bodies += [command("pause", f"l-p{n}"), command("resume", f"l-r{n}")]
    bodies.append(command("terminate", "l-end"))
    late = command("pause", "l-late")
    first = await run(redis, settings, [*bodies, late], 13)
    assert first[-1]["reason"] == "already_terminated"
    again = await run(redis, settings, [*bodies, late], 13)
    assert again == first


async def test_records_an_earlier_version_kept_as_fields_still_dedupe_through_terminate(
    redis: Redis, settings: Settings
) -> None:
    """Earlier versions kept each record as a field of its own (`@` + digest, empty value), not
    packed into `@`: a session they wrote to must still answer those commands as duplicates,
    live and once terminated (its tombstone packs them too)."""
    await run(redis, settings, lifecycle()[:2], 2)  # spawn, pause
    keys = SessionKeys.for_session(settings.stream_prefix, 1, "p1", "s1")
    await redis.hdel(keys.meta, "@")  # type: ignore[misc]  # as an earlier version left it
    for event_id in ("e-spawn", "e-pause"):
        await redis.hset(keys.meta, result_id_and_record("p1", event_id)[1], b"")  # type: ignore[misc, arg-type]
    first = await run(redis, settings, lifecycle(), 4)  # spawn and pause are duplicates
    assert [r["type"] for r in first] == LIFECYCLE_RESULTS
    again = await run(redis, settings, lifecycle(), 4)
    assert again == first
    tombstone = await redis.hgetall(keys.meta)  # type: ignore[misc]
    assert set(tombstone) == {b"state", b"@"}
    assert len(tombstone[b"@"]) == 4 * 8  # the four commands' digests
