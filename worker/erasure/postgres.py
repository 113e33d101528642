"""A forget's Postgres step (``worker.erasure.forget``, step 2): the erasure record and the
rows it covers, in one transaction under the project's advisory lock (the consolidator holds
it shared while it writes), and the record made complete once every place is cleared.

The instant the forget takes effect (``written_before``) is decided here, once the lock is held:
the later of Postgres's clock and Redis's (stream ids); the cutoff is that, or ``before`` when
earlier. It removes the rows written before that instant (``recorded_at``; a fact's
``written_at``; a block holding text written before it, ``content_since``) whose
``occurred_at`` (a fact's ``recorded_at``; a block's text, ``content_since`` to ``updated_at``)
is in its range (``before``, ``since``: none, all of them); the feed's
outbox rows by their event's ``occurred_at`` (before the cutoff, finishing an owed forget). A
forget still owed (``worker.erasure.owed``) keeps the instant and cutoff it was given, so
finishing it never removes what was written after it; one owed since before migration 0011 (no
instant) removes what occurred (facts: were recorded) before its cutoff, as it did.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ColumnElement, and_, column, delete, func, or_, select, table, update
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from worker.db.erasures import lock_project
from worker.db.models import Episode, Erasure, LifecycleEvent
from worker.db.vectors import VECTOR_TABLE, has_vector_table
from worker.erasure.receipt import ForgetReceipt, Found
from worker.erasure.scope import row_scope
from worker.erasure.session_facts import forget_session_facts
from worker.erasure.users import forget_user_tables, session_holders, user_sessions


async def forget_rows(
    engine: AsyncEngine,
    receipt: ForgetReceipt,
    found: Found,
    redis_now: datetime | None,
    fixed_cutoff: datetime | None = None,
    fixed_written: datetime | None = None,
) -> None:
    """Write the erasure record (not yet complete) and delete the rows it covers: written
    before the forget took effect and, when it names a time of the data, in it. With
    ``fixed_cutoff`` and ``fixed_written`` (an owed forget finished), those it was recorded
    with; ``fixed_cutoff`` alone (owed since before migration 0011), rows that occurred
    before it."""
    project, session, user = receipt.project_id, receipt.session_id, receipt.user_id
    before, since = receipt.before, receipt.since
    feed_before = before  # the feed's outbox: events that occurred before it
    if fixed_cutoff is not None:
        feed_before = fixed_cutoff if before is None else min(before, fixed_cutoff)
        if fixed_written is None:
            before = feed_before
    async with engine.begin() as conn:
        await lock_project(conn, project)
        if fixed_cutoff is None:
            # After the lock: every row a writer committed before it is older than the cutoff.
            now: datetime = (await conn.execute(select(func.clock_timestamp()))).scalar_one()
            if redis_now is not None:
                now = max(now, redis_now)
            receipt.cutoff = min(now, receipt.before) if receipt.before is not None else now
            receipt.written_before = now
        else:
            receipt.cutoff, receipt.written_before = fixed_cutoff, fixed_written
        written = receipt.written_before
        if user is not None:  # the user's sessions: their results go, their keys are marked
            found.sessions.update(await user_sessions(conn, project, session, before, user, since))
            found.holders.update(await session_holders(conn, project, found.sessions))
        episodes = row_scope(
            Episode, project, session, before, user, since=since, written_before=written
        )
        events = row_scope(
            LifecycleEvent,
            project,
            session,
            before,
            user,
            found.sessions,
            since=since,
            written_before=written,
        )
        vectors = await _count_vectors(conn, episodes)
        if receipt.dry_run:
            found.sessions.update(
                s
                for s in await conn.scalars(
                    select(Episode.session_id).where(*episodes, Episode.turn_id.is_(None))
                )
            )
            found.sessions.update(
                s
                for s in await conn.scalars(select(LifecycleEvent.session_id).where(*events))
                if s is not None
            )
            n_episodes = await _count(conn, Episode, episodes)
            n_events = await _count(conn, LifecycleEvent, events)
            gone_ids = {str(i) for i in await conn.scalars(select(Episode.id).where(*episodes))}
        else:
            await write_record(conn, receipt)
            gone = (
                await conn.execute(
                    delete(Episode)
                    .where(*episodes)
                    .returning(Episode.session_id, Episode.turn_id, Episode.id)
                )
            ).all()
            n_episodes = len(gone)
            found.sessions.update(s for s, turn, _id in gone if turn is None)
            found.episode_ids.update(str(i) for _s, _turn, i in gone)
            gone_ids = {str(i) for _s, _turn, i in gone}
            gone_events = await conn.scalars(
                delete(LifecycleEvent).where(*events).returning(LifecycleEvent.session_id)
            )
            event_sessions = list(gone_events)
            n_events = len(event_sessions)
            found.sessions.update(s for s in event_sessions if s is not None)
        if session is not None:  # the facts made only from the session's episodes
            facts, fact_ids = await forget_session_facts(
                conn, project, gone_ids, dry_run=receipt.dry_run
            )
            receipt.postgres.update(facts)
            found.fact_ids.update(fact_ids)  # their change-feed entries go in the stream step
        if session is None:  # facts, blocks, the feed's outbox: a user's (no user: the whole
            # project's), of no session (a session's forget leaves them, as LoomFlow's does)
            tables = await forget_user_tables(
                conn,
                project,
                user,
                before,
                dry_run=receipt.dry_run,
                since=since,
                written_before=written,
                feed_before=feed_before,
            )
    receipt.postgres.update(
        episodes=n_episodes, lifecycle_events=n_events, episode_embeddings=vectors
    )
    if session is None:
        receipt.postgres.update(tables)


async def write_record(conn: AsyncConnection, receipt: ForgetReceipt) -> None:
    """The erasure's row, not complete (``completed_at`` null: owed) until ``complete``; a
    row already written (an owed forget finished) is kept as it is."""
    assert receipt.erasure_id is not None and receipt.cutoff is not None
    await conn.execute(
        insert(Erasure)
        .values(
            id=uuid.UUID(receipt.erasure_id),
            project_id=receipt.project_id,
            session_id=receipt.session_id,
            before=receipt.before,
            since=receipt.since,
            cutoff=receipt.cutoff,
            written_before=receipt.written_before,
            user_id=receipt.user_id,
            completed_at=None,
        )
        .on_conflict_do_nothing(index_elements=["id"])
    )


async def store_counts(engine: AsyncEngine, receipt: ForgetReceipt) -> int:
    """The erasure's counts on its row; when every place was cleared (``receipt.ok``) the
    row complete, and every owed erasure of the same scope whose cutoff it reaches complete
    too (this forget removed all they owed): how many owed ones it settled."""
    if receipt.erasure_id is None or receipt.cutoff is None:
        return 0
    async with engine.begin() as conn:
        done = {"completed_at": func.now()} if receipt.ok else {}
        await conn.execute(
            update(Erasure)
            .where(Erasure.id == uuid.UUID(receipt.erasure_id))
            .values(counts=receipt.counts(), **done)
        )
        if not receipt.ok:
            return 0
        settled = await conn.execute(
            update(Erasure)
            .where(
                Erasure.completed_at.is_(None),
                Erasure.project_id == receipt.project_id,
                Erasure.session_id.is_not_distinct_from(receipt.session_id),
                Erasure.user_id.is_not_distinct_from(receipt.user_id),
                Erasure.since.is_not_distinct_from(receipt.since),
                _reached(receipt),
            )
            .values(completed_at=func.now())
            .returning(Erasure.id)
        )
        return len(settled.all())


def _reached(receipt: ForgetReceipt) -> ColumnElement[bool]:
    """An owed erasure of the same scope this complete one removed all of: written-before
    instant and ``before`` (none: all time) within its own; one of before migration 0011, by
    its cutoff."""
    assert receipt.cutoff is not None
    old = and_(Erasure.written_before.is_(None), Erasure.cutoff <= receipt.cutoff)
    if receipt.written_before is None:
        return old
    within = Erasure.written_before <= receipt.written_before
    if receipt.before is not None:
        within = and_(within, Erasure.before <= receipt.before)
    return or_(old, within)


async def _count(
    conn: AsyncConnection,
    model: type[Episode] | type[LifecycleEvent],
    where: list[ColumnElement[bool]],
) -> int:
    return int(
        (await conn.execute(select(func.count()).select_from(model).where(*where))).scalar_one()
    )


async def _count_vectors(conn: AsyncConnection, where: list[ColumnElement[bool]]) -> int:
    if not await has_vector_table(conn):
        return 0
    vectors = table(VECTOR_TABLE, column("episode_id", PG_UUID(as_uuid=True)))
    joined = vectors.join(Episode, Episode.id == vectors.c.episode_id)
    return int(
        (await conn.execute(select(func.count()).select_from(joined).where(*where))).scalar_one()
    )
