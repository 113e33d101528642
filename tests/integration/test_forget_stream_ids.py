"""A forget matches stream entries as the worker read them, whatever their bytes or ids.

A command whose ``project_id`` is JSON-escaped (``"\\u0065sc"``) is applied as project ``esc``:
forgetting ``esc`` (or its user) takes its entry. A stream whose ids ran past the clock (one
XADD given a future id makes Redis give every later entry an id past it) keeps nothing of a
forgotten user or project either.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from tests.helpers import running_worker
from tests.integration.test_client_and_cli import memworker
from tests.integration.test_forget import live
from worker.erasure.erased import entry_scope
from worker.keys import StreamKeys, is_dlq_stream, shard_of
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings

__all__ = ["live"]


async def _of_project(redis: Redis, prefix: str, project: str) -> list[tuple[str, str]]:
    """(stream, id) of every entry under the prefix that names the project as the worker reads
    it (parsed), but the ``memory.forgotten`` events and ``forgotten`` rejections kept."""
    found = []
    async for raw in redis.scan_iter(match=f"{prefix}:*", _type="stream"):
        for entry_id, fields in await redis.xrange(raw):
            data = fields.get(b"data", b"")
            if b"memory.forgotten" in data or b'"reason":"forgotten"' in data:
                continue
            letter = is_dlq_stream(prefix, raw.decode())
            if entry_scope(fields, dead_letter=letter)[0] == project:
                found.append((raw.decode(), entry_id.decode()))
    return found


async def _forget(settings: Settings, *args: str) -> None:
    done = await asyncio.to_thread(memworker, settings, "forget", *args, "--yes")
    assert done.returncode == 0, done.stderr


async def test_forget_takes_a_command_whose_project_id_is_escaped(
    redis: Redis, live: Settings
) -> None:
    prefix = live.stream_prefix
    client = LifecycleClient(redis, live)
    async with running_worker(live):
        for n, user in ((1, ',"user_id":"gdpr2"'), (2, "")):
            session = f"e{n}"
            stream = StreamKeys(prefix, shard_of("esc", session, live.shards)).lifecycle
            data = (
                f'{{"event_id":"ev-{n}","type":"spawn","project_id":"\\u0065sc",'
                f'"session_id":"{session}","agent_instance_id":"a"{user}}}'
            )
            await redis.xadd(stream, {"data": data})
            result = await client.wait(f"ev-{n}", project_id="esc", session_id=session)
            assert result.type == "agent.spawned" and result.project_id == "esc"
        escaped = await _of_project(redis, prefix, "esc")
        assert sum(":lifecycle:" in s for s, _ in escaped) == 2

        await _forget(live, "-p", "esc", "-u", "gdpr2")
        left = await _of_project(redis, prefix, "esc")
        assert sum(":lifecycle:" in s for s, _ in left) == 1, left  # e2's: of no user

        await _forget(live, "-p", "esc")
        assert await _of_project(redis, prefix, "esc") == []


async def test_forget_takes_entries_whose_ids_ran_past_the_clock(
    redis: Redis, live: Settings
) -> None:
    prefix = live.stream_prefix
    sessions = [s for s in (f"c{n}" for n in range(50)) if shard_of("fp", s, live.shards) == 0]
    stream = StreamKeys(prefix, 0).lifecycle
    async with running_worker(live):
        await redis.xadd(stream, {"data": '{"junk":1}'}, id="9999999999999-0")
        client = LifecycleClient(redis, live)
        for session, user in zip(sessions[:2], ("carl", None), strict=True):
            sent = await client.spawn("fp", session, "a", {"note": "n"}, user_id=user)
            assert (await client.wait(sent)).type == "agent.spawned"
            sent = await client.pause("fp", session, "a", description="d")
            assert (await client.wait(sent)).type == "agent.paused"
        ahead = [i for s, i in await _of_project(redis, prefix, "fp") if s == stream]
        assert len(ahead) == 4 and all(i.startswith("9999999999999-") for i in ahead)

        await _forget(live, "-p", "fp", "-u", "carl")
        left = [i for s, i in await _of_project(redis, prefix, "fp") if s == stream]
        assert len(left) == 2, left  # the session of no user's spawn and pause

        await _forget(live, "-p", "fp")
        assert await _of_project(redis, prefix, "fp") == []
