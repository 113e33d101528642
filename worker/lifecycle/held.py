"""Entries the lifecycle worker keeps pending on purpose: waiting for a seq gap, or retrying.

A held entry stays in the group's pending list, its lease renewed (``XCLAIM``) each time it is
retried, so no other consumer reclaims it while this one still means to apply it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class Held:
    """An entry this consumer keeps pending on purpose: waiting for a seq gap, or retrying."""

    shard: int
    fields: Mapping[bytes, bytes]
    due: float
    attempts: int = 0
    waiting: bool = False
    #: When the seq-gap clock started: the first time Redis, serving, answered that this
    #: entry's predecessor has not been applied. Never the time a condition first held it.
    waiting_since: float | None = None


@dataclass
class RetryBook:
    """Entries to apply again later, by entry id."""

    held: dict[tuple[int, str], Held] = field(default_factory=dict)

    def hold(
        self,
        shard: int,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        delay: float,
        *,
        waiting: bool,
        error: bool,
    ) -> Held:
        now = time.monotonic()
        item = self.held.get((shard, entry_id))
        if item is None:
            item = self.held[(shard, entry_id)] = Held(shard, fields, now + delay)
        item.due = now + delay
        item.waiting = waiting
        if error:
            item.attempts += 1
        return item

    def release(self, shard: int, entry_id: str) -> None:
        self.held.pop((shard, entry_id), None)

    def due(self) -> dict[int, list[tuple[str, Held]]]:
        now = time.monotonic()
        out: dict[int, list[tuple[str, Held]]] = {}
        for (shard, entry_id), item in self.held.items():
            if item.due <= now:
                out.setdefault(shard, []).append((entry_id, item))
        return out
