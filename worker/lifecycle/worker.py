"""The lifecycle worker: group ``lifecycle`` on every ``P:lifecycle:{i}``, applied in Redis.

It runs on the one consumer loop (``worker.consumers.loop``: groups, own pending first,
batches, reclaim, backoff, lag) as that loop's handler. A batch is sent to the apply function
(``worker.lifecycle.apply``) and ``finish`` returns before its replies arrive, so the next
batch is read while Redis runs this one (``IN_FLIGHT`` outstanding per server); the function
acknowledges each entry atomically with its effect. Around it: entries whose ``seq`` is ahead,
or that Redis refused for a server-wide reason, wait in a retry book whose leases are renewed;
a reclaimed entry delivered more than ``MEMWORKER_MAX_DELIVERIES`` times is dead-lettered; and
admission (``worker.lifecycle.admission``) closes publishes before Redis is full.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.codec import text
from worker.connections import consumer_client
from worker.consumers.backoff import sleep_unless_stopped
from worker.consumers.entries import BatchOutcome, StreamEntry
from worker.consumers.groups import (
    default_consumer_name,
    delivery_counts,
    ensure_group,
    renew_leases,
)
from worker.consumers.loop import GroupConsumer
from worker.consumers.periodic import run_every
from worker.consumers.retention import ConsumedMarks, trim_dead_letters, trim_stream
from worker.consumers.service import run_until_stopped
from worker.credentials import mask
from worker.keys import CONSOLIDATION_GROUP, LIFECYCLE_GROUP, StreamKeys
from worker.lifecycle.admission import Admission
from worker.lifecycle.apply import COMMANDS_PER_CALL, CommandApplier, Outcome, Plan
from worker.lifecycle.held import RetryBook
from worker.lifecycle.pressure import FullTrimmer, ServerConditions
from worker.lifecycle.settling import Settler
from worker.logs import get_logger
from worker.metrics import (
    APPLY_SECONDS,
    READY,
)
from worker.ops.capacity import CapacityGauges
from worker.redis_conditions import ServerCondition, is_server_condition
from worker.settings import Settings

log = get_logger("memworker.lifecycle")

Entry = tuple[bytes | str, Mapping[bytes, bytes]]
ShardBatches = list[tuple[int, list[Entry]]]
IN_FLIGHT = 2
"""Batches sent and not yet answered: two keep both Redis and the worker busy."""
_CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class LifecycleWorker:
    """One consumer of every lifecycle shard stream: the handler of the ``lifecycle`` group."""

    group = LIFECYCLE_GROUP
    storage_errors: tuple[type[BaseException], ...] = ()
    failure_reason = "max_deliveries"
    acknowledges = True
    """The apply function acknowledges each entry with its effect; the loop acks nothing."""
    raw_fields = True
    """Entries reach the apply function with the field names Redis returned."""

    def __init__(self, settings: Settings, *, consumer: str | None = None) -> None:
        self.settings = settings
        self.consumer = consumer or default_consumer_name()
        self.redis = consumer_client(settings)
        self.applier = CommandApplier(self.redis, settings)
        self.retry = RetryBook()
        self.capacity = CapacityGauges(settings)
        self.admission = Admission(settings, self.applier, self._update_pressure)
        self._ready = False
        self._stopping = asyncio.Event()
        self._inflight = 0
        self._windows: dict[str, asyncio.Semaphore] = {}
        """Per server (a shard's URL), its batches in flight: a silent one holds its own."""
        self._settling: set[asyncio.Task[None]] = set()
        self._topology_stale = False
        self.conditions = ServerConditions(settings, self.retry)
        self.settler = Settler(settings, self.applier, self.retry, self.conditions)
        self.trimmer = FullTrimmer(settings, self.trim_once)
        self.consumed_marks = ConsumedMarks()
        """Retention of streams with ids ahead of the clock (``worker.consumers.retention``)."""
        self._tasks: list[asyncio.Task[None]] = []
        self.streams = [self.streams_of(shard).lifecycle for shard in range(settings.shards)]
        self._shard_of = {stream: shard for shard, stream in enumerate(self.streams)}
        # Its lag is probed with the capacity gauges (``probe_lag``), on their schedule. On a
        # cluster each shard is read by a loop of its own (a silent node holds its shards only).
        self.loop: GroupConsumer[ShardBatches] = GroupConsumer.from_settings(
            self.redis,
            self,
            settings,
            consumer=self.consumer,
            backoff_max_s=5.0,
            lag_probe_s=None,
            side_by_side=True,
        )

    def streams_of(self, shard: int) -> StreamKeys:
        return StreamKeys(self.settings.stream_prefix, shard)

    @property
    def ready(self) -> bool:
        """Consuming, and the last step reached every server."""
        return self._ready and not self.loop.in_outage

    # -- the group's handler (worker.consumers.entries.GroupHandler) -------------------------------

    def dlq_stream(self, stream: str) -> str:
        return self.streams_of(self._shard_of[stream]).dlq

    async def prepare(self, entries: Sequence[StreamEntry]) -> ShardBatches:
        by_shard: dict[int, list[Entry]] = {}
        for entry in entries:
            by_shard.setdefault(self._shard_of[entry.stream], []).append(
                (entry.entry_id, entry.fields)
            )
        return list(by_shard.items())

    async def finish(self, batch: ShardBatches) -> BatchOutcome:
        """Send each shard's entries to Redis; the replies are settled as they arrive."""
        for shard, entries in batch:
            await self.dispatch(shard, entries)
        return BatchOutcome()

    async def check_storage(self) -> None:
        """The lifecycle's storage is Redis itself: the loop's reads check it."""

    async def reclaimed(self, stream: str, entries: Sequence[StreamEntry]) -> set[str]:
        """Entries just taken over from a consumer that stopped answering: one delivered more
        than ``max_deliveries`` times (it crashed or stalled every worker that read it) is
        dead-lettered instead of applied again. An entry this worker holds (waiting for Redis
        to recover, or for a seq gap) was delivered again by its own lease lapsing: kept."""
        shard = self._shard_of[stream]
        dead: set[str] = set()
        ids = [entry.entry_id for entry in entries]
        counts = await delivery_counts(self.redis, stream, LIFECYCLE_GROUP, ids)
        for entry in entries:
            entry_id, n = entry.entry_id, counts.get(entry.entry_id, 1)
            if n > self.settings.max_deliveries and (shard, entry_id) not in self.retry.held:
                await self.settler.dead(
                    shard,
                    entry_id,
                    entry.fields,
                    "max_deliveries",
                    f"delivered {n} times without being applied",
                    n,
                )
                dead.add(entry_id)
        return dead

    # -- applying ---------------------------------------------------------------------------

    async def dispatch(self, shard: int, entries: Sequence[Entry]) -> None:
        """Send a batch and return before its replies arrive, so the next batch is read and
        parsed while Redis runs this one. At most ``IN_FLIGHT`` batches per server are
        outstanding; they share its one connection, so Redis applies them in the order they
        were read (a server that stops answering holds its own shards' batches only).

        While Redis is full this batch is held like the others and reading stops until Redis
        serves again: each entry read grows the group's pending list, a write Redis allows
        past ``maxmemory``."""
        if self.conditions.full:
            for entry_id, fields in entries:
                self.retry.hold(shard, text(entry_id), fields, 0.0, waiting=False, error=False)
            while self.conditions.full and not self._stopping.is_set():
                await asyncio.sleep(0.05)
            return
        url = self.applier.url_of(shard)
        window = self._windows.get(url) or self._windows.setdefault(
            url, asyncio.Semaphore(IN_FLIGHT)
        )
        await window.acquire()
        started = time.perf_counter()
        try:
            channel = self.applier.channel_for(shard)
            if not channel.connected:
                await channel.connect()
            ahead = self.applier.future_ids.ahead(shard, entries)  # no I/O
            explicit = await self.applier.screen(shard, entries) if ahead else None
            plan = self.applier.plan(shard, entries, started, future=explicit)
            future = channel.submit(plan.commands)
        except _CONNECTION_ERRORS as exc:
            window.release()
            self._unreachable(shard, entries, exc)
            return
        except BaseException:
            window.release()  # else two failures leave the worker waiting forever
            raise
        self._inflight += 1
        task = asyncio.create_task(self._complete(plan, future))
        self._settling.add(task)
        task.add_done_callback(lambda done: self._settled(done, window))

    def _settled(self, task: asyncio.Task[None], window: asyncio.Semaphore) -> None:
        self._settling.discard(task)
        self._inflight -= 1
        window.release()
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("batch_failed", error=repr(exc))

    async def _complete(self, plan: Plan, future: asyncio.Future[list[Any]]) -> None:
        try:
            replies = await asyncio.wait_for(
                asyncio.shield(future), self.settings.reply_timeout_seconds
            )
        except TimeoutError:
            # A silent partition: no reset, no reply. Drop the connection so this batch is
            # held and retried, and readiness reflects the truth.
            self.applier.channel_for(plan.shard).abandon(
                f"no reply within {self.settings.reply_timeout_seconds:g}s"
            )
            self._unreachable(plan.shard, plan.entries, TimeoutError("replies overdue"))
            return
        except _CONNECTION_ERRORS as exc:
            self._unreachable(plan.shard, plan.entries, exc)
            return
        outcomes = self.applier.finish(plan, replies)
        if outcomes is None:  # the server lost our scripts or function (restart, FLUSH): redo
            await self._apply(plan.shard, plan.entries)
            return
        await self._record(plan.shard, plan.entries, outcomes, plan.received)

    def _unreachable(self, shard: int, entries: Sequence[Entry], exc: BaseException) -> None:
        self._set_ready(False)
        self._topology_stale = True
        log.warning("redis_unavailable", error=str(exc), held=len(entries))
        for entry_id, fields in entries:
            self.retry.hold(shard, text(entry_id), fields, 1.0, waiting=False, error=False)

    async def apply_batch(self, shard: int, entries: Sequence[Entry]) -> list[Outcome]:
        """Apply entries; hold what must wait or be retried. Survives a cancelled caller."""
        if not entries:
            return []
        self._inflight += 1
        task = asyncio.ensure_future(self._apply(shard, entries))
        # Counted down when the work ends, not when a (cancelled) caller stops waiting.
        task.add_done_callback(self._applied)
        return await asyncio.shield(task)

    def _applied(self, task: asyncio.Future[list[Outcome]]) -> None:
        self._inflight -= 1
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("batch_failed", error=repr(exc))

    async def _apply(self, shard: int, entries: Sequence[Entry]) -> list[Outcome]:
        started = time.perf_counter()
        try:
            outcomes = await self.applier.apply(shard, entries, started)
        except (*_CONNECTION_ERRORS, RedisError) as exc:
            # e.g. FUNCTION LOAD refused by a full server that lost the library (restarted
            # without persistence): a server-wide condition like any other; hold the batch.
            if not isinstance(exc, _CONNECTION_ERRORS) and not is_server_condition(exc):
                raise
            self._unreachable(shard, entries, exc)
            return []
        await self._record(shard, entries, outcomes, started)
        return outcomes

    async def _record(
        self, shard: int, entries: Sequence[Entry], outcomes: list[Outcome], started: float
    ) -> None:
        blocked = [o for o in outcomes if o.status == "unreachable"]
        if blocked:
            self._held_by_condition(shard, blocked, {text(i): f for i, f in entries})
            outcomes = [o for o in outcomes if o.status != "unreachable"]
            if not outcomes:
                return
        elif self.conditions.current is None or any(o.status != "wait" for o in outcomes):
            # Redis wrote (or nothing was wrong): it serves
            self._condition_cleared()
        APPLY_SECONDS.labels(LIFECYCLE_GROUP).observe(time.perf_counter() - started)
        fields_by_id = {text(i): f for i, f in entries}
        for outcome in outcomes:
            await self._settle(shard, outcome, fields_by_id[outcome.entry_id])

    async def _settle(self, shard: int, outcome: Outcome, fields: Mapping[bytes, bytes]) -> None:
        await self.settler.settle(shard, outcome, fields)

    def _held_by_condition(
        self, shard: int, blocked: Sequence[Outcome], fields: Mapping[str, Mapping[bytes, bytes]]
    ) -> None:
        """Redis refused these entries for a server-wide reason: hold them (not their fault),
        report not ready, and learn where shards live (a failover or resharding)."""
        condition = self.conditions.hold(shard, blocked, fields)
        self._topology_stale = True
        self._set_ready(False)
        self._update_pressure()
        if condition.kind == "full":
            self.trimmer.soon()

    def _update_pressure(self) -> None:
        """Under memory pressure (admission closed, or Redis refusing writes as full) each
        applied command's entry is deleted with its acknowledgement. Near maxmemory (less room
        than ``BATCH_HEADROOM_BYTES`` or the admission reserve) each command goes to Redis in a
        call of its own: Redis checks ``maxmemory`` once per call, so a call of one command can
        pass the limit by one command's writes at most, not a batch's."""
        nearly_full = self.admission.closed or self.conditions.full
        self.applier.pressure = self.settings.trim_when_full and nearly_full
        tight = nearly_full or self.admission.tight
        self.applier.commands_per_call = 1 if tight else COMMANDS_PER_CALL

    def _condition_cleared(self) -> None:
        if self.conditions.clear():
            self._update_pressure()
        self._set_ready(True)

    def _set_ready(self, value: bool) -> None:
        if value != self._ready:
            self._ready = value
            READY.set(1 if value else 0)

    async def retry_once(self) -> None:
        """Apply held entries that are due; renew their leases so nobody reclaims them."""
        for shard, items in self.retry.due().items():
            stream = self.streams_of(shard).lifecycle
            ids = [entry_id for entry_id, _ in items]
            owned = await renew_leases(self.redis, stream, LIFECYCLE_GROUP, self.consumer, ids)
            for entry_id in ids:
                if entry_id not in owned:  # acknowledged elsewhere or trimmed
                    self.retry.release(shard, entry_id)
            batch = [(entry_id, held.fields) for entry_id, held in items if entry_id in owned]
            await self.apply_batch(shard, batch)

    async def trim_once(self, keep_seconds: float | None = None) -> int:
        """Trim lifecycle and results streams below what every group has acknowledged, keeping
        ``keep_seconds`` of it for replay (default: the retention setting), and each shard's
        DLQ to ``dlq_max_entries`` and ``dlq_retention_seconds``."""
        settings = self.settings
        keep = settings.retention_seconds if keep_seconds is None else keep_seconds
        removed = 0
        for shard in range(settings.shards):
            streams = self.streams_of(shard)
            for stream in (streams.lifecycle, streams.results):
                removed += await trim_stream(self.redis, stream, keep, self.consumed_marks)
            removed += await trim_dead_letters(
                self.redis, streams.dlq, settings.dlq_max_entries, settings.dlq_retention_seconds
            )
        return removed

    async def probe_lag(self) -> None:
        """Refresh the lag, pending and capacity gauges (slowly: never on the hot path)."""
        await self.loop.probe_lag()
        await self.capacity.refresh_gauges(self.redis)

    async def admission_once(self) -> None:
        """Check admission on every server (``worker.lifecycle.admission``)."""
        await self.admission.check()
        if self.admission.closed:
            self.trimmer.soon()

    async def watch_servers(self) -> None:
        """After an outage or a failover: learn where shards live, check every server answers
        as a writable primary, and report ready again even if no command arrives to prove it."""
        if self._topology_stale or self.loop.in_outage:
            await self.refresh_topology()
        await self.applier.ping()
        self._topology_stale = False
        if self.conditions.current is None or not any(
            not held.waiting for held in self.retry.held.values()
        ):  # nothing held back by a condition: the next command will tell
            self._condition_cleared()

    async def refresh_topology(self) -> None:
        """After a failover or resharding: learn which server holds each shard again."""
        if not (self.settings.redis_cluster or self.settings.redis_sentinel_service):
            return
        before = {shard: self.applier.url_of(shard) for shard in range(self.settings.shards)}
        await self.applier.resolve()
        after = {shard: self.applier.url_of(shard) for shard in range(self.settings.shards)}
        if after != before:  # the URLs carry the ACL user's password: never logged
            log.warning(
                "topology_changed",
                before={shard: mask(url) for shard, url in before.items()},
                after={shard: mask(url) for shard, url in after.items()},
            )
            await self.applier.ensure_scripts()

    # -- running ----------------------------------------------------------------------------

    async def start(self) -> bool:
        """Create groups, load scripts, start the consumer loop and the periodic steps.

        Retries while Redis is unreachable, until it answers or ``stop()`` is called; returns
        whether the worker started (False: asked to stop first)."""
        delay = 0.2
        while not self._stopping.is_set():
            try:
                await self.loop.ensure_groups()
                for shard in range(self.settings.shards):
                    # Retention trims results below every group's position: the consolidation
                    # group must exist from the first result on, or results written before the
                    # first consolidator ran could be trimmed unconsolidated.
                    results = self.streams_of(shard).results
                    await ensure_group(self.redis, results, CONSOLIDATION_GROUP)
                await self.applier.ensure_scripts()
                break
            except (*_CONNECTION_ERRORS, RedisError) as exc:
                if not is_server_condition(exc):
                    raise
                log.warning("redis_unavailable", error=str(exc), retry_in=delay)
                await sleep_unless_stopped(delay, self._stopping)
                delay = min(delay * 2, 5.0)
        if self._stopping.is_set():
            return False
        if self.conditions.current is None:
            self._set_ready(True)
        settings, stop = self.settings, self._stopping
        every: list[tuple[float | Callable[[], float], Callable[[], Awaitable[object]], str]] = [
            (settings.reclaim_interval_ms / 1000, self.watch_servers, "servers"),
            (settings.seq_retry_ms / 1000, self.retry_once, "retry"),
            (settings.retention_interval_seconds, self.trim_once, "retention"),
            (settings.lag_probe_seconds, self.probe_lag, "lag"),
            (self.admission.interval, self.admission_once, "admission"),
        ]
        self._tasks = [asyncio.create_task(self.loop.run(stop))] + [
            asyncio.create_task(run_every(interval, step, name, stop, self._periodic_failed))
            for interval, step, name in every
        ]
        log.info("lifecycle_worker_started", consumer=self.consumer, shards=settings.shards)
        return True

    def _periodic_failed(self, condition: ServerCondition | None) -> None:
        if condition is not None:
            self._set_ready(False)
            self._topology_stale = True

    async def stop(self) -> None:
        """Finish the batch in hand; leave the rest pending for another consumer."""
        self._stopping.set()
        self.trimmer.cancel()
        consuming, periodic = self._tasks[:1], self._tasks[1:]
        for task in periodic:
            task.cancel()
        await asyncio.gather(*periodic, return_exceptions=True)
        await asyncio.gather(*consuming, return_exceptions=True)
        while self._inflight:
            await asyncio.sleep(0.01)
        self._set_ready(False)
        await self.applier.close()
        await self.redis.aclose()
        log.info("lifecycle_worker_stopped", consumer=self.consumer)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (``worker.consumers.service.run_until_stopped``)."""
        await run_until_stopped(self.start, stop, self._stopping, self.stop)
