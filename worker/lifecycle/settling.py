"""Settling an applied entry: counted, held for a seq gap or a retry, or dead-lettered.

The apply function replied for each entry (``worker.lifecycle.apply.Outcome``); what happens
next is decided here, once: a ``wait`` (its ``seq`` is ahead) is held until the gap closes or
``MEMWORKER_SEQ_GAP_TIMEOUT_SECONDS`` pass, an ``error`` is retried up to
``MEMWORKER_MAX_DELIVERIES`` times, the rest are counted by command, status and reason.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from worker.keys import LIFECYCLE_GROUP
from worker.lifecycle.apply import CommandApplier, Outcome
from worker.lifecycle.held import RetryBook
from worker.lifecycle.pressure import ServerConditions
from worker.logs import get_logger
from worker.metrics import COMMANDS, DEAD_LETTERS
from worker.settings import Settings

log = get_logger("memworker.lifecycle")


class Settler:
    """Decides what becomes of each applied entry (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        applier: CommandApplier,
        retry: RetryBook,
        conditions: ServerConditions,
    ) -> None:
        self.settings = settings
        self.applier = applier
        self.retry = retry
        self.conditions = conditions
        self._counters: dict[tuple[str, str, str], Any] = {}

    async def settle(self, shard: int, outcome: Outcome, fields: Mapping[bytes, bytes]) -> None:
        """Count an applied entry, or hold it (a seq gap, an error), or dead-letter it."""
        status = outcome.status
        if status == "wait":
            held = self.retry.hold(
                shard,
                outcome.entry_id,
                fields,
                self.settings.seq_retry_ms / 1000,
                waiting=True,
                error=False,
            )
            now = time.monotonic()
            if self.conditions.current is not None or held.waiting_since is None:
                # The clock starts at the first wait Redis answers while it serves. Its
                # predecessor may still be held by a condition (or retried later than it): the
                # gap is Redis's, not the orchestrator's, until the predecessor had its chance.
                held.waiting_since = now
            elif now - held.waiting_since > self.settings.seq_gap_timeout_seconds:
                self.retry.release(shard, outcome.entry_id)
                await self.dead(
                    shard,
                    outcome.entry_id,
                    fields,
                    "seq_gap",
                    f"waited {self.settings.seq_gap_timeout_seconds:g}s for seq "
                    f"{outcome.detail} of session {outcome.project_id}/"
                    f"{outcome.session_id}; it never arrived",
                    1,
                )
            return
        if status == "error":
            held = self.retry.hold(shard, outcome.entry_id, fields, 0.5, waiting=False, error=True)
            log.error(
                "apply_failed",
                entry_id=outcome.entry_id,
                error=outcome.detail,
                attempts=held.attempts,
                event_id=outcome.event_id,
            )
            if held.attempts >= self.settings.max_deliveries:
                self.retry.release(shard, outcome.entry_id)
                await self.dead(
                    shard, outcome.entry_id, fields, "max_deliveries", outcome.detail, held.attempts
                )
            return
        self.retry.release(shard, outcome.entry_id)
        if status == "dead":
            DEAD_LETTERS.labels(LIFECYCLE_GROUP, outcome.reason or "unparseable").inc()
            log.warning(
                "dead_letter",
                entry_id=outcome.entry_id,
                reason=outcome.reason,
                error=outcome.detail,
            )
            return
        key = (outcome.command or "unknown", status, outcome.reason or "")
        counter = self._counters.get(key)
        if counter is None:
            counter = self._counters[key] = COMMANDS.labels(*key)
        counter.inc()
        if status == "rejected":
            log.info(
                "command_rejected",
                reason=outcome.reason,
                event_id=outcome.event_id,
                project_id=outcome.project_id,
                session_id=outcome.session_id,
            )

    async def dead(
        self,
        shard: int,
        entry_id: str,
        fields: Mapping[bytes, bytes],
        reason: str,
        error: str,
        deliveries: int,
    ) -> None:
        await self.applier.dead_letter(shard, entry_id, fields, reason, error, deliveries)
        DEAD_LETTERS.labels(LIFECYCLE_GROUP, reason).inc()
        log.warning("dead_letter", entry_id=entry_id, reason=reason, error=error)
