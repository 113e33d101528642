"""Forget a project (or one session of it, or its history before a time) everywhere we keep it.

``forget_everywhere`` is what ``memworker forget``, ``EpisodeStore.forget`` and
``forget_project`` run; it returns a ``ForgetReceipt`` (what was removed, where, how many;
what could not be). In this order, so that nothing forgotten can come back:

1. **Live sessions are marked.** Each session of the scope found in Redis (live, paused or a
   tombstone) loses its working memory and checkpoints, and its ``meta`` hash becomes a marker
   (``state: forgotten`` and when), in one MULTI: from then on the apply function rejects every
   command for it ``forgotten`` (a result with ids only) and its working memory refuses writes.
   A marker expires after ``marker_ttl_ms`` (the tombstone window): the session id is then free.
2. **The erasure record and Postgres, in one transaction** under the project's advisory lock
   (the consolidator holds it shared while it writes): a row of ``erasures`` (ids, the cutoff,
   the counts; never content), then the ``episodes`` (their vectors go with them, ``ON DELETE
   CASCADE``) and ``lifecycle_events`` rows. The cutoff is the later of Postgres's clock once
   the lock is held and Redis's (stream ids), or ``before`` when earlier (never later: when
   Postgres fails the cutoff is Redis's clock or ``before``, whichever is earlier, so a failure
   never widens the erasure): the consolidator stores no result of the scope that occurred
   before it (``worker.erasure.postgres``). (Clocks of the worker's hosts are assumed within
   milliseconds of these; a result stamped by a clock running behind is still covered.)
3. **``P:erased``** (``worker.erasure.erased``) gets the same cutoff, for the replay of
   commands and the DLQ's redrive (a range's: ``P:erased_ranges``, never a cutoff).
4. **Every stream under the prefix** (commands, results, ``P:episodes``, every DLQ, anything a
   replay published there): each entry that carries the scope and is older than the cutoff is
   acknowledged in every group of its stream and deleted (XACK and XDEL in one MULTI), so no
   group keeps it pending. Readers already handle gaps: trimming (``MINID``) and replay ranges
   (``XRANGE``) skip them, and a deleted entry a consumer still held comes back without fields
   and is only acknowledged. The ``memory.forgotten`` events and the ``forgotten`` rejections
   (ids only) are kept.
5. Sessions seen only in Postgres or the streams are marked too (as in 1); the scope's
   sessions' ``seq`` counters and ``/pub`` records, all of them and no other session's, and
   its dedupe records of refused commands are deleted (``worker.erasure.sessions``).
6. **``memory.forgotten``** on ``P:episodes``: the receipt's counts, no content.

With ``before``, only history older than it goes (rows and stream entries): live sessions and
their keys are live state, never "older". With ``since`` too (a range needs both), only history
of ``[since, before)`` goes, and its record covers that range only (``erasures.since``,
``P:erased_ranges``): nothing older is hidden from a replay, nothing of the range comes back.
``dry_run`` counts and changes nothing.

Every argument is checked before anything is touched (``worker.erasure.scope``): a bad one is
a ``ValueError`` naming it. A forget that cannot clear every place is recorded as owed
(``worker.erasure.owed``) with its exact scope and cutoff; the same forget run again settles
it, and ``finish_owed`` (the consolidator's pass) finishes it to exactly that scope and cutoff.

With ``user_id``, only that user's data in the project (or session) goes
(``worker.erasure.users``): the user's sessions (live ones by their ``meta``, finished
ones by their episodes, results and stream entries) and everything of them as above, the
user's turns, facts, blocks and change-feed rows and entries; the erasure record names the
user, so it covers the user's data only. ``''`` is the anonymous bucket (data of no user).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.erasure.erased import record_erased
from worker.erasure.lives import UserScope
from worker.erasure.owed import (
    OWED_GRACE_S,
    Owed,
    load_owed,
    new_erasure_id,
    record_owed,
    settle_redis,
)
from worker.erasure.postgres import forget_rows, store_counts
from worker.erasure.receipt import ForgetReceipt, Found
from worker.erasure.scope import ForgetScope
from worker.erasure.sessions import forget_counters, mark_live, mark_seen, shard_count
from worker.erasure.streams import FORGOTTEN_EVENT, scrub_streams
from worker.errors import ActionableError, one_line
from worker.keys import episodes_stream

DEFAULT_MARKER_TTL_MS = 3_600_000
"""How long a forgotten session's marker is kept when the caller does not say (the default
tombstone window, ``MEMWORKER_TOMBSTONE_TTL_SECONDS``)."""


async def forget_everywhere(
    engine: AsyncEngine,
    redis: Redis | None,
    prefix: str | None,
    project_id: str,
    *,
    session_id: str | None = None,
    before: datetime | None = None,
    dry_run: bool = False,
    marker_ttl_ms: int = DEFAULT_MARKER_TTL_MS,
    shards: int | None = None,
    user_id: str | None = None,
    anonymous_user: bool = False,
    owed: Owed | None = None,
    since: datetime | None = None,
) -> ForgetReceipt:
    """Forget the scope everywhere (see the module doc); never raises for one place that
    fails: its error is in ``receipt.errors``, the other places are still cleared (never
    beyond the scope), and the forget is recorded as owed (``receipt.owed``). Raises
    ``InvalidForgetError`` (a ``ValueError``), touching nothing, for a bad argument.
    ``shards``: ``MEMWORKER_SHARDS`` (default: as the streams under the prefix show it).
    ``user_id``: only that user's data; ``anonymous_user``: only the data of no user.
    ``owed``: finish that owed forget (its scope, cutoff and id; the other selectors unused).
    ``since`` (with ``before``): only the history of ``[since, before)``."""
    if owed is not None:
        scope = ForgetScope.checked(
            owed.project_id,
            owed.session_id,
            owed.before,
            owed.user_id or None,
            owed.user_id == "",
            owed.since,
        )
    else:
        scope = ForgetScope.checked(project_id, session_id, before, user_id, anonymous_user, since)
    receipt = ForgetReceipt(scope.project_id, scope.session_id, scope.before, dry_run, scope.user)
    receipt.since = scope.since
    if not dry_run:
        receipt.erasure_id = owed.erasure_id if owed is not None else new_erasure_id()
    fixed = owed.cutoff if owed is not None else None
    found = Found()
    live = redis is not None and prefix is not None
    if live and scope.before is None:
        assert redis is not None and prefix is not None
        started_before = None if fixed is None else _ms(fixed)
        await _step(
            receipt,
            "redis working memory",
            mark_live(redis, prefix, receipt, found, marker_ttl_ms, started_before),
        )
    redis_now = None
    if live:  # the cutoff is the later of Redis's clock (stream ids) and Postgres's
        assert redis is not None
        with contextlib.suppress(Exception):  # unreachable: its own steps will say so
            seconds, micros = await redis.time()
            redis_now = datetime.fromtimestamp(seconds + micros / 1e6, UTC)
    written = owed.written_before if owed is not None else None
    await _step(receipt, "postgres", forget_rows(engine, receipt, found, redis_now, fixed, written))
    if receipt.cutoff is None:  # Postgres did not decide it: never later than asked
        now = fixed or redis_now or datetime.now(UTC)
        receipt.cutoff = now if scope.before is None else min(now, scope.before)
        receipt.written_before = written if owed is not None else now
    if live:
        assert redis is not None and prefix is not None
        await _clear_redis(redis, prefix, receipt, found, marker_ttl_ms, shards)
    if dry_run:
        return receipt
    if live and receipt.ok:
        assert redis is not None and prefix is not None
        await _step(receipt, "redis owed record", settle_redis(redis, prefix, receipt))
    await _step(receipt, "postgres erasure counts", store_counts(engine, receipt))
    if not receipt.ok and await record_owed(engine, redis, prefix, receipt) is None:
        receipt.errors.append("owed record: neither Postgres nor Redis could keep it")
    return receipt


async def _clear_redis(
    redis: Redis,
    prefix: str,
    receipt: ForgetReceipt,
    found: Found,
    marker_ttl_ms: int,
    shards: int | None,
) -> None:
    """Steps 3 to 6: ``P:erased``, the streams, the sessions seen, counters, the event."""
    assert receipt.cutoff is not None
    cutoff_ms = _ms(receipt.cutoff)
    if not receipt.dry_run:
        await _step(
            receipt,
            "redis erasure record",
            _record(redis, prefix, receipt, cutoff_ms, shards),
        )
    await _step(receipt, "redis streams", _scrub_streams(redis, prefix, receipt, found, cutoff_ms))
    if receipt.before is None:
        await _step(
            receipt,
            "redis sessions",
            _mark_seen(redis, prefix, receipt, found, marker_ttl_ms, shards),
        )
        await _step(receipt, "redis counters", forget_counters(redis, prefix, receipt, found))
    if not receipt.dry_run:
        await _step(receipt, "memory.forgotten event", _announce(redis, prefix, receipt))


async def _step(receipt: ForgetReceipt, where: str, work: Any) -> None:
    try:
        await work
    except Exception as exc:  # the receipt says what could not be removed; the rest goes on
        receipt.errors.append(f"{where}: {one_line(exc)}")


def _ms(instant: datetime) -> int:
    return int(instant.timestamp() * 1000)


async def _record(
    redis: Redis, prefix: str, receipt: ForgetReceipt, cutoff_ms: int, shards: int | None
) -> None:
    await record_erased(
        redis,
        prefix,
        receipt.project_id,
        receipt.session_id,
        cutoff_ms,
        user_id=receipt.user_id,
        shards=shards or await shard_count(redis, prefix),
        since_ms=None if receipt.since is None else _ms(receipt.since),
    )


async def _mark_seen(
    redis: Redis,
    prefix: str,
    receipt: ForgetReceipt,
    found: Found,
    ttl_ms: int,
    shards: int | None,
) -> None:
    await mark_seen(
        redis, prefix, shards or await shard_count(redis, prefix), receipt, found, ttl_ms
    )


async def _scrub_streams(
    redis: Redis, prefix: str, receipt: ForgetReceipt, found: Found, cutoff_ms: int
) -> None:
    scrubbed = await scrub_streams(
        redis,
        prefix,
        receipt.project_id,
        receipt.session_id,
        cutoff_ms,
        receipt.dry_run,
        None
        if receipt.user_id is None
        else UserScope(receipt.user_id, set(found.sessions), set(found.episode_ids)),
        None if receipt.since is None else _ms(receipt.since),
        found.fact_ids,
    )
    receipt.streams.update(scrubbed.removed)
    found.sessions.update(scrubbed.sessions)
    found.result_ids.update(scrubbed.result_ids)
    found.holders.update(scrubbed.holders)  # the streams' latest life wins over Postgres's


async def _announce(redis: Redis, prefix: str, receipt: ForgetReceipt) -> None:
    event = {
        "type": FORGOTTEN_EVENT,
        "event_id": receipt.erasure_id or new_erasure_id(),
        "project_id": receipt.project_id,
        "session_id": receipt.session_id,
        "user_id": receipt.user_id,
        "before": receipt.before.isoformat() if receipt.before else None,
        "since": receipt.since.isoformat() if receipt.since else None,
        "cutoff": receipt.cutoff.isoformat() if receipt.cutoff else None,
        "occurred_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "counts": receipt.counts(),
        "complete": receipt.ok,
    }
    await redis.xadd(episodes_stream(prefix), {"data": orjson.dumps(event)})


async def finish_owed(
    engine: AsyncEngine,
    redis: Redis | None,
    prefix: str | None,
    *,
    marker_ttl_ms: int = DEFAULT_MARKER_TTL_MS,
    shards: int | None = None,
    grace_seconds: float = OWED_GRACE_S,
    project_id: str | None = None,
) -> list[ForgetReceipt]:
    """Finish every forget still owed (recorded at least ``grace_seconds`` ago; of
    ``project_id`` only, when given), each to exactly its recorded scope and cutoff: a receipt
    each (one that fails again stays owed)."""
    receipts = []
    for owed in await load_owed(engine, redis, prefix, grace_seconds, project_id):
        receipts.append(
            await forget_everywhere(
                engine,
                redis,
                prefix,
                owed.project_id,
                marker_ttl_ms=marker_ttl_ms,
                shards=shards,
                owed=owed,
            )
        )
    return receipts


@dataclass(frozen=True, slots=True)
class ForgetResult:
    """How many rows and keys ``forget_project`` actually removed; ``receipt`` says everything
    it removed, where (``worker.erasure.receipt.ForgetReceipt``)."""

    episodes: int = 0
    lifecycle_events: int = 0
    redis_keys: int = 0
    receipt: ForgetReceipt | None = field(default=None, compare=False)


class ForgetIncompleteError(ActionableError, RuntimeError):
    """A forget that could not remove everything: ``receipt`` says what went and what not, and
    where the forget is recorded as owed (a retry finishes it)."""

    def __init__(self, receipt: ForgetReceipt) -> None:
        self.receipt = receipt
        owed = f"; it is owed (recorded in {receipt.owed})" if receipt.owed else ""
        super().__init__(
            f"forget of project {receipt.project_id} is incomplete: "
            + "; ".join(receipt.errors)
            + owed
            + " (run it again: what was removed stays removed)"
        )


async def forget_project(
    engine: AsyncEngine,
    project_id: str,
    *,
    session_id: str | None = None,
    before: datetime | None = None,
    redis: Redis | None = None,
    prefix: str | None = None,
    dry_run: bool = False,
    marker_ttl_ms: int = DEFAULT_MARKER_TTL_MS,
    shards: int | None = None,
    user_id: str | None = None,
    anonymous_user: bool = False,
    since: datetime | None = None,
) -> ForgetResult:
    """Forget the project (one session's, the history older than ``before``, when given)
    everywhere memworker keeps it: ``forget_everywhere``, the code ``memworker forget`` runs.
    Without ``redis`` and ``prefix`` only Postgres is cleared.

    ``user_id``: only that user's data in the project (or session): sessions, turns, facts,
    blocks, change-feed rows and entries. ``user_id=None`` is no user selector (the whole
    project); the anonymous bucket (data of no user) is forgotten only with
    ``anonymous_user=True`` (``Memory.forget(user_id=None)``'s meaning).

    ``before`` narrows only the history: working memory is live state, never "older";
    ``since`` (with ``before``) narrows it to the range ``[since, before)``.
    Raises ``InvalidForgetError`` (a ``ValueError``; nothing touched) for a bad argument and
    ``ForgetIncompleteError`` (with the receipt; the forget is owed) when anything could not
    be removed.
    """
    receipt = await forget_everywhere(
        engine,
        redis,
        prefix,
        project_id,
        session_id=session_id,
        before=before,
        dry_run=dry_run,
        marker_ttl_ms=marker_ttl_ms,
        shards=shards,
        user_id=user_id,
        anonymous_user=anonymous_user,
        since=since,
    )
    if not receipt.ok:
        raise ForgetIncompleteError(receipt)
    return ForgetResult(
        receipt.postgres.get("episodes", 0),
        receipt.postgres.get("lifecycle_events", 0),
        receipt.redis.get("working_memory_keys", 0),
        receipt,
    )
