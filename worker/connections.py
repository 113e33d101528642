"""Redis clients for memworker: standalone, Redis Cluster or Sentinel, one place to choose.

``client_for(settings)`` gives the client every component uses for keyed commands (a
``RedisCluster`` routes each command to the node of its key's slot; all of a shard's keys share
the hash tag ``{i}``, so a script's keys always live on one node). ``shard_urls(settings)``
gives, per shard, the URL of the node that holds it — the worker's pipelined ``ScriptChannel``
connects there directly. ``consumer_client(settings)`` is the client a consumer loop reads with.

Plain TCP clients pack commands with hiredis (in C): redis-py's asyncio connection packs in
Python, one ``encode`` per argument, which was the worker's largest cost in a profile.

A standalone or Sentinel client opens at most ``MEMWORKER_REDIS_MAX_CONNECTIONS`` connections
to one server, and a call past them waits (up to ``MEMWORKER_REDIS_POOL_TIMEOUT_SECONDS``) for
a free one instead of failing (a ``BlockingConnectionPool``, or its Sentinel twin). A Redis
Cluster client's node pools cannot wait (a full one fails the call), so they are not capped.
A pool that stays full raises ``PoolExhaustedError``, which names the setting.

``client_for`` clients (``WorkingMemory``, ``LifecycleClient``, the CLI) retry a call whose
connection was lost or refused (Redis restarted, failing over, still loading) with backoff for
``MEMWORKER_REDIS_RETRY_SECONDS``, on a new connection: the first call after a restart
succeeds. A retried call may run twice when the server ran it and the reply was lost: the
scripts these clients run are safe to run twice (a publish records its ``event_id`` and its
``seq``, and a second run returns the first's). Consumer loops (``consumer_client``) do not
retry here: a failed read must surface, so the loop reads its own pending entries again. A
Redis Cluster client keeps redis-py's own cluster retries (re-reading the topology): a retry
policy of ours there raced redis-py, closing a connection under a call still connecting.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, Connection, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import EqualJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError
from redis.exceptions import TimeoutError as RedisTimeoutError

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
    """The Sentinels a ``redis://[user:password@]h1:26379,h2:26379/0`` URL names (the
    credentials are the master's: ``_sentinel_credentials``)."""
    netloc = urlsplit(settings.redis_url).netloc.rsplit("@", 1)[-1]
    hosts = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])) for h in netloc.split(",")]
    return Sentinel(hosts)  # type: ignore[no-untyped-call]


def _sentinel_credentials(settings: Settings) -> dict[str, str]:
    """The user and password of a Sentinel URL, for the master's connections."""
    netloc = urlsplit(settings.redis_url).netloc
    if "@" not in netloc:
        return {}
    user, _, password = netloc.rsplit("@", 1)[0].partition(":")
    given = {"username": unquote(user), "password": unquote(password)}
    return {k: v for k, v in given.items() if v}


class PoolExhaustedError(MaxConnectionsError):
    """Every connection this client may open stayed busy for the pool timeout: this
    process's limit, not Redis's (a ``pool_exhausted`` condition)."""


def _exhausted(limit: int, timeout: float) -> PoolExhaustedError:
    return PoolExhaustedError(
        f"all {limit} Redis connections of this process stayed busy for {timeout:g}s "
        "(this client's limit, not Redis's); raise MEMWORKER_REDIS_MAX_CONNECTIONS or "
        "MEMWORKER_REDIS_POOL_TIMEOUT_SECONDS, or make fewer calls at once"
    )


class WaitingPool(BlockingConnectionPool):
    """A pool whose calls past ``max_connections`` wait for a free connection."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except RedisConnectionError as exc:
            if str(exc) != "No connection available.":
                raise
            raise _exhausted(self.max_connections, float(self.timeout or 0)) from None


class WaitingSentinelPool(SentinelConnectionPool, WaitingPool):
    """The master's pool of a Sentinel-watched service, waiting like ``WaitingPool``."""


CLUSTER_NODE_CONNECTIONS = 2**31
"""No cap on a cluster node's pool (a full one fails the call at once, it cannot wait)."""


