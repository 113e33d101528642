"""Read-only views for operators: stream statistics and one session's working memory."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from worker.keys import SessionKeys, StreamKeys, episodes_stream
from worker.settings import Settings


@dataclass(frozen=True, slots=True)
class GroupStats:
    stream: str
    length: int
    group: str | None
    lag: int | None
    pending: int
    oldest_pending_age_s: float | None
    consumers: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _id_ms(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


async def stream_stats(redis: Redis, settings: Settings) -> list[GroupStats]:
    """Length, lag, pending, oldest pending age and consumers of every stream and group."""
    names: list[str] = []
    for shard in range(settings.shards):
        streams = StreamKeys(settings.stream_prefix, shard)
        names += [streams.lifecycle, streams.results, streams.dlq]
    names.append(episodes_stream(settings.stream_prefix))
    now_ms = time.time() * 1000
    rows: list[GroupStats] = []
    for name in names:
        length = int(await redis.xlen(name))
        try:
            groups = await redis.xinfo_groups(name)
        except ResponseError:
            groups = []
        if not groups:
            rows.append(GroupStats(name, length, None, None, 0, None, 0))
            continue
        for group in groups:
            group_name = (
                group["name"].decode() if isinstance(group["name"], bytes) else group["name"]
            )
            pending = int(group["pending"])
            oldest = None
            if pending:
                summary = await redis.xpending(name, group_name)
                if summary["min"]:
                    oldest = max(0.0, (now_ms - _id_ms(summary["min"])) / 1000)
            lag = group.get("lag")
            rows.append(
                GroupStats(
                    name,
                    length,
                    group_name,
                    int(lag) if lag is not None else None,
                    pending,
                    oldest,
                    int(group["consumers"]),
                )
            )
    return rows


async def inspect_session(
    redis: Redis, settings: Settings, project_id: str, session_id: str
) -> dict[str, Any]:
    """A session's state, variables, task state, scratchpad and checkpoints, as stored."""
    keys = SessionKeys.for_session(settings.stream_prefix, settings.shards, project_id, session_id)
    pipe = redis.pipeline(transaction=False)
    pipe.hgetall(keys.meta)
    pipe.hgetall(keys.vars)
    pipe.get(keys.task)
    pipe.lrange(keys.scratch, 0, -1)
    pipe.zrange(keys.cps, 0, -1, withscores=True)
    pipe.hgetall(keys.cpdata)
    pipe.pttl(keys.meta)
    meta, variables, task, scratch, cps, cpdata, ttl = await pipe.execute()
    checkpoints = []
    for cp_id, _score in cps:
        info = cpdata.get(cp_id + b"|info")
        checkpoints.append(orjson.loads(info) if info else {"checkpoint_id": cp_id.decode()})
    return {
        "project_id": project_id,
        "session_id": session_id,
        "shard": keys.shard,
        "exists": b"state" in meta or bool(variables),
        "meta": {k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"@")},
        "dedupe_records": sum(
            len(v) // 8 if k == b"@" else 1 for k, v in meta.items() if k.startswith(b"@")
        ),
        "ttl_seconds": None if ttl < 0 else ttl / 1000,
        "variables": {k.decode(): orjson.loads(v) for k, v in variables.items()},
        "task_state": orjson.loads(task) if task else None,
        "scratchpad": [orjson.loads(e) for e in scratch],
        "checkpoints": checkpoints,
    }
