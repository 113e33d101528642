"""A write the master acknowledged and its replica never copied, lost in a failover.

The one loss Redis allows (asynchronous replication; docs/contract.md, "Failover"): forced
here by cutting the replica's link, publishing, killing the master with SIGKILL and promoting
the replica. memworker detects it (``publish(replicas=1)`` says so before the failover; after
it, the command's result never comes, and a later ``seq`` waits and is dead-lettered
``seq_gap``), and a republish with the same event id recovers it exactly once.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis as sync_redis

from tests.helpers import running_worker, wait_until
from tests.redis_process import free_port, server_binary
from worker.connections import client_for
from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient, NotReplicatedError, ResultTimeoutError
from worker.settings import Settings


def _server(port: int, data: Path, *extra: str) -> subprocess.Popen[bytes]:
    data.mkdir()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    return subprocess.Popen(
        [server_binary(), *args, "--dir", str(data), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except sync_redis.ConnectionError:
            pass
        time.sleep(0.05)
    raise AssertionError("condition not met")


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """A master and its replica, in sync: (the master's process, its port, the replica's)."""
    master, replica = free_port(), free_port()
    procs = [_server(master, tmp_path / "master")]
    procs.append(_server(replica, tmp_path / "replica", "--replicaof", "127.0.0.1", str(master)))
    try:
        link = sync_redis.Redis(host="127.0.0.1", port=replica)
        _until(lambda: link.info("replication")["master_link_status"] == "up")  # type: ignore[index]
        link.close()
        yield procs[0], master, replica
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _settings(port: int, prefix: str) -> Settings:
    return Settings(
        redis_url=f"redis://127.0.0.1:{port}/0",
        stream_prefix=prefix,
        seq_retry_ms=20,
        seq_gap_timeout_seconds=3,
        spawn_wait_seconds=1,
    )


def _pause(session: str, event_id: str, seq: int | None = None) -> dict[str, Any]:
    command: dict[str, Any] = {
        "type": "pause",
        "project_id": "p",
        "session_id": session,
        "agent_instance_id": "a",
        "event_id": event_id,
    }
    if seq is not None:
        command["seq"] = seq
    return command


def _resume(session: str, event_id: str, seq: int | None = None) -> dict[str, Any]:
    return {**_pause(session, event_id, seq), "type": "resume"}


async def test_a_write_lost_in_a_failover_is_detected_and_a_republish_recovers_it_once(
    pair: tuple[subprocess.Popen[bytes], int, int], prefix: str
) -> None:
    master_proc, master_port, replica_port = pair
    old = _settings(master_port, prefix)
    redis: Any = client_for(old)
    client = LifecycleClient(redis, old)
    # Three sessions, spawned and copied to the replica (WAIT says so).
    spawns = {s: await client.spawn("p", s, "a", {"n": s}) for s in ("s1", "s2", "s3")}
    async with running_worker(old):
        for event_id in spawns.values():
            assert (await client.wait(event_id, timeout=20)).type == "agent.spawned"
    await client.publish(_pause("s1", "ok-before-cut"), replicas=1, replicas_timeout=5)

    # The replica stops copying (its master is now a port nobody listens on): what the
    # master acknowledges from here on exists only there.
    replica = sync_redis.Redis(host="127.0.0.1", port=replica_port)
    replica.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # type: ignore[no-untyped-call]
    with pytest.raises(NotReplicatedError) as at_risk:
        await client.publish(_resume("s1", "lost-1"), replicas=1, replicas_timeout=0.3)
    assert at_risk.value.event_id == "lost-1" and at_risk.value.acknowledged == 0
    assert "republish it with the same event_id" in str(at_risk.value)
    # A producer keeping its own seq count: seq 2 is acknowledged, then lost.
    await client.publish(_pause("s2", "lost-2", seq=2), assign_seq=False)
    await client.publish(_pause("s3", "lost-3", seq=2), assign_seq=False)
    await redis.aclose()

    master_proc.kill()  # SIGKILL: no shutdown, no last sync
    master_proc.wait()
    replica.execute_command("REPLICAOF", "NO", "ONE")  # type: ignore[no-untyped-call]
    replica.close()

    new = _settings(replica_port, prefix)
    redis = client_for(new)
    client = LifecycleClient(redis, new)
    results_stream = StreamKeys(prefix, 0).results
    async with running_worker(new):
        # Detection 1: the command's result never comes (the command is gone).
        with pytest.raises(ResultTimeoutError):
            await client.wait("lost-1", timeout=1.5, project_id="p", session_id="s1")
        # Detection 2: a later seq waits for the lost one, then is dead-lettered seq_gap.
        await client.publish(_resume("s2", "after-2", seq=3), assign_seq=False)
        await client.publish(_resume("s3", "after-3", seq=3), assign_seq=False)
        await client.publish(_pause("s2", "lost-2", seq=2), assign_seq=False)  # recovered

        async def s3_dead_lettered() -> bool:
            rows = await redis.xrange(StreamKeys(prefix, 0).dlq)
            return any(b"after-3" in f[b"data"] for _i, f in rows)

        await wait_until(s3_dead_lettered, timeout=30)
        dead = [f for _i, f in await redis.xrange(StreamKeys(prefix, 0).dlq)]
        assert [f[b"reason"] for f in dead] == [b"seq_gap"]
        assert b"seq 2 of session p/s3" in dead[0][b"error"]

        # Recovery: republish with the same event id, twice (a retry): applied once.
        await client.publish(_resume("s1", "lost-1"))
        await client.publish(_resume("s1", "lost-1"))
        recovered = await client.wait("lost-1", timeout=20)
        assert recovered.type == "agent.resumed" and recovered.seq == 3
        assert (await client.wait("after-2", timeout=20)).type == "agent.resumed"
        # A command that was not lost, republished: no second effect, no second result.
        await client.publish(_pause("s1", "ok-before-cut"))
        rows = await redis.xrange(results_stream)
    results = [orjson.loads(f[b"data"]) for _i, f in rows]
    by_cause = Counter(r["causation_id"] for r in results)
    assert by_cause == Counter([*spawns.values(), "ok-before-cut", "lost-1", "lost-2", "after-2"])
    assert [r["causation_id"] for r in results if r["session_id"] == "s2"][1:] == [
        "lost-2",
        "after-2",
    ]
    assert [r for r in results if r["type"] == "command.rejected"] == []
    await redis.aclose()
