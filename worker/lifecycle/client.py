"""``LifecycleClient``: publish lifecycle commands and await their results.

Event ids are fresh UUIDs; ``seq`` is assigned per session by an INCR in Redis, so concurrent
publishers (in any number of processes) still give every command of a session its own place.
A publish retried after its connection was lost (``worker.connections``) takes no second seq:
the script keeps the seq of a session's last 4 event ids and a second run returns it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from schemas.limits import MAX_TRACEPARENT_BYTES
from schemas.results import RESULT_ADAPTER, Result
from schemas.words import COMMAND_TYPES
from worker.codec import json_bytes
from worker.connections import client_for
from worker.consumers.groups import ensure_group
from worker.ids import ID_PATTERN, validate_id, validate_write_id
from worker.keys import SessionKeys, StreamKeys, episodes_stream, tag
from worker.lifecycle.replication import NotReplicatedError, write_and_wait
from worker.redis_conditions import RedisConditionError, ServerCondition, conditions_raised
from worker.scripts import script
from worker.settings import Settings, get_settings

if TYPE_CHECKING:
    from schemas.streams import EpisodeRecorded

__all__ = [
    "ID_PATTERN",
    "LifecycleClient",
    "NotReplicatedError",
    "RedisConditionError",
    "ResultTimeoutError",
]


PUBLISH = script("publish_command.lua")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


MAX_LIVES = 100_000
"""Sessions a client remembers the spawn of (about 150 B each), the oldest forgotten first."""


class ResultTimeoutError(TimeoutError):
    """No result for the command arrived in time (is a lifecycle worker running?)."""


def seq_key(prefix: str, shard: int, project_id: str, session_id: str) -> str:
    return f"{prefix}:{tag(shard)}:seq:{project_id}/{session_id}"


def publish_records_key(prefix: str, shard: int, project_id: str, session_id: str) -> str:
    """The session's last publishes (event id digest and seq), beside its seq counter."""
    return seq_key(prefix, shard, project_id, session_id) + "/pub"


