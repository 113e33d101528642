"""LifecycleClient, the CLI and the generated documents, against real servers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.helpers import running_worker, worker_env
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient, ResultTimeoutError
from worker.ops.spec import EVENT_MODELS, asyncapi_document
from worker.settings import Settings


def memworker(
    settings: Settings, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=worker_env(settings, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


async def test_client_assigns_seq_per_session_and_waits_for_results(
    redis: Redis, settings: Settings
) -> None:
    async with running_worker(settings):
        client = LifecycleClient(redis, settings)
        spawn = await client.spawn("p", "s1", "a1", {"goal": "x"})
        pause = await client.pause("p", "s1", "a1")
        other = await client.spawn("p", "s2", "a1")
        spawned = await client.wait(spawn, timeout=10)
        paused = await client.wait(pause, timeout=10)
        assert spawned.type == "agent.spawned" and spawned.seq == 1
        assert paused.type == "agent.paused" and paused.seq == 2
        assert (await client.wait(other, timeout=10)).seq == 1


async def test_concurrent_publishers_keep_one_order_per_session(
    redis: Redis, settings: Settings
) -> None:
    clients = [LifecycleClient(redis, settings) for _ in range(4)]
    await clients[0].spawn("p", "busy", "a")
    sends = []
    for i in range(40):
        kind = "pause" if i % 2 == 0 else "resume"
        sends.append(
            clients[i % 4].publish(
                {"type": kind, "project_id": "p", "session_id": "busy", "agent_instance_id": "a"}
            )
        )
    await asyncio.gather(*sends)
    stream = StreamKeys(settings.stream_prefix, 0).lifecycle
    rows: Any = await redis.xrange(stream)
    seqs = sorted(json.loads(f[b"data"])["seq"] for _i, f in rows)
    assert seqs == list(range(1, 42)), "every command got its own seq, none shared or skipped"


async def test_waiting_for_a_result_that_never_comes_says_why(
    redis: Redis, settings: Settings
) -> None:
    client = LifecycleClient(redis, settings)
    sent = await client.spawn("p", "s1", "a")
    with pytest.raises(ResultTimeoutError, match="is a lifecycle worker running"):
        await client.wait(sent, timeout=0.3)


async def test_follow_resumes_where_the_subscriber_group_left_off(
    redis: Redis, settings: Settings
) -> None:
    client = LifecycleClient(redis, settings)
    stream = client.results_stream(0)
    for i in range(3):
        await redis.xadd(stream, {"data": json.dumps({"n": i})})
    seen = []
    async for _entry_id, data in client.follow(stream, "mine", "c1", block_ms=100):
        seen.append(data["n"])
        if len(seen) == 2:
            break
    await redis.xadd(stream, {"data": json.dumps({"n": 3})})

    async def restarted() -> None:
        async for _entry_id, data in client.follow(stream, "mine", "c1", block_ms=100):
            seen.append(data["n"])
            if len(seen) == 5:
                await redis.xadd(stream, {"data": json.dumps({"n": 4})})
            if len(seen) == 6:
                break

    await asyncio.wait_for(restarted(), timeout=10)
    # The entries it was given and did not acknowledge come again (1, the entry in hand, and
    # 2, read in the same batch), then what it had not read yet, then what comes later.
    assert seen == [0, 1, 1, 2, 3, 4]
    pending: Any = await redis.xpending(stream, "mine")
    assert pending["pending"] == 1  # only the entry in hand


async def test_cli_publish_wait_prints_the_result(redis: Redis, settings: Settings) -> None:
    async with running_worker(settings):
        done = await asyncio.to_thread(
            memworker,
            settings,
            "publish",
            "spawn",
            "-p",
            "demo",
            "-s",
            "s1",
            "--state",
            '{"goal": "hello"}',
            "--wait",
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["type"] == "agent.spawned"
    assert result["initial_items"] == 1


async def test_cli_publish_retried_with_its_event_id_and_wait_prints_the_first_result(
    redis: Redis, settings: Settings
) -> None:
    # The retry is a duplicate (no second result): --wait finds the first one at once
    # instead of timing out after --timeout.
    publish = ["publish", "spawn", "-p", "demo", "-s", "s9", "--event-id", "retry-1", "--wait"]
    async with running_worker(settings):
        first = await asyncio.to_thread(memworker, settings, *publish)
        again = await asyncio.to_thread(memworker, settings, *publish, "--timeout", "5")
    assert first.returncode == 0, first.stderr
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout)
    assert await redis.xlen(StreamKeys(settings.stream_prefix, 0).results) == 1


@pytest.mark.parametrize(
    ("args", "status", "message"),
    [
        (["publish", "explode", "-p", "p", "-s", "s"], 2, "must be spawn"),
        (["publish", "spawn", "-p", "bad id", "-s", "s"], 2, "project_id"),
        (["publish", "spawn", "-p", "p", "-s", "s", "--state", "{nope"], 2, "not JSON"),
        (["inspect", "-p", "p", "-s", "nobody"], 1, "no session p/nobody"),
        (["dlq", "purge"], 2, "--yes"),
        (["tail", "nowhere"], 2, "results, episodes"),
    ],
)
async def test_cli_errors_are_one_clear_line_and_the_right_exit_status(
    redis: Redis, settings: Settings, args: list[str], status: int, message: str
) -> None:
    done = await asyncio.to_thread(memworker, settings, *args)
    assert done.returncode == status
    assert message in done.stderr


async def test_cli_reports_an_unreachable_redis_in_one_line(settings: Settings) -> None:
    dead = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    done = await asyncio.to_thread(memworker, dead, "stats")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach Redis at redis://127.0.0.1:1/0" in lines[0]


async def test_cli_inspect_stats_and_dlq_show_what_is_stored(
    redis: Redis, settings: Settings
) -> None:
    async with running_worker(settings):
        client = LifecycleClient(redis, settings)
        await client.wait(await client.spawn("p", "s1", "a", {"k": [1, 2]}), timeout=10)
        await redis.xadd(StreamKeys(settings.stream_prefix, 0).lifecycle, {"data": b"junk"})

        async def dead() -> bool:
            return bool(await redis.xlen(StreamKeys(settings.stream_prefix, 0).dlq))

        while not await dead():
            await asyncio.sleep(0.05)
    view = await asyncio.to_thread(memworker, settings, "inspect", "-p", "p", "-s", "s1")
    assert view.returncode == 0, view.stderr
    assert json.loads(view.stdout)["variables"] == {"k": [1, 2]}
    stats = await asyncio.to_thread(memworker, settings, "stats", "--json")
    rows = {(r["stream"], r["group"]): r for r in json.loads(stats.stdout)["streams"]}
    lifecycle = rows[(StreamKeys(settings.stream_prefix, 0).lifecycle, "lifecycle")]
    assert lifecycle["length"] == 2 and lifecycle["pending"] == 0 and lifecycle["lag"] == 0
    listed = await asyncio.to_thread(memworker, settings, "dlq", "list", "--json")
    letters = json.loads(listed.stdout)
    assert [d["reason"] for d in letters] == ["unparseable"]
    redriven = await asyncio.to_thread(memworker, settings, "dlq", "redrive")
    assert "redriven: 1" in redriven.stdout
    assert await redis.xlen(StreamKeys(settings.stream_prefix, 0).dlq) == 0
    assert await redis.xlen(StreamKeys(settings.stream_prefix, 0).lifecycle) == 3


async def test_replaying_lifecycle_commands_twice_changes_nothing(
    redis: Redis, settings: Settings
) -> None:
    async with running_worker(settings):
        client = LifecycleClient(redis, settings)
        for s in ("s1", "s2"):
            await client.wait(await client.spawn("p", s, "a"), timeout=10)
    before = await redis.xlen(StreamKeys(settings.stream_prefix, 0).results)
    for _ in range(2):
        done = await asyncio.to_thread(memworker, settings, "replay", "lifecycle")
        assert done.returncode == 0, done.stderr
        assert "duplicate=2" in done.stdout
    assert await redis.xlen(StreamKeys(settings.stream_prefix, 0).results) == before


def test_schema_writes_a_json_schema_per_event_and_an_asyncapi_document(
    tmp_path: Path, settings: Settings
) -> None:
    done = memworker(settings, "schema", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for name in EVENT_MODELS:
        schema = json.loads((tmp_path / f"{name}.schema.json").read_text())
        assert schema["type"] == "object"
    assert json.loads((tmp_path / "asyncapi.json").read_text())["asyncapi"] == "3.0.0"


def test_the_asyncapi_document_validates_and_lists_every_stream_and_message(
    settings: Settings,
) -> None:
    from faststream.specification.asyncapi.v3_0_0.schema import ApplicationSchema

    document = asyncapi_document(settings)
    ApplicationSchema.model_validate(document)
    addresses = {c["address"] for c in document["channels"].values()}
    streams = StreamKeys(settings.stream_prefix, 0)
    assert {
        streams.lifecycle,
        streams.results,
        streams.dlq,
        f"{settings.stream_prefix}:episodes",
    } <= addresses
    schemas = document["components"]["schemas"]
    for model in (
        "SpawnCommand",
        "PauseCommand",
        "ResumeCommand",
        "TerminateCommand",
        "AgentSpawned",
        "AgentPaused",
        "AgentResumed",
        "AgentTerminated",
        "CommandRejected",
        "DeadLetter",
        "EpisodeRecorded",
    ):
        assert model in schemas, model


async def test_typed_followers_yield_result_and_episode_models(
    redis: Redis, settings: Settings
) -> None:
    from schemas.results import AgentSpawned
    from schemas.streams import EpisodeRecorded

    async with running_worker(settings):
        client = LifecycleClient(redis, settings)
        await client.wait(await client.spawn("p", "s1", "a"), timeout=10)
    async for _entry_id, result in client.follow_results("audit", "me", block_ms=100):
        assert isinstance(result, AgentSpawned)
        assert result.session_id == "s1"
        break
    event = EpisodeRecorded(
        event_id="e", episode_id="x", project_id="p", session_id="s1", causation_id="c"
    )
    await redis.xadd(client.episodes_stream(), {"data": event.model_dump_json()})
    async for _entry_id, episode in client.follow_episodes("audit", "me", block_ms=100):
        assert episode == event
        break


async def test_a_refused_publish_takes_no_seq_and_a_spawn_goes_on_with_the_count(
    redis: Redis, settings: Settings
) -> None:
    """The seq is taken in the same script that XADDs the command, so a publish that does not
    happen never leaves a gap that would stall the session. A spawn takes the next number too
    (a spawn of a live session is rejected at it; one of a new life starts the session at it),
    so the counter never falls behind the session's seq."""
    client = LifecycleClient(redis, settings)
    await client.spawn("p", "s1", "a")
    with pytest.raises(ValueError, match="type"):
        await client.publish(
            {"type": "explode", "project_id": "p", "session_id": "s1", "agent_instance_id": "a"}
        )
    await client.pause("p", "s1", "a")
    await client.spawn("p", "s1", "a")  # the same session id spawned again
    rows: Any = await redis.xrange(StreamKeys(settings.stream_prefix, 0).lifecycle)
    assert [json.loads(f[b"data"])["seq"] for _i, f in rows] == [1, 2, 3]


