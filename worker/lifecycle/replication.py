"""Publish a command and ``WAIT`` for replicas to copy it, on the same connection.

Redis replicates asynchronously: a write its master acknowledged is lost if the master dies
before a replica copied it and that replica is promoted (docs/contract.md, "Failover").
``WAIT numreplicas timeout`` blocks until the writes sent *on its connection* reached that
many replicas, so the write and the ``WAIT`` go down one connection in one pipeline: on a
cluster, to the node that owns the stream's hash slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError


class NotReplicatedError(RuntimeError):
    """The command was published, but fewer replicas than asked confirmed it in time.

    It may still be lost if its master fails now: republish it with the same ``event_id``
    (``.event_id``; a command already there or applied has no second effect) once Redis is
    back, or check its result with ``LifecycleClient.wait``. ``.acknowledged``: how many
    replicas confirmed it."""

    def __init__(self, event_id: str, asked: int, acknowledged: int, timeout: float) -> None:
        self.event_id = event_id
        self.asked = asked
        self.acknowledged = acknowledged
        super().__init__(
            f"command {event_id} was published, but {acknowledged} of the {asked} replica(s) "
            f"asked for confirmed it within {timeout:g}s; if its master fails now it may be "
            "lost: republish it with the same event_id (no second effect) or wait for its result"
        )


async def write_and_wait(
    redis: Redis | RedisCluster,
    command: Sequence[Any],
    key: str,
    replicas: int,
    timeout: float,
    script_source: str | None = None,
) -> tuple[Any, int]:
    """Run ``command`` (an EVALSHA of ``script_source`` or a plain write of ``key``), then
    ``WAIT replicas timeout`` on the same connection; returns its reply and the replicas
    that confirmed. A script the server does not know is loaded and the pair sent again (the
    script did not run)."""
    for attempt in range(2):
        pipe: Any = redis.pipeline(transaction=False)
        pipe.execute_command(*command)
        wait = ("WAIT", replicas, max(1, int(timeout * 1000)))
        node = redis.get_node_from_key(key) if isinstance(redis, RedisCluster) else None
        if node is not None:
            pipe.execute_command(*wait, target_nodes=node)
        else:
            pipe.execute_command(*wait)
        reply, acknowledged = await pipe.execute(raise_on_error=False)
        if isinstance(reply, NoScriptError) and script_source is not None and attempt == 0:
            # A replica promoted in a failover has no script cache: load it there (on a
            # cluster, SCRIPT LOAD to every master would fail on the dead one).
            if node is not None:
                await redis.execute_command("SCRIPT", "LOAD", script_source, target_nodes=node)
            else:
                await redis.script_load(script_source)
            continue
        if isinstance(reply, Exception):
            raise reply
        if isinstance(acknowledged, Exception):
            raise acknowledged
        return reply, int(acknowledged)
    raise AssertionError("unreachable")