class LifecycleClient:
    """Publishes commands to ``P:lifecycle:{i}`` and reads results from ``P:results:{i}``."""

    def __init__(self, redis: Redis | None = None, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self._owns = redis is None
        self.redis = redis or client_for(self.settings)
        self._sent: dict[str, tuple[int, str]] = {}
        self._lives: dict[tuple[str, str], str] = {}
        """The spawn event_id of each session whose spawn this client saw applied (``wait``) and
        has not terminated (the newest ``MAX_LIVES``): stamped on its later commands as
        ``spawn_event_id``."""

    async def __aenter__(self) -> LifecycleClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the Redis connection, when this client opened it."""
        if self._owns:
            await self.redis.aclose()

    async def publish(
        self,
        command: Mapping[str, Any],
        *,
        assign_seq: bool = True,
        traceparent: str | None = None,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
    ) -> str:
        """Publish one command (a dict as in the contract); returns its ``event_id``.

        ``event_id`` is generated when absent, and ``seq`` assigned when absent and
        ``assign_seq`` is true. Raises ``RedisConditionError`` (nothing published) when Redis
        refuses for a reason of its own: full (``maxmemory``), busy, loading, failing over,
        unreachable; its message names the condition and what to do.

        ``replicas``: after publishing, ``WAIT`` until that many replicas of the stream's
        master copied the command, at most ``replicas_timeout`` seconds; fewer raises
        ``NotReplicatedError`` (the command *is* published; republish it with the same
        ``event_id`` if its master fails). 0 (the default) does not wait: a command the master
        acknowledged may then be lost in a failover (docs/contract.md, "Failover").
        """
        if replicas < 0 or replicas_timeout <= 0:
            raise ValueError("replicas must be 0 or more and replicas_timeout more than 0")
        body = dict(command)
        retried = "event_id" in body  # its result may be in the stream already
        kind = body.get("type")
        if body.get("type") not in COMMAND_TYPES:
            raise ValueError(f"type must be one of {', '.join(COMMAND_TYPES)}")
        project_id = validate_write_id(body.get("project_id", ""), "project_id")
        session_id = validate_write_id(body.get("session_id", ""), "session_id")
        if kind == "spawn" and body.get("user_id") is not None:
            validate_write_id(body["user_id"], "user_id")
        event_id = body.setdefault("event_id", str(uuid.uuid4()))
        validate_id(event_id, "event_id")
        if traceparent is not None and len(traceparent.encode()) > MAX_TRACEPARENT_BYTES:
            raise ValueError(
                f"traceparent is {len(traceparent.encode())} bytes, over the limit of "
                f"{MAX_TRACEPARENT_BYTES}"
            )
        life = (project_id, session_id)
        if kind == "spawn":  # known again once wait() sees it applied (it may be rejected)
            self._lives.pop(life, None)
        elif "spawn_event_id" not in body and life in self._lives:
            # The life it is for: a command meant for this spawn's session never touches a
            # later one of the same id (docs/contract.md, "spawn_event_id").
            body["spawn_event_id"] = (
                self._lives.pop(life) if kind == "terminate" else self._lives[life]
            )
        keys = SessionKeys.for_session(
            self.settings.stream_prefix, self.settings.shards, project_id, session_id
        )
        data = json_bytes(body, f"the {body['type']} command")  # NaN, Infinity: refused here
        async with conditions_raised(self.redis):
            acknowledged = await self._publish(
                body,
                data,
                keys,
                event_id,
                assign_seq,
                traceparent,
                retried,
                replicas,
                replicas_timeout,
            )
        if acknowledged < replicas:
            raise NotReplicatedError(str(event_id), replicas, acknowledged, replicas_timeout)
        return str(event_id)

    async def _publish(
        self,
        body: dict[str, Any],
        data: bytes,
        keys: SessionKeys,
        event_id: str,
        assign_seq: bool,
        traceparent: str | None,
        retried: bool,
        replicas: int = 0,
        replicas_timeout: float = 1.0,
    ) -> int:
        """Publish; returns how many replicas confirmed it (0 when ``replicas`` is 0)."""
        project_id, session_id = keys.project_id, keys.session_id
        streams = keys.streams
        # Where results could start, so wait() need not scan the whole stream; and whether the
        # lifecycle worker keeps the last memory for commands already accepted (admission,
        # advisory: read in the same round trip, no script).
        pipe = self.redis.pipeline(transaction=False)
        pipe.xinfo_stream(streams.results)
        pipe.get(streams.admission)
        info, refusal = await pipe.execute(raise_on_error=False)
        if isinstance(refusal, NoPermissionError):
            refusal = None  # an ACL from before admission: publish; Redis refuses at maxmemory
        elif isinstance(refusal, Exception):
            raise refusal
        if refusal:
            text = _text(refusal)
            raise RedisConditionError(text, ServerCondition("nearly_full", text))
        if isinstance(info, ResponseError):  # no results stream yet
            start = "0-0"
        elif isinstance(info, Exception):
            raise info
        else:
            start = _text(info["last-generated-id"])
        if assign_seq and "seq" not in body:
            settings = self.settings
            # After a terminate the counter is needed only as long as the tombstone is kept.
            tombstone = max(settings.tombstone_ttl_seconds, settings.dedupe_ttl_seconds)
            if body["type"] == "terminate":
                ttl_ms = tombstone * 1000
            else:
                ttl_ms = (settings.session_ttl_seconds + tombstone) * 1000
            script_keys = [
                seq_key(settings.stream_prefix, keys.shard, project_id, session_id),
                streams.lifecycle,
                publish_records_key(settings.stream_prefix, keys.shard, project_id, session_id),
            ]
            script_args: list[str | int | float | bytes] = [
                data,
                ttl_ms,
                traceparent or "",
                str(event_id),
            ]
            if replicas:
                _reply, acknowledged = await write_and_wait(
                    self.redis,
                    PUBLISH.command(script_keys, script_args),
                    streams.lifecycle,
                    replicas,
                    replicas_timeout,
                    PUBLISH.source,
                )
            else:
                await PUBLISH(self.redis, script_keys, script_args)
                acknowledged = 0
        else:
            fields: dict[str, bytes | str] = {"data": data}
            if traceparent:
                fields["traceparent"] = traceparent
            if replicas:
                flat = [part for pair in fields.items() for part in pair]
                _reply, acknowledged = await write_and_wait(
                    self.redis,
                    ["XADD", streams.lifecycle, "*", *flat],
                    streams.lifecycle,
                    replicas,
                    replicas_timeout,
                )
            else:
                await self.redis.xadd(streams.lifecycle, fields)  # type: ignore[arg-type]
                acknowledged = 0
        # A command published before with this event_id (a retry) was answered once, maybe
        # long ago: wait() then reads the results stream from its start, not from here.
        self._sent[event_id] = (keys.shard, "0-0" if retried else start)
        return acknowledged

    def _remember_life(self, project_id: str, session_id: str, spawn_event_id: str) -> None:
        self._lives.pop((project_id, session_id), None)
        self._lives[(project_id, session_id)] = spawn_event_id
        if len(self._lives) > MAX_LIVES:
            del self._lives[next(iter(self._lives))]

    async def spawn(
        self,
        project_id: str,
        session_id: str,
        agent_instance_id: str,
        initial_state: Mapping[str, Any] | None = None,
        *,
        user_id: str | None = None,
        **fields: Any,
    ) -> str:
        """Publish a spawn; ``user_id``: the user the session works for (its episode is
        that user's)."""
        if user_id is not None:
            fields["user_id"] = user_id
        return await self.publish(
            {
                "type": "spawn",
                "project_id": project_id,
                "session_id": session_id,
                "agent_instance_id": agent_instance_id,
                "initial_state": dict(initial_state or {}),
                **fields,
            }
        )

    async def pause(
        self, project_id: str, session_id: str, agent_instance_id: str, **fields: Any
    ) -> str:
        """Publish a pause (``checkpoint_id``, ``description`` in ``fields``); its ``event_id``."""
        return await self.publish(
            {
                "type": "pause",
                "project_id": project_id,
                "session_id": session_id,
                "agent_instance_id": agent_instance_id,
                **fields,
            }
        )

    async def resume(
        self, project_id: str, session_id: str, agent_instance_id: str, **fields: Any
    ) -> str:
        """Publish a resume (``checkpoint_id``: which one, else the newest); its ``event_id``."""
        return await self.publish(
            {
                "type": "resume",
                "project_id": project_id,
                "session_id": session_id,
                "agent_instance_id": agent_instance_id,
                **fields,
            }
        )

    async def terminate(
        self, project_id: str, session_id: str, agent_instance_id: str, **fields: Any
    ) -> str:
        """Publish a terminate (``outcome``, ``lessons_learned``, ``consolidate``, … in
        ``fields``); its ``event_id``."""
        return await self.publish(
            {
                "type": "terminate",
                "project_id": project_id,
                "session_id": session_id,
                "agent_instance_id": agent_instance_id,
                **fields,
            }
        )

    async def wait(
        self,
        event_id: str,
        timeout: float = 10.0,
        *,
        project_id: str | None = None,
        session_id: str | None = None,
    ) -> Result:
        """The result of a command published by this client (or name its session)."""
        if event_id in self._sent:
            shard, start = self._sent[event_id]
        elif project_id and session_id:
            shard = SessionKeys.for_session(
                self.settings.stream_prefix, self.settings.shards, project_id, session_id
            ).shard
            start = "0-0"
        else:
            raise ValueError("wait() needs project_id and session_id for a command it did not send")
        stream = StreamKeys(self.settings.stream_prefix, shard).results
        async with conditions_raised(self.redis):
            return await self._wait(event_id, timeout, stream, start)

    async def _wait(self, event_id: str, timeout: float, stream: str, start: str) -> Result:
        deadline = time.monotonic() + timeout
        last = start
        while (left := deadline - time.monotonic()) > 0:
            reply: Any = await self.redis.xread(
                {stream: last}, count=500, block=max(1, int(min(left, 1.0) * 1000))
            )
            for _stream, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id
                    data = fields.get(b"data")
                    if data and b'"causation_id":"' + event_id.encode() + b'"' in data:
                        result = RESULT_ADAPTER.validate_json(data)
                        if result.causation_id == event_id:
                            self._sent.pop(event_id, None)
                            project, session = result.project_id, result.session_id
                            if result.type == "agent.spawned" and project and session:
                                self._remember_life(project, session, event_id)
                            return result
        raise ResultTimeoutError(
            f"no result for event {event_id} within {timeout:g}s; is a lifecycle worker "
            "running against this Redis and stream prefix?"
        )

    async def follow(
        self,
        stream: str,
        group: str,
        consumer: str,
        *,
        block_ms: int = 1000,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Follow a stream in your own consumer group, resuming where the group left off.

        Yields (entry id, decoded ``data``) and acknowledges an entry when the next one is
        asked for, so a crash redelivers at most the entry in hand.
        """
        await ensure_group(self.redis, stream, group)
        last = "0"  # first what this consumer was given before and did not acknowledge
        while True:
            reply: Any = await self.redis.xreadgroup(
                group, consumer, {stream: last}, count=100, block=block_ms
            )
            entries = reply[0][1] if reply else []
            if not entries and last != ">":  # none (left) of its own: new entries from now on
                last = ">"
                continue
            for entry_id, fields in entries:
                data = fields.get(b"data") or b"{}"
                yield entry_id.decode(), orjson.loads(data)
                await self.redis.xack(stream, group, entry_id)
            if last != ">":
                last = entries[-1][0].decode()

    async def follow_results(
        self, group: str, consumer: str, shard: int = 0, *, block_ms: int = 1000
    ) -> AsyncIterator[tuple[str, Result]]:
        """Typed ``follow`` of ``P:results:{shard}``: yields (entry id, a ``schemas`` result)."""
        async for entry_id, data in self.follow(
            self.results_stream(shard), group, consumer, block_ms=block_ms
        ):
            yield entry_id, RESULT_ADAPTER.validate_python(data)

    async def follow_episodes(
        self, group: str, consumer: str, *, block_ms: int = 1000
    ) -> AsyncIterator[tuple[str, EpisodeRecorded]]:
        """Typed ``follow`` of ``P:episodes``: yields (entry id, ``EpisodeRecorded``)."""
        from schemas.streams import EpisodeRecorded

        async for entry_id, data in self.follow(
            self.episodes_stream(), group, consumer, block_ms=block_ms
        ):
            yield entry_id, EpisodeRecorded.model_validate(data)

    def results_stream(self, shard: int) -> str:
        """The name of shard ``shard``'s results stream (``P:results:{i}``)."""
        return StreamKeys(self.settings.stream_prefix, shard).results

    def episodes_stream(self) -> str:
        """The name of the episodes stream (``P:episodes``)."""
        return episodes_stream(self.settings.stream_prefix)