def retry_policy(seconds: float) -> Retry:
    """Retry a lost or refused connection for about ``seconds``: backoff from 50 ms doubling
    up to 0.5 s (half of it jitter, so clients a restart cut off do not return in step)."""
    retries, waited, step = 0, 0.0, 0.1
    while waited < seconds:
        waited += min(step, 0.5) * 0.75  # the mean of a jittered wait
        step *= 2
        retries += 1
    return Retry(EqualJitterBackoff(cap=0.5, base=0.05), retries)


def client_for(
    settings: Settings, *, retry_seconds: float | None = None, **kwargs: Any
) -> AnyRedis:
    """The client for keyed commands, as the settings say: cluster, sentinel or standalone.

    It opens at most ``redis_max_connections`` connections a server (calls past them wait; on
    a Redis Cluster each node's pool opens what concurrent calls need) and
    retries a lost connection for ``retry_seconds`` (default ``redis_retry_seconds``)."""
    if not settings.redis_url.startswith("unix://"):  # a unix socket has no TCP keepalive
        kwargs.setdefault("socket_keepalive", True)
    seconds = settings.redis_retry_seconds if retry_seconds is None else retry_seconds
    retry = retry_policy(seconds) if seconds > 0 else Retry(EqualJitterBackoff(), 0)
    errors = [RedisConnectionError, RedisTimeoutError]
    limit, timeout = settings.redis_max_connections, settings.redis_pool_timeout_seconds
    if settings.redis_cluster:
        # A node's pool opens what concurrent calls need: a capped cluster pool fails at once
        # when full. No retry policy of ours: redis-py's cluster retries re-read the topology,
        # and ours raced them (a connection closed under a call still connecting).
        return RedisCluster.from_url(
            settings.redis_url, max_connections=CLUSTER_NODE_CONNECTIONS, **kwargs
        )
    kwargs.update(retry=retry, retry_on_error=errors if seconds > 0 else [])
    if settings.redis_sentinel_service:
        for name, value in _sentinel_credentials(settings).items():
            kwargs.setdefault(name, value)
        master: Redis = _sentinel(settings).master_for(
            settings.redis_sentinel_service,
            connection_pool_class=WaitingSentinelPool,
            max_connections=limit,
            timeout=timeout,
            **kwargs,
        )
        return master
    url = settings.redis_url
    if url.startswith("redis://") and _pack is not None:
        kwargs.setdefault("connection_class", HiredisPackedConnection)
    pool = WaitingPool.from_url(url, max_connections=limit, timeout=timeout, **kwargs)
    return Redis.from_pool(pool)


def consumer_client(settings: Settings) -> AnyRedis:
    """The client a consumer loop reads with: a reply later than
    ``MEMWORKER_REPLY_TIMEOUT_SECONDS`` means a dead connection (reads block for
    ``MEMWORKER_BLOCK_MS`` only), so the read fails and the loop reads its own pending entries
    again, instead of waiting on a socket that will never answer. No retry of its own: the
    loop backs off and re-reads what it was given."""
    return client_for(
        settings,
        retry_seconds=0,
        health_check_interval=10,
        socket_timeout=settings.reply_timeout_seconds,
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


async def cluster_shard_nodes(settings: Settings) -> dict[int, tuple[str, int]]:
    """On a Redis Cluster, per shard, the host and port of the master that serves its hash
    tag's slot (``memworker stats`` shows them: no credentials)."""
    cluster = RedisCluster.from_url(settings.redis_url)
    try:
        await cluster.initialize()
        nodes = {}
        for shard in range(settings.shards):
            node = cluster.get_node_from_key(tag(shard))
            if node is None:
                raise RuntimeError(f"no cluster node serves shard {shard}'s slot")
            nodes[shard] = (str(node.host), int(node.port))
        return nodes
    finally:
        await cluster.aclose()


async def shard_urls(settings: Settings) -> dict[int, str]:
    """Per shard, the URL of the server that holds its streams and sessions."""
    if settings.redis_cluster:
        nodes = await cluster_shard_nodes(settings)
        return {
            shard: _with_host(settings.redis_url, host, port, db=0)
            for shard, (host, port) in nodes.items()
        }
    if settings.redis_sentinel_service:
        host, port = await _sentinel(settings).discover_master(settings.redis_sentinel_service)
        db = urlsplit(settings.redis_url).path.strip("/") or "0"
        url = _with_host(settings.redis_url, host, port, db=int(db))
        return dict.fromkeys(range(settings.shards), url)
    return dict.fromkeys(range(settings.shards), settings.redis_url)
