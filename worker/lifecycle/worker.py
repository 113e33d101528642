"""The lifecycle worker: a FastStream app reading ``P:lifecycle:{i}`` in group ``lifecycle``.

FastStream's batch subscriber (manual acknowledgement) reads new entries; the apply function
acknowledges each entry atomically with its effect. Around it this module fills FastStream's
gaps on Redis streams: the consumer's own pending entries are drained on start, a
reclaim loop (XAUTOCLAIM) takes over entries of dead consumers, a delivery cap moves poison to
the DLQ, and entries whose ``seq`` is ahead wait in a retry book whose leases are renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy
from faststream.redis import RedisBroker, StreamSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from worker.connections import client_for
from worker.consumers.loop import default_consumer_name
from worker.consumers.loop import ensure_group as ensure_group
from worker.consumers.retention import trim_stream
from worker.keys import CONSOLIDATION_GROUP, LIFECYCLE_GROUP, StreamKeys
from worker.lifecycle.apply import COMMANDS_PER_CALL, CommandApplier, Outcome, Plan
from worker.logs import get_logger
from worker.metrics import (
    ADMISSION_CLOSED,
    APPLY_SECONDS,
    BATCH_SIZE,
    COMMANDS,
    DEAD_LETTERS,
    READY,
    REDIS_CONDITIONS,
    STREAM_LAG,
    STREAM_PENDING,
    TRIMMED_WHILE_FULL,
)
from worker.ops.capacity import CapacityGauges
from worker.redis_conditions import ServerCondition, is_server_condition, server_condition
from worker.settings import Settings

log = get_logger("memworker.lifecycle")

Entry = tuple[bytes | str, Mapping[bytes, bytes]]
IN_FLIGHT = 2
"""Batches sent and not yet answered: two keep both Redis and the worker busy."""
_CONNECTION_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


async def keep_raw_message(message: Any, original: Any) -> StreamMessage[Any]:
    """FastStream parser that skips body decoding: junk must reach our intake, not crash a
    parser. The batch's entry ids and fields stay in ``raw_message``."""
    return StreamMessage(raw_message=message, body=b"")


async def raw_entries(message: StreamMessage[Any], original: Any) -> Any:
    """FastStream decoder handing the handler the raw batch (``message_ids``, ``data``)."""
    return message.raw_message


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


BATCH_HEADROOM_BYTES = 8 * 1024 * 1024
"""With less room than this (or the admission reserve, if larger) under a server's maxmemory,
at the last check (every MEMWORKER_ADMISSION_INTERVAL_MS), the worker sends one command per
apply call instead of up to ``COMMANDS_PER_CALL``: Redis refuses a call that may grow memory
only when it starts, so a call of 64 commands could pass maxmemory by 64 commands' writes."""


