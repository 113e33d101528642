"""Redis clients for memworker: standalone, Redis Cluster or Sentinel, one place to choose.

``client_for(settings)`` gives the client every component uses for keyed commands (a
``RedisCluster`` routes each command to the node of its key's slot; all of a shard's keys share
the hash tag ``{i}``, so a script's keys always live on one node). ``shard_urls(settings)``
gives, per shard, the URL of the node that holds it — the worker's pipelined ``ScriptChannel``
connects there directly. ``consumer_client(settings)`` is the client a consumer loop reads with.

Plain TCP clients pack commands with hiredis (in C): redis-py's asyncio connection packs in
Python, one ``encode`` per argument, which was the worker's largest cost in a profile.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from redis.asyncio import Connection, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.sentinel import Sentinel

from worker.keys import tag
from worker.settings import Settings

try:
    from hiredis import pack_command as _pack_command
except ImportError:  # pragma: no cover - hiredis is a dependency; keep working without it
    _pack_command = None  # type: ignore[assignment]
_pack: Any = _pack_command

AnyRedis = Redis | RedisCluster


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
    """A standalone client for ``url``; plain TCP URLs get the hiredis-packed connection."""
    if url.startswith("redis://") and _pack is not None:
        kwargs.setdefault("connection_class", HiredisPackedConnection)
    return Redis.from_url(url, **kwargs)


def _sentinel(settings: Settings) -> Sentinel:
    parts = urlsplit(settings.redis_url)
    hosts = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in parts.netloc.split(",")]
    return Sentinel(hosts)  # type: ignore[no-untyped-call]


def client_for(settings: Settings, **kwargs: Any) -> AnyRedis:
    """The client for keyed commands, as the settings say: cluster, sentinel or standalone."""
    kwargs.setdefault("socket_keepalive", True)
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, **kwargs)
    if settings.redis_sentinel_service:
        master: Redis = _sentinel(settings).master_for(settings.redis_sentinel_service, **kwargs)
        return master
    return redis_client(settings.redis_url, **kwargs)


def consumer_client(settings: Settings) -> AnyRedis:
    """The client a consumer loop reads with: a reply later than
    ``MEMWORKER_REPLY_TIMEOUT_SECONDS`` means a dead connection (reads block for
    ``MEMWORKER_BLOCK_MS`` only), so the read fails and the loop reads its own pending entries
    again, instead of waiting on a socket that will never answer."""
    return client_for(
        settings, health_check_interval=10, socket_timeout=settings.reply_timeout_seconds
    )


def _with_host(url: str, host: str, port: int, db: int | None = None) -> str:
    """``url`` with its host and port (and database) replaced, credentials kept."""
    parts = urlsplit(url)
    credentials = ""
    if parts.username or parts.password:
        credentials = quote(parts.username or "", safe="")
        if parts.password:
            credentials += ":" + quote(parts.password, safe="")
        credentials += "@"
    path = f"/{db}" if db is not None else parts.path
    scheme = "rediss" if parts.scheme == "rediss" else "redis"
    return urlunsplit((scheme, f"{credentials}{host}:{port}", path, parts.query, ""))


async def shard_urls(settings: Settings) -> dict[int, str]:
    """Per shard, the URL of the server that holds its streams and sessions."""
    if settings.redis_cluster:
        cluster = RedisCluster.from_url(settings.redis_url)
        try:
            await cluster.initialize()
            urls = {}
            for shard in range(settings.shards):
                node = cluster.get_node_from_key(tag(shard))
                if node is None:
                    raise RuntimeError(f"no cluster node serves shard {shard}'s slot")
                urls[shard] = _with_host(settings.redis_url, node.host, int(node.port), db=0)
            return urls
        finally:
            await cluster.aclose()
    if settings.redis_sentinel_service:
        host, port = await _sentinel(settings).discover_master(settings.redis_sentinel_service)
        db = urlsplit(settings.redis_url).path.strip("/") or "0"
        url = _with_host(settings.redis_url, host, port, db=int(db))
        return dict.fromkeys(range(settings.shards), url)
    return dict.fromkeys(range(settings.shards), settings.redis_url)