async def test_a_checkpoint_id_has_one_name_in_inspect_results_and_list_checkpoints(
    redis: Redis, settings: Settings
) -> None:
    from worker.memory import WorkingMemory

    async with running_worker(settings):
        client = LifecycleClient(redis, settings)
        await client.wait(await client.spawn("p", "cp", "a", {"k": 1}), timeout=10)
        paused: Any = await client.wait(await client.pause("p", "cp", "a"), timeout=10)
        await client.wait(await client.resume("p", "cp", "a"), timeout=10)
    memory = await WorkingMemory.for_session("cp", "p", redis=redis, settings=settings)
    made = await memory.create_checkpoint("by hand")
    listed = await memory.list_checkpoints()

    view = await asyncio.to_thread(memworker, settings, "inspect", "-p", "p", "-s", "cp")
    assert view.returncode == 0, view.stderr
    shown = json.loads(view.stdout)["checkpoints"]
    # The name results and `tail` use, and resume's parameter: in inspect, for every
    # checkpoint, and in list_checkpoints beside the seed API's `id`.
    assert [c["checkpoint_id"] for c in shown] == [paused.checkpoint_id, made]
    assert [c["checkpoint_id"] for c in listed] == [c["id"] for c in listed]
    assert [c["checkpoint_id"] for c in listed] == [paused.checkpoint_id, made]
    assert all(set(c) == {"checkpoint_id", "description", "created_at", "items"} for c in shown)
    assert [c["description"] for c in shown] == [c["description"] for c in listed]