class LifecycleWorker:
    """One consumer of every lifecycle shard stream."""

    def __init__(self, settings: Settings, *, consumer: str | None = None) -> None:
        self.settings = settings
        self.consumer = consumer or default_consumer_name()
        self.redis = client_for(settings, health_check_interval=10)
        self.applier = CommandApplier(self.redis, settings)
        self.retry = RetryBook()
        self.capacity = CapacityGauges(settings)
        self.ready = False
        self._stopping = asyncio.Event()
        self._inflight = 0
        self._window = asyncio.Semaphore(IN_FLIGHT)
        self._settling: set[asyncio.Task[None]] = set()
        self._counters: dict[tuple[str, str, str], Any] = {}
        self._topology_stale = False
        self._condition: ServerCondition | None = None
        self._condition_streak = 0
        self._condition_logged: dict[str, float] = {}
        self._trimming_while_full: asyncio.Task[None] | None = None
        self._closed_servers: set[str] = set()
        """The servers (URLs) past maxmemory less the reserve: admission closed there."""
        self._tight_servers: set[str] = set()
        """Servers with less room under maxmemory than ``BATCH_HEADROOM_BYTES`` (or the
        reserve) at the last check: one command per apply call there."""
        self._near_full_servers: set[str] = set()
        """Servers with less room under their admission limit than the reserve (or
        ``BATCH_HEADROOM_BYTES``), or past it, at the last check: checked every
        ``admission_interval_near_full_ms`` instead of ``admission_interval_ms``."""
        self._admission_refused = False
        self._trimmed_logged_at, self._trimmed_unlogged = -60.0, 0
        self.brokers: dict[str, RedisBroker] = {}

    def streams(self, shard: int) -> StreamKeys:
        return StreamKeys(self.settings.stream_prefix, shard)

    # -- reading new entries (FastStream) -------------------------------------------------

    def _subscribe(self, broker: RedisBroker, shard: int) -> None:
        stream = StreamSub(
            self.streams(shard).lifecycle,
            group=LIFECYCLE_GROUP,
            consumer=self.consumer,
            batch=True,
            max_records=self.settings.batch_size,
            polling_interval=self.settings.block_ms,
            last_id=">",
        )

        async def handle(raw: Any) -> None:
            entries = list(zip(raw["message_ids"], raw["data"], strict=True))
            await self.dispatch(shard, entries)

        broker.subscriber(
            stream=stream,
            parser=keep_raw_message,
            decoder=raw_entries,
            ack_policy=AckPolicy.MANUAL,
        )(handle)

    # -- applying ---------------------------------------------------------------------------

    async def dispatch(self, shard: int, entries: Sequence[Entry]) -> None:
        """Send a batch and return before its replies arrive, so the next batch is read and
        parsed while Redis runs this one. At most ``IN_FLIGHT`` batches are outstanding; they
        share one connection, so Redis applies them in the order they were read.

        While Redis is full this batch is held like the others and reading stops until Redis
        serves again: each entry read grows the group's pending list, a write Redis allows
        past ``maxmemory``."""
        if self._full():
            for entry_id, fields in entries:
                self.retry.hold(shard, _text(entry_id), fields, 0.0, waiting=False, error=False)
            while self._full() and not self._stopping.is_set():
                await asyncio.sleep(0.05)
            return
        await self._window.acquire()
        started = time.perf_counter()
        try:
            channel = self.applier.channel_for(shard)
            if not channel.connected:
                await channel.connect()
            plan = self.applier.plan(shard, entries, started)
            future = channel.submit(plan.commands)
        except _CONNECTION_ERRORS as exc:
            self._window.release()
            self._unreachable(shard, entries, exc)
            return
        except BaseException:
            self._window.release()  # else two failures leave the worker waiting forever
            raise
        self._inflight += 1
        task = asyncio.create_task(self._complete(plan, future))
        self._settling.add(task)
        task.add_done_callback(self._settled)

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._settling.discard(task)
        self._inflight -= 1
        self._window.release()
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
            self.retry.hold(shard, _text(entry_id), fields, 1.0, waiting=False, error=False)

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
            self._held_by_condition(shard, blocked, {_text(i): f for i, f in entries})
            outcomes = [o for o in outcomes if o.status != "unreachable"]
            if not outcomes:
                return
        elif self._condition is None or any(o.status != "wait" for o in outcomes):
            # Redis wrote (or nothing was wrong): it serves
            self._condition_cleared()
        BATCH_SIZE.labels(LIFECYCLE_GROUP).observe(len(entries))
        APPLY_SECONDS.labels(LIFECYCLE_GROUP).observe(time.perf_counter() - started)
        fields_by_id = {_text(i): f for i, f in entries}
        for outcome in outcomes:
            await self._settle(shard, outcome, fields_by_id[outcome.entry_id])

    async def _settle(self, shard: int, outcome: Outcome, fields: Mapping[bytes, bytes]) -> None:
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
            if self._condition is not None or held.waiting_since is None:
                # The clock starts at the first wait Redis answers while it serves. Its
                # predecessor may still be held by a condition (or retried later than it): the
                # gap is Redis's, not the orchestrator's, until the predecessor had its chance.
                held.waiting_since = now
            elif now - held.waiting_since > self.settings.seq_gap_timeout_seconds:
                self.retry.release(shard, outcome.entry_id)
                await self._dead(
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
                await self._dead(
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

    async def _dead(
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

    def _held_by_condition(
        self, shard: int, blocked: Sequence[Outcome], fields: Mapping[str, Mapping[bytes, bytes]]
    ) -> None:
        """Redis refused these entries for a server-wide reason (full, busy, loading, a
        failover: ``worker.redis_conditions``): not their fault. Hold them without counting an
        attempt, report not ready, and retry with a backoff that grows while the condition
        lasts (capped below the reclaim idle time, so the lease renewal keeps them ours)."""
        condition = server_condition(blocked[0].detail) or ServerCondition(
            "unreachable", blocked[0].detail
        )
        REDIS_CONDITIONS.labels(condition.kind).inc()
        self._topology_stale = True  # a failover or resharding: learn where shards live now
        self._set_ready(False)
        self._condition_streak += 1
        cap = min(5.0, self.settings.reclaim_idle_ms / 3000)
        delay = min(cap, 0.2 * 2 ** min(self._condition_streak - 1, 10))
        for outcome in blocked:
            self.retry.hold(
                shard, outcome.entry_id, fields[outcome.entry_id], delay, waiting=False, error=False
            )
        now = time.monotonic()
        if now - self._condition_logged.get(condition.kind, -60.0) >= 10.0:  # once per 10 s
            self._condition_logged[condition.kind] = now
            log.warning(
                "redis_condition",
                condition=condition.kind,
                advice=condition.message,
                error=blocked[0].detail,
                held=len(blocked),
            )
        self._condition = condition
        self._update_pressure()
        if condition.kind == "full":
            self._trim_soon()

    def _full(self) -> bool:
        return self._condition is not None and self._condition.kind == "full"

    def _update_pressure(self) -> None:
        """Under memory pressure (admission closed, or Redis refusing writes as full) each
        applied command's entry is deleted with its acknowledgement. Near maxmemory (less room
        than ``BATCH_HEADROOM_BYTES`` or the admission reserve) each command goes to Redis in a
        call of its own: Redis checks ``maxmemory`` once per call, so a call of one command can
        pass the limit by one command's writes at most, not a batch's."""
        nearly_full = self._admission_closed or self._full()
        self.applier.pressure = self.settings.trim_when_full and nearly_full
        tight = nearly_full or bool(self._tight_servers)
        self.applier.commands_per_call = 1 if tight else COMMANDS_PER_CALL

    def _trim_soon(self) -> None:
        trimming = self._trimming_while_full
        if self.settings.trim_when_full and (trimming is None or trimming.done()):
            self._trimming_while_full = asyncio.create_task(self._trim_while_full())

    async def _trim_while_full(self) -> None:
        """Redis is (nearly) full and accepted commands need memory to be applied: trim what every
        group has finished with now, not when the replay window ends (results stay replayable
        from Postgres: ``memworker replay results --source postgres``). Once a second at most."""
        removed = 0
        try:
            removed = await self.trim_once(keep_seconds=0)
        except (*_CONNECTION_ERRORS, RedisError) as exc:
            log.warning("trim_while_full_failed", error=str(exc))
        if removed:
            TRIMMED_WHILE_FULL.inc(removed)
            self._trimmed_unlogged += removed
            now = time.monotonic()
            if now - self._trimmed_logged_at >= 10.0:  # once per 10 s at most
                log.warning(
                    "trimmed_while_full",
                    removed=self._trimmed_unlogged,
                    advice="Redis is (nearly) full: entries every group had finished with were "
                    "trimmed before their replay window ended; raise maxmemory or lower the "
                    "offered rate",
                )
                self._trimmed_logged_at, self._trimmed_unlogged = now, 0
        await asyncio.sleep(1.0)

    def _condition_cleared(self) -> None:
        if self._condition is not None:
            log.debug("redis_condition_cleared", condition=self._condition.kind)
            self._condition = None
            self._update_pressure()
            now = time.monotonic()
            for held in self.retry.held.values():
                if held.waiting_since is not None:  # a gap's clock starts once Redis serves
                    held.waiting_since = now
                if not held.waiting:  # what the condition held goes first, not after its backoff
                    held.due = min(held.due, now)
        self._condition_streak = 0
        self._set_ready(True)

    def _set_ready(self, value: bool) -> None:
        if value != self.ready:
            self.ready = value
            READY.set(1 if value else 0)

    # -- recovery ---------------------------------------------------------------------------

    async def drain_own_pending(self, shard: int) -> int:
        """Re-process this consumer's own pending entries (a restart with a fixed name)."""
        stream = self.streams(shard).lifecycle
        done = 0
        last = "0"
        while True:
            reply: Any = await self.redis.xreadgroup(
                LIFECYCLE_GROUP, self.consumer, {stream: last}, count=self.settings.batch_size
            )
            entries = [(i, f) for i, f in reply[0][1] if f] if reply else []
            if not entries:
                return done
            await self.apply_batch(shard, entries)
            done += len(entries)
            last = _text(entries[-1][0])

    async def reclaim_once(self, shard: int) -> int:
        """Take over entries idle longer than the reclaim time; dead-letter over-delivered ones."""
        stream = self.streams(shard).lifecycle
        start = "0-0"
        total = 0
        while True:
            reply: Any = await self.redis.xautoclaim(
                stream,
                LIFECYCLE_GROUP,
                self.consumer,
                min_idle_time=self.settings.reclaim_idle_ms,
                start_id=start,
                count=self.settings.batch_size,
            )
            start = _text(reply[0])
            claimed = [(i, f) for i, f in reply[1] if f]
            if claimed:
                counts = await self._deliveries(stream, claimed)
                good: list[Entry] = []
                for entry_id, fields in claimed:
                    n = counts.get(_text(entry_id), 1)
                    # An entry this worker holds (waiting for Redis to recover, or for a seq
                    # gap) was delivered again by its own lease lapsing, not by a crash.
                    ours = (shard, _text(entry_id)) in self.retry.held
                    if n > self.settings.max_deliveries and not ours:
                        await self._dead(
                            shard,
                            _text(entry_id),
                            fields,
                            "max_deliveries",
                            f"delivered {n} times without being applied",
                            n,
                        )
                    else:
                        good.append((entry_id, fields))
                await self.apply_batch(shard, good)
                total += len(claimed)
            # An empty page is not the end: XAUTOCLAIM scans at most COUNT×10 pending entries a
            # call, so idle entries deep behind busy ones are reached by following the cursor.
            if start == "0-0":
                return total

    async def _deliveries(self, stream: str, claimed: Sequence[Entry]) -> dict[str, int]:
        """Delivery counts of exactly these entries (one XPENDING each, in one pipeline: a
        range query could stop short at other pending entries of this consumer)."""
        pipe = self.redis.pipeline(transaction=False)
        for entry_id, _fields in claimed:
            pipe.xpending_range(stream, LIFECYCLE_GROUP, min=entry_id, max=entry_id, count=1)
        counts: dict[str, int] = {}
        for rows in await pipe.execute():
            for row in rows:
                counts[_text(row["message_id"])] = int(row["times_delivered"])
        return counts

    async def retry_once(self) -> None:
        """Apply held entries that are due; renew their leases so nobody reclaims them."""
        for shard, items in self.retry.due().items():
            stream = self.streams(shard).lifecycle
            ids = [entry_id for entry_id, _ in items]
            with_lease: Any = await self.redis.xclaim(
                stream,
                LIFECYCLE_GROUP,
                self.consumer,
                min_idle_time=0,
                message_ids=list(ids),
                justid=True,
            )
            owned = {_text(i) for i in with_lease}
            for entry_id in ids:
                if entry_id not in owned:  # acknowledged elsewhere or trimmed
                    self.retry.release(shard, entry_id)
            batch = [(entry_id, held.fields) for entry_id, held in items if entry_id in owned]
            await self.apply_batch(shard, batch)

    async def _loop(self, every: float | Callable[[], float], step: Any, name: str) -> None:
        """Run ``step`` every ``every`` seconds (a callable: asked before each wait), backing
        off while Redis is unavailable."""

        def interval() -> float:
            return every() if callable(every) else every

        backoff = interval()
        while not self._stopping.is_set():
            try:
                await step()
                backoff = interval()
            except (*_CONNECTION_ERRORS, RedisError) as exc:
                if (condition := server_condition(exc)) is None:
                    log.error("loop_error", loop=name, error=str(exc))
                else:
                    REDIS_CONDITIONS.labels(condition.kind).inc()
                    self._set_ready(False)
                    self._topology_stale = True
                    backoff = min(backoff * 2, 5.0)
                    log.warning(
                        "redis_unavailable",
                        loop=name,
                        condition=condition.kind,
                        error=str(exc),
                        retry_in=backoff,
                    )
            except Exception as exc:  # a bug must not end the reclaim/retry loop for good
                log.exception("loop_error", loop=name, error=repr(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=backoff)

    async def supervise_once(self) -> None:
        """Restart FastStream subscribers that stopped for good.

        FastStream stops a stream subscriber when its group disappears (a Redis restarted
        without persistence, a deleted stream): recreate the groups and start a new broker.
        """
        for url, broker in list(self.brokers.items()):
            if self._stopping.is_set() or all(sub.running for sub in broker.subscribers):
                continue
            shards = [s for s in range(self.settings.shards) if self.applier.url_of(s) == url]
            log.warning("subscriber_restarting", url=url, shards=shards)
            for shard in shards:
                await ensure_group(self.redis, self.streams(shard).lifecycle, LIFECYCLE_GROUP)
            await broker.stop()
            fresh = RedisBroker(url, logger=None)  # type: ignore[arg-type]
            for shard in shards:
                self._subscribe(fresh, shard)
            await fresh.start()
            self.brokers[url] = fresh

    async def _reclaim_all(self) -> None:
        if self._topology_stale:
            await self.refresh_topology()
        await self.supervise_once()
        for shard in range(self.settings.shards):
            await self.reclaim_once(shard)
        # Every server answered as a writable primary: ready again after an outage, even if
        # no new command arrives to prove it.
        await self.applier.ping()
        self._topology_stale = False
        if self._condition is None or not any(
            not held.waiting for held in self.retry.held.values()
        ):  # nothing held back by a condition: the next command will tell
            self._condition_cleared()

    async def refresh_topology(self) -> None:
        """After a failover or resharding: learn which server holds each shard again, and
        restart the FastStream readers whose server changed."""
        if not (self.settings.redis_cluster or self.settings.redis_sentinel_service):
            return
        before = {shard: self.applier.url_of(shard) for shard in range(self.settings.shards)}
        await self.applier.resolve()
        after = {shard: self.applier.url_of(shard) for shard in range(self.settings.shards)}
        if after == before:
            return
        log.warning("topology_changed", before=before, after=after)
        await self.applier.ensure_scripts()
        for broker in self.brokers.values():
            await broker.stop()
        self.brokers = {}
        await self._start_brokers()

    async def probe_lag(self) -> None:
        """Refresh the lag and pending gauges (slowly: never on the hot path)."""
        for shard in range(self.settings.shards):
            stream = self.streams(shard).lifecycle
            groups: Any = await self.redis.xinfo_groups(stream)
            for group in groups:
                name = _text(group["name"])
                lag = group.get("lag")
                STREAM_LAG.labels(stream, name).set(float(lag) if lag is not None else 0.0)
                STREAM_PENDING.labels(stream, name).set(float(group["pending"]))
        await self.capacity.refresh_gauges(self.redis)

    async def trim_once(self, keep_seconds: float | None = None) -> int:
        """Trim lifecycle and results streams below what every group has acknowledged, keeping
        ``keep_seconds`` of it for replay (default: the retention setting)."""
        keep = self.settings.retention_seconds if keep_seconds is None else keep_seconds
        removed = 0
        for shard in range(self.settings.shards):
            streams = self.streams(shard)
            for stream in (streams.lifecycle, streams.results):
                removed += await trim_stream(self.redis, stream, keep)
        return removed

    async def admission_once(self) -> None:
        """Refuse new publishes (``LifecycleClient``, ``memworker publish``) on every server
        past maxmemory less ``admission_reserve``: the commands already accepted need that
        memory to be applied (results, session state). Redis itself refuses every write that
        may grow memory past maxmemory, applies included: without a reserve, publishers could
        fill it with commands nobody can apply. Each server (a cluster node, the Sentinel's
        primary, the one server) is judged by its own ``INFO memory``, for its own shards."""
        reserve = self.settings.admission_reserve
        servers: dict[str, list[int]] = {}
        for shard in range(self.settings.shards):
            servers.setdefault(self.applier.url_of(shard), []).append(shard)
        was_closed, was_tight = self._admission_closed, bool(self._tight_servers)
        self._closed_servers &= servers.keys()  # a server no longer holding a shard (failover)
        self._tight_servers &= servers.keys()
        self._near_full_servers &= servers.keys()
        try:
            for url, shards in servers.items():
                await self._admit(url, shards, reserve)
        finally:  # what earlier servers changed holds even if a later one failed to answer
            if self._admission_closed != was_closed:
                ADMISSION_CLOSED.set(1 if self._admission_closed else 0)
            if self._admission_closed != was_closed or bool(self._tight_servers) != was_tight:
                self._update_pressure()
        if self._admission_closed:
            self._trim_soon()

    def _admission_interval(self) -> float:
        """Seconds to the next admission check: shorter near a server's limit."""
        if self._near_full_servers:  # past the limit (admission closed) counts as near
            return self.settings.admission_interval_near_full_ms / 1000
        return self.settings.admission_interval_ms / 1000

    @property
    def _admission_closed(self) -> bool:
        return bool(self._closed_servers)

    async def _admit(self, url: str, shards: list[int], reserve: float) -> None:
        channel = self.applier.channel_for(shards[0])
        (info,) = await channel.execute([["INFO", "memory"]])
        if isinstance(info, Exception):
            raise info
        figures = _info_fields(info)
        cap = figures.get("maxmemory", 0)
        used = figures.get("used_memory", 0) - figures.get("mem_not_counted_for_evict", 0)
        margin = max(BATCH_HEADROOM_BYTES, cap * reserve)
        if cap and cap - used < margin:
            self._tight_servers.add(url)
        else:
            self._tight_servers.discard(url)
        limit = int(cap * (1 - reserve))
        if cap and limit - used < margin:
            self._near_full_servers.add(url)
        else:
            self._near_full_servers.discard(url)
        if reserve <= 0 or self._admission_refused:
            return
        keys = [self.streams(shard).admission for shard in shards]
        if cap and used >= limit:
            reason = (
                f"Redis is nearly full: used_memory {_mb(used)} is past {_mb(limit)} (maxmemory "
                f"{_mb(cap)} less MEMWORKER_ADMISSION_RESERVE {reserve:.0%}, kept for applying "
                "the commands already accepted); retry later, or raise maxmemory"
            )
            expiry_ms = max(2_000, 8 * self.settings.admission_interval_ms)  # outlives a stall
            # Refused past maxmemory (OOM): Redis then refuses the publishes by itself.
            replies = await channel.execute([["SET", k, reason, "PX", expiry_ms] for k in keys])
            denied = [r for r in replies if isinstance(r, Exception) and "NOPERM" in str(r)]
            if denied:
                self._admission_refused = True  # an ACL from before admission: say it once
                log.error(
                    "admission_unavailable",
                    error=str(denied[0]),
                    advice="grant this Redis user SET DEL on ~<prefix>:admission:* "
                    "(deploy/redis/users.acl); until then publishes are refused only at maxmemory",
                )
                return
            if url not in self._closed_servers:
                log.warning("admission_closed", reason=reason, shards=shards)
                self._closed_servers.add(url)
        elif url in self._closed_servers:
            await channel.execute([["DEL", k] for k in keys])  # one key per call: any slots
            log.info("admission_open", used=used, limit=limit, shards=shards)
            self._closed_servers.discard(url)

    # -- running ----------------------------------------------------------------------------

    async def start(self) -> bool:
        """Create groups, load scripts, drain own pending entries, start reading.

        Retries while Redis is unreachable, until it answers or ``stop()`` is called; returns
        whether the worker started (False: asked to stop first)."""
        delay = 0.2
        while not self._stopping.is_set():
            try:
                for shard in range(self.settings.shards):
                    streams = self.streams(shard)
                    await ensure_group(self.redis, streams.lifecycle, LIFECYCLE_GROUP)
                    # Retention trims results below every group's position: the consolidation
                    # group must exist from the first result on, or results written before the
                    # first consolidator ran could be trimmed unconsolidated.
                    await ensure_group(self.redis, streams.results, CONSOLIDATION_GROUP)
                await self.applier.ensure_scripts()
                for shard in range(self.settings.shards):
                    await self.drain_own_pending(shard)
                await self._start_brokers()  # FastStream's XGROUP CREATE: refused when full
                break
            except (*_CONNECTION_ERRORS, RedisError) as exc:
                if not is_server_condition(exc):
                    raise
                for broker in self.brokers.values():
                    await broker.stop()
                self.brokers = {}
                log.warning("redis_unavailable", error=str(exc), retry_in=delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)
                delay = min(delay * 2, 5.0)
        if self._stopping.is_set():
            return False
        if self._condition is None:
            self._set_ready(True)
        self._tasks = [
            asyncio.create_task(
                self._loop(self.settings.reclaim_interval_ms / 1000, self._reclaim_all, "reclaim")
            ),
            asyncio.create_task(
                self._loop(self.settings.seq_retry_ms / 1000, self.retry_once, "retry")
            ),
            asyncio.create_task(
                self._loop(self.settings.retention_interval_seconds, self.trim_once, "retention")
            ),
            asyncio.create_task(self._loop(self.settings.lag_probe_seconds, self.probe_lag, "lag")),
            asyncio.create_task(
                self._loop(self._admission_interval, self.admission_once, "admission")
            ),
        ]
        log.info("lifecycle_worker_started", consumer=self.consumer, shards=self.settings.shards)
        return True

    async def _start_brokers(self) -> None:
        """One FastStream broker per server: on a Redis Cluster each reads the shards whose
        streams live on that node; standalone, one broker reads every shard."""
        for shard in range(self.settings.shards):
            url = self.applier.url_of(shard)
            if url not in self.brokers:
                self.brokers[url] = RedisBroker(url, logger=None)  # type: ignore[arg-type]
            self._subscribe(self.brokers[url], shard)
        for broker in self.brokers.values():
            await broker.start()

    async def stop(self) -> None:
        """Finish the batch in hand; leave the rest pending for another consumer."""
        self._stopping.set()
        for broker in self.brokers.values():
            await broker.stop()
        if self._trimming_while_full is not None:
            self._trimming_while_full.cancel()
        for task in getattr(self, "_tasks", []):
            task.cancel()
        await asyncio.gather(*getattr(self, "_tasks", []), return_exceptions=True)
        while self._inflight:
            await asyncio.sleep(0.01)
        self._set_ready(False)
        await self.applier.close()
        await self.redis.aclose()
        log.info("lifecycle_worker_stopped", consumer=self.consumer)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, in every state: starting (Redis unreachable), consuming,
        or riding out an outage. A start-up step that hangs is cancelled when ``stop`` comes."""
        starting = asyncio.create_task(self.start())
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                await starting  # a start-up failure that is no outage ends the run here
                await stop.wait()
            else:
                self._stopping.set()  # the retry loop notices between tries ...
                await asyncio.wait({starting}, timeout=1.0)
                starting.cancel()  # ... and a try that hangs is cancelled
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
        finally:
            stopped.cancel()
            await self.stop()


def _info_fields(reply: bytes | str) -> dict[str, int]:
    """The integer fields of an ``INFO`` reply."""
    text = reply.decode() if isinstance(reply, bytes) else reply
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if value.isdigit():
            out[name] = int(value)
    return out


def _mb(n: int) -> str:
    return f"{n / 1_048_576:.2f}M"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
