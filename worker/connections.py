"""Redis clients for memworker, with the protocol packed by hiredis (in C).

redis-py's asyncio connection packs commands in Python, one ``encode`` call per argument; a
batch of apply scripts has ~30 arguments per command, and that packing was the worker's largest
cost (2.3 s of 5.7 s in a 20,000-command profile). hiredis's ``pack_command`` does the same
work in C.
"""

from __future__ import annotations

from typing import Any

from redis.asyncio import Connection, Redis

try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is a dependency; keep working without it
    _pack_command = None  # type: ignore[assignment]
_pack: Any = _pack_command


class HiredisPackedConnection(Connection):
    """A TCP connection whose commands are packed by hiredis."""

    def pack_command(self, *args: Any) -> list[bytes]:
        if _pack is None:  # pragma: no cover
            return super().pack_command(*args)
        first = args[0]
        if (isinstance(first, str) and " " in first) or (
            isinstance(first, bytes) and b" " in first
        ):
            args = (*first.split(), *args[1:])
        return [_pack(args)]


def redis_client(url: str, **kwargs: Any) -> Redis:
    """A client for ``url``; plain TCP URLs get the hiredis-packed connection."""
    if url.startswith("redis://") and _pack is not None:
        kwargs.setdefault("connection_class", HiredisPackedConnection)
    return Redis.from_url(url, **kwargs)
