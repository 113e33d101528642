"""Redis memory as ``maxmemory`` judges it, read from an ``INFO memory`` reply.

``used_memory`` counts the replication backlog and the AOF buffers, but Redis leaves them out
when it compares memory with ``maxmemory`` (``mem_not_counted_for_evict``): that comparison is
what refuses writes (``OOM``) under ``noeviction``. Whatever asks "how full is Redis" (admission,
capacity) reads ``used_memory`` here, so all of them compare the figure Redis compares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.codec import text


def info_fields(reply: bytes | str) -> dict[str, int]:
    """The integer fields of a raw ``INFO`` reply (the parsed dict of a client is one already)."""
    out: dict[str, int] = {}
    for line in text(reply).splitlines():
        name, _, value = line.partition(":")
        if value.isdigit():
            out[name] = int(value)
    return out


def used_memory(info: Mapping[str, Any]) -> int:
    """``used_memory - mem_not_counted_for_evict``: the bytes Redis compares with
    ``maxmemory`` (a field the server does not report counts 0)."""
    return int(info.get("used_memory", 0)) - int(info.get("mem_not_counted_for_evict", 0))


def maxmemory(info: Mapping[str, Any]) -> int:
    """``maxmemory`` in bytes; 0 when none is set."""
    return int(info.get("maxmemory", 0))
