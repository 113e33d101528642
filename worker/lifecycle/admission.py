"""Admission: refuse new publishes on a Redis nearly full, so accepted commands can be applied.

Each server (a cluster node, the Sentinel's primary, the one server) is judged by its own
``INFO memory`` for its own shards, every ``MEMWORKER_ADMISSION_INTERVAL_MS`` (every
``MEMWORKER_ADMISSION_INTERVAL_NEAR_FULL_MS`` near its limit). Past ``maxmemory`` less
``MEMWORKER_ADMISSION_RESERVE`` the worker sets each shard's ``P:admission:{i}`` key, which
publishers check; it deletes it when the server has room again.
"""

from __future__ import annotations

from collections.abc import Callable

from worker.keys import StreamKeys
from worker.lifecycle.apply import CommandApplier
from worker.logs import get_logger
from worker.metrics import ADMISSION_CLOSED
from worker.redis_memory import info_fields, used_memory
from worker.settings import Settings

log = get_logger("memworker.lifecycle")

BATCH_HEADROOM_BYTES = 8 * 1024 * 1024
"""With less room than this (or the admission reserve, if larger) under a server's maxmemory,
at the last check, the worker sends one command per apply call instead of up to
``COMMANDS_PER_CALL``: Redis refuses a call that may grow memory only when it starts, so a
call of 64 commands could pass maxmemory by 64 commands' writes."""


class Admission:
    """The admission state of every server holding a shard, and the check that keeps it."""

    def __init__(
        self, settings: Settings, applier: CommandApplier, on_change: Callable[[], None]
    ) -> None:
        self.settings = settings
        self.applier = applier
        self.on_change = on_change
        """Called when admission closes or opens, or a server becomes tight or roomy again."""
        self.closed_servers: set[str] = set()
        """The servers (URLs) past maxmemory less the reserve: admission closed there."""
        self.tight_servers: set[str] = set()
        """Servers with less room under maxmemory than ``BATCH_HEADROOM_BYTES`` (or the
        reserve) at the last check: one command per apply call there."""
        self.near_full_servers: set[str] = set()
        """Servers with less room under their admission limit than the reserve (or
        ``BATCH_HEADROOM_BYTES``), or past it, at the last check: checked every
        ``admission_interval_near_full_ms`` instead of ``admission_interval_ms``."""
        self.refused = False
        """The Redis user may not SET the admission keys (an ACL from before admission)."""

    @property
    def closed(self) -> bool:
        return bool(self.closed_servers)

    @property
    def tight(self) -> bool:
        return bool(self.tight_servers)

    def interval(self) -> float:
        """Seconds to the next check: shorter near a server's limit."""
        if self.near_full_servers:  # past the limit (admission closed) counts as near
            return self.settings.admission_interval_near_full_ms / 1000
        return self.settings.admission_interval_ms / 1000

    async def check(self) -> None:
        """Judge every server holding a shard; close or open admission on it. Redis itself
        refuses every write that may grow memory past maxmemory, applies included: without a
        reserve, publishers could fill it with commands nobody can apply."""
        reserve = self.settings.admission_reserve
        servers: dict[str, list[int]] = {}
        for shard in range(self.settings.shards):
            servers.setdefault(self.applier.url_of(shard), []).append(shard)
        was_closed, was_tight = self.closed, self.tight
        self.closed_servers &= servers.keys()  # a server no longer holding a shard (failover)
        self.tight_servers &= servers.keys()
        self.near_full_servers &= servers.keys()
        try:
            for url, shards in servers.items():
                await self._admit(url, shards, reserve)
        finally:  # what earlier servers changed holds even if a later one failed to answer
            if self.closed != was_closed:
                ADMISSION_CLOSED.set(1 if self.closed else 0)
            if self.closed != was_closed or self.tight != was_tight:
                self.on_change()

    async def _admit(self, url: str, shards: list[int], reserve: float) -> None:
        channel = self.applier.channel_for(shards[0])
        (info,) = await channel.execute([["INFO", "memory"]])
        if isinstance(info, Exception):
            raise info
        figures = info_fields(info)
        cap = figures.get("maxmemory", 0)
        used = used_memory(figures)
        margin = max(BATCH_HEADROOM_BYTES, cap * reserve)
        if cap and cap - used < margin:
            self.tight_servers.add(url)
        else:
            self.tight_servers.discard(url)
        limit = int(cap * (1 - reserve))
        if cap and limit - used < margin:
            self.near_full_servers.add(url)
        else:
            self.near_full_servers.discard(url)
        if reserve <= 0 or self.refused:
            return
        keys = [StreamKeys(self.settings.stream_prefix, shard).admission for shard in shards]
        if cap and used >= limit:
            reason = nearly_full_reason(used, limit, cap, reserve)
            expiry_ms = max(2_000, 8 * self.settings.admission_interval_ms)  # outlives a stall
            # Refused past maxmemory (OOM): Redis then refuses the publishes by itself.
            replies = await channel.execute([["SET", k, reason, "PX", expiry_ms] for k in keys])
            denied = [r for r in replies if isinstance(r, Exception) and "NOPERM" in str(r)]
            if denied:
                self.refused = True  # an ACL from before admission: say it once
                log.error(
                    "admission_unavailable",
                    error=str(denied[0]),
                    advice="grant this Redis user SET DEL on ~<prefix>:admission:* "
                    "(deploy/redis/users.acl); until then publishes are refused only at maxmemory",
                )
                return
            if url not in self.closed_servers:
                log.warning("admission_closed", reason=reason, shards=shards)
                self.closed_servers.add(url)
        elif url in self.closed_servers:
            await channel.execute([["DEL", k] for k in keys])  # one key per call: any slots
            log.info("admission_open", used=used, limit=limit, shards=shards)
            self.closed_servers.discard(url)


def _mb(n: int, decimals: int = 2) -> str:
    return f"{n / 1_048_576:.{decimals}f}M"


def nearly_full_reason(used: int, limit: int, cap: int, reserve: float) -> str:
    """The refusal's text: the value and the limit shown with enough digits to differ (a
    used memory a few bytes past the limit is never "4.51M is past 4.51M"), and in bytes."""
    decimals = next((d for d in range(2, 7) if _mb(used, d) != _mb(limit, d)), 2)
    relation = "is past" if used > limit else "reached"
    return (
        f"Redis is nearly full: used_memory {_mb(used, decimals)} {relation} the limit "
        f"{_mb(limit, decimals)} ({used:,} and {limit:,} bytes; the limit is maxmemory "
        f"{_mb(cap)} less MEMWORKER_ADMISSION_RESERVE {reserve:.0%}, kept for applying the "
        "commands already accepted); retry later, or raise maxmemory"
    )
