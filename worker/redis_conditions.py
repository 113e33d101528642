"""Server-wide Redis conditions: replies and errors that say nothing about the command in hand.

A full Redis (``OOM`` under ``maxmemory`` with ``noeviction``), a long script (``BUSY``), a
restart still loading its data (``LOADING``), a failover (``READONLY``, ``MASTERDOWN``), a
cluster resharding or failing over (``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``), a
server that cannot persist (``MISCONF``) or lacks replicas (``NOREPLICAS``), and the server
being unreachable (connection errors, timeouts) are all *the server's* state; so, for this
purpose, is a client whose own connection pool stayed full (``pool_exhausted``: the message
says so and does not blame Redis). Every consumer treats them alike (``worker.consumers.loop``,
the lifecycle worker): hold the entry, report not ready, back off, resume; never count a
failed delivery, never dead-letter. ``WorkingMemory``
and ``LifecycleClient`` raise ``RedisConditionError``, whose message names the condition and
what to do.

One classification, here: ``server_condition(error)`` for an exception (redis-py's, or a reply
error from the worker's pipelined channel) or a reply text; None for anything else (a script
error, a wrong type: the entry's own problem).

Scripts: a script that writes carries the ``#!lua`` shebang (``worker/scripts.py``), so under
``maxmemory`` Redis refuses it before it runs with ``-OOM command not allowed when used memory >
'maxmemory'.``; a script without one fails with ``OOM`` at its first write that may grow
memory, unless it wrote before (then Redis lets it finish). Either error classifies as ``full``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from redis import exceptions as rx

CAPACITY_ADVICE = (
    "free memory, raise maxmemory, or lower retention/windows (see docs/guides/capacity.md)"
)


@dataclass(frozen=True, slots=True)
class ServerCondition:
    """What state the server is in: ``kind`` (a short name for logs and metrics) and a
    sentence for a person, saying what to do."""

    kind: str
    message: str


_BY_CODE: dict[str, tuple[str, str]] = {
    "OOM": ("full", "Redis is full: used_memory reached maxmemory; " + CAPACITY_ADVICE),
    "BUSY": (
        "busy",
        "Redis is busy running a script (BUSY); it answers again when the script ends or "
        "SCRIPT KILL stops it",
    ),
    "LOADING": ("loading", "Redis is loading its dataset into memory (LOADING); wait for it"),
    "READONLY": (
        "readonly",
        "Redis refused a write: this server is a read-only replica (READONLY), e.g. after a "
        "failover; point REDIS_URL at the primary, or use Sentinel or Cluster",
    ),
    "MASTERDOWN": (
        "masterdown",
        "Redis replica lost its primary (MASTERDOWN); wait for the failover to finish",
    ),
    "TRYAGAIN": ("tryagain", "Redis Cluster is moving this slot (TRYAGAIN); retry shortly"),
    "CLUSTERDOWN": ("clusterdown", "Redis Cluster is down (CLUSTERDOWN); wait for it to recover"),
    "MOVED": ("moved", "Redis Cluster moved this slot to another node (MOVED)"),
    "ASK": ("moved", "Redis Cluster is migrating this slot (ASK)"),
    "MISCONF": (
        "misconf",
        "Redis refuses writes: it cannot persist to disk (MISCONF); fix its disk or RDB/AOF "
        "settings",
    ),
    "NOREPLICAS": (
        "noreplicas",
        "Redis refuses writes: not enough healthy replicas (NOREPLICAS, min-replicas-to-write)",
    ),
}

_BY_CLASS: tuple[tuple[type[BaseException], str], ...] = (
    (rx.OutOfMemoryError, "OOM"),
    (rx.BusyLoadingError, "LOADING"),
    (rx.ReadOnlyError, "READONLY"),
    (rx.MasterDownError, "MASTERDOWN"),
    (rx.TryAgainError, "TRYAGAIN"),
    (rx.ClusterDownError, "CLUSTERDOWN"),
    (rx.MovedError, "MOVED"),
    (rx.AskError, "ASK"),
)

_OOM_TEXT = "command not allowed when used memory > 'maxmemory'"


_POOL_EXHAUSTED = (
    "every connection of this process's Redis pool is busy; raise MEMWORKER_REDIS_MAX_CONNECTIONS"
)


def _code_of(text: str) -> str | None:
    code = text.split(" ", 1)[0]
    if code in _BY_CODE:
        return code
    if _OOM_TEXT in text:  # a script error wrapping it (older servers), or redis-py's text
        return "OOM"
    return None


def server_condition(error: BaseException | str | Any) -> ServerCondition | None:
    """The server-wide condition ``error`` reports, or None when it is not one."""
    code: str | None = None
    if isinstance(error, RedisConditionError):
        return error.condition
    if isinstance(error, BaseException):
        for cls, name in _BY_CLASS:
            if isinstance(error, cls):
                code = name
                break
        else:
            if isinstance(error, rx.MaxConnectionsError):  # this process's pool, not Redis
                return ServerCondition("pool_exhausted", str(error) or _POOL_EXHAUSTED)
            if isinstance(error, rx.ConnectionError | rx.TimeoutError | OSError | TimeoutError):
                return ServerCondition("unreachable", f"Redis is unreachable: {error}")
            if isinstance(error, rx.ResponseError):
                code = _code_of(str(error))
    elif isinstance(error, str):
        code = _code_of(error)
    if code is None:
        return None
    kind, message = _BY_CODE[code]
    return ServerCondition(kind, message)


def is_server_condition(error: BaseException | str | Any) -> bool:
    return server_condition(error) is not None


class RedisConditionError(rx.ConnectionError, ConnectionError):
    """Redis cannot serve the request now for a reason of its own (``condition``): full, busy,
    loading, failing over or unreachable. Nothing was written; retry later. The message is one
    line naming the condition and what to do.

    Also a redis-py ``ConnectionError`` and a builtin ``ConnectionError``, so code written to
    catch either while Redis is away keeps catching it."""

    def __init__(self, message: str, condition: ServerCondition | None = None) -> None:
        super().__init__(message)
        self.condition = condition or ServerCondition("unreachable", message)


async def describe_full(redis: Any) -> str | None:
    """'used_memory reached maxmemory 256mb' from the server, or None if it will not say."""
    try:
        info: Any = await redis.info("memory")
    except Exception:
        return None
    limit = info.get("maxmemory_human") if isinstance(info, dict) else None
    if not limit or str(info.get("maxmemory", "0")) == "0":
        return None
    return f"used_memory {info.get('used_memory_human', '?')} reached maxmemory {limit}"


async def condition_error(
    redis: Any, condition: ServerCondition, where: str | None = None
) -> RedisConditionError:
    """The error to raise for ``condition`` met on ``redis``: for a full Redis the message
    carries the server's own figures (one INFO, on this error path only)."""
    message = condition.message
    if condition.kind == "full" and (figures := await describe_full(redis)) is not None:
        message = f"Redis is full: {figures}; {CAPACITY_ADVICE}"
    if where:
        message = f"{message} ({where})"
    return RedisConditionError(message, condition)


@contextlib.asynccontextmanager
async def conditions_raised(redis: Any, where: str | None = None) -> AsyncIterator[None]:
    """Turn a server-wide condition met inside the block into a ``RedisConditionError``;
    every other error passes unchanged."""
    try:
        yield
    except rx.RedisError as exc:  # redis-py's own: an OSError of the caller's passes
        if (condition := server_condition(exc)) is None:
            raise
        raise await condition_error(redis, condition, where) from exc