async def test_cli_publish_user_and_recall_user_find_only_that_users_episode(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    from tests.integration.results_factory import migrated_engine
    from worker.consolidation.consolidator import Consolidator

    settings = settings.model_copy(update={"database_url": database_url})

    def publish(kind: str, session: str, *extra: str) -> dict[str, Any]:
        done = memworker(settings, "publish", kind, "-p", "demo", "-s", session, *extra, "--wait")
        assert done.returncode == 0, done.stderr
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    task = "task_description=Summarise the quarterly sales report"
    async with running_worker(settings):
        spawned = await asyncio.to_thread(publish, "spawn", "s-ann", "--user", "ann")
        other = await asyncio.to_thread(publish, "spawn", "s-ben", "--user", "ben")
        ended = await asyncio.to_thread(publish, "terminate", "s-ann", "--set", task)
        await asyncio.to_thread(publish, "terminate", "s-ben", "--set", task)
    assert spawned["user_id"] == "ann" and other["user_id"] == "ben"
    assert ended["type"] == "agent.terminated" and ended["user_id"] == "ann"
    async with migrated_engine(database_url) as engine:
        await Consolidator(settings, redis, engine).run_once()

    def recall(*extra: str) -> list[dict[str, Any]]:
        done = memworker(settings, "recall", "quarterly sales", "-p", "demo", "--json", *extra)
        assert done.returncode == 0, done.stderr
        hits: list[dict[str, Any]] = json.loads(done.stdout)
        return hits

    assert [(h["session_id"], h["user_id"]) for h in recall("--user", "ann")] == [("s-ann", "ann")]
    assert recall("--user", "cat") == []
    assert len(recall()) == 2
    bad = memworker(settings, "publish", "spawn", "-p", "demo", "-s", "s-x", "--user", "no way")
    assert bad.returncode == 2 and "user_id" in bad.stderr
