"""Forget a time range (issue 35): ``since`` with ``before`` forgets ``[since, before)`` and
nothing older or newer, through ``Memory.forget`` and ``memworker forget --since``; the
erasure record covers the range only (a replay or the consolidator brings nothing of it back,
and is not stopped from keeping what is older), and a bad range touches nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from redis.asyncio import Redis
from sqlalchemy import text as sql

from tests.integration.test_client_and_cli import memworker
from tests.integration.test_forget_user import replay_everything
from worker.consolidation.consolidator import Consolidator
from worker.db.engine import create_database_engine
from worker.db.erasures import NOT_ERASED, covered
from worker.db.migrate import migrate
from worker.erasure.erased import load_erased
from worker.erasure.scope import InvalidForgetError
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

PROJECT = "ranges"
ANN = "ann"
JAN, FEB, MAR = (datetime(2026, m, 1, tzinfo=UTC) for m in (1, 2, 3))
SINCE, BEFORE = datetime(2026, 1, 15, tzinfo=UTC), datetime(2026, 2, 15, tzinfo=UTC)


@pytest.fixture
async def live(settings: Settings, database_url: str) -> Settings:
    await migrate(database_url)
    return settings.model_copy(update={"database_url": database_url, "shards": 2})


async def turns_left(memory: Memory) -> list[str]:
    async with memory.engine.connect() as conn:
        rows = await conn.execute(
            sql(
                "SELECT input FROM episodes e WHERE project_id = :p AND user_id = :u"
                f" AND {NOT_ERASED} ORDER BY occurred_at"
            ),
            {"p": PROJECT, "u": ANN},
        )
        return [r[0] for r in rows]


async def remember_three(memory: Memory) -> None:
    for when in (JAN, FEB, MAR):
        await memory.remember(
            Episode(
                session_id=f"chat-{when.month}",
                user_id=ANN,
                occurred_at=when,
                input=f"turn of month {when.month}",
                output="ok",
            )
        )


async def test_a_range_goes_and_what_is_older_or_newer_stays_after_every_replay(
    redis: Redis, live: Settings
) -> None:
    engine = create_database_engine(live.database_url)
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    try:
        await remember_three(memory)
        assert await memory.forget(user_id=ANN, since=SINCE, before=BEFORE) == 1
        left = ["turn of month 1", "turn of month 3"]
        assert await turns_left(memory) == left  # and the record does not hide January
        async with engine.connect() as conn:
            row = (await conn.execute(sql("SELECT since, cutoff FROM erasures"))).one()
            assert (row.since, row.cutoff) == (SINCE, BEFORE)
            items = [(PROJECT, f"chat-{m.month}", m, ANN) for m in (JAN, FEB, MAR)]
            assert await covered(conn, items) == [False, True, False]
        # P:erased holds cutoffs ("all that is older"): a range is never written there, but
        # in P:erased_ranges, which the replay of commands and the DLQ's redrive read too.
        await redis.delete(f"{live.stream_prefix}:erased_ranges")  # as a restored backup
        consolidator = Consolidator.from_settings(live)
        try:
            assert await consolidator.sync_erased() == 1  # the table puts it back
        finally:
            await consolidator.close()
        erased = await load_erased(redis, live.stream_prefix)
        assert not erased.cutoffs
        ms = [int(m.timestamp() * 1000) for m in (JAN, FEB, MAR)]
        assert [erased.covers(PROJECT, None, at, ANN) for at in ms] == [False, True, False]
        assert not erased.covers(PROJECT, None, ms[1], "bob")
        await replay_everything(redis, live)
        assert await turns_left(memory) == left
    finally:
        await memory.close()
        await engine.dispose()


@pytest.mark.parametrize(
    ("since", "before", "named"),
    [
        (BEFORE, SINCE, "since must be earlier than before"),
        (SINCE, SINCE, "since must be earlier than before"),
        (SINCE, None, "since needs before"),
        (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))), BEFORE, "since must be a time"),
    ],
)
async def test_a_bad_range_is_refused_naming_the_field_and_touches_nothing(
    redis: Redis, live: Settings, since: datetime, before: datetime | None, named: str
) -> None:
    engine = create_database_engine(live.database_url)
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    try:
        await remember_three(memory)
        with pytest.raises(InvalidForgetError, match=named):
            await memory.forget(user_id=ANN, since=since, before=before)
        assert len(await turns_left(memory)) == 3
        async with engine.connect() as conn:
            assert (await conn.execute(sql("SELECT count(*) FROM erasures"))).scalar_one() == 0
    finally:
        await memory.close()
        await engine.dispose()


async def test_the_cli_forgets_a_range_with_a_dry_run_first(redis: Redis, live: Settings) -> None:
    engine = create_database_engine(live.database_url)
    memory = Memory(PROJECT, settings=live, engine=engine, redis=redis)
    try:
        await remember_three(memory)
        args = ["forget", "-p", PROJECT, "-u", ANN, "--since", SINCE.isoformat()]
        args += ["--before", BEFORE.isoformat(), "--json"]
        dry = memworker(live, *args, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        receipt = json.loads(dry.stdout)
        assert receipt["since"] == SINCE.isoformat() and receipt["dry_run"]
        assert receipt["postgres"]["episodes"] == 1
        assert len(await turns_left(memory)) == 3  # the dry run touched nothing
        done = memworker(live, *args)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["postgres"]["episodes"] == 1
        assert await turns_left(memory) == ["turn of month 1", "turn of month 3"]
        backwards = memworker(
            live,
            "forget",
            "-p",
            PROJECT,
            "--since",
            "2026-03-01T00:00:00Z",
            "--before",
            "2026-02-01T00:00:00Z",
        )
        assert backwards.returncode == 2
        assert "since must be earlier than before" in backwards.stderr
        assert "--since" in backwards.stderr
    finally:
        await memory.close()
        await engine.dispose()
