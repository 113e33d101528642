"""Dead letters kept as an excerpt (an entry too large to keep whole: its first bytes only, no
whole JSON) go with the user or session they name, on real Redis and Postgres with the
lifecycle worker dead-lettering them: a forget of the user deletes the user's excerpts (of her
spawn, naming her, and of her session's later command, naming only the session) and counts
them on its receipt; another user's stays until that user's session is forgotten. Before, an
excerpt named nobody (its JSON is cut) and outlived every forget, content and all."""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from tests.helpers import command, publish, running_worker, stream_len_at_least
from tests.integration.results_factory import migrated_engine
from worker.consumers.dead_letters import dead_letter, redrive
from worker.erasure.erased import load_erased
from worker.erasure.forget import forget_everywhere
from worker.keys import StreamKeys, shard_of
from worker.settings import Settings

PROJECT = "dlq-forget"
PADDING = "x" * 20_000
"""Past 4x MEMWORKER_MAX_EVENT_BYTES (1,024 here): dead-lettered unread, as an excerpt."""


def secret(user: str) -> str:
    return f"SECRET-{user}-in-a-dead-letter"


def spawn(user: str, session: str) -> dict[str, Any]:
    return command(
        "spawn",
        f"{session}-spawn",
        session,
        PROJECT,
        user_id=user,
        initial_state={"note": secret(user) + PADDING},
    )


def pause(user: str, session: str) -> dict[str, Any]:
    """A later command of the session: it names no user."""
    return command(
        "pause", f"{session}-pause", session, PROJECT, description=secret(user) + PADDING
    )


async def letters(redis: Redis, settings: Settings) -> dict[str, list[dict[bytes, bytes]]]:
    """Every dead letter, by DLQ stream."""
    out = {}
    for shard in range(settings.shards):
        dlq = StreamKeys(settings.stream_prefix, shard).dlq
        out[dlq] = [fields for _id, fields in await redis.xrange(dlq)]
    return out


def holding(found: dict[str, list[dict[bytes, bytes]]], text: str) -> int:
    return sum(text.encode() in fields[b"data"] for rows in found.values() for fields in rows)


async def test_an_excerpt_dead_letter_goes_with_the_user_and_the_session_it_names(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    live = settings.model_copy(update={"max_event_bytes": 1024, "database_url": database_url})
    sent = [spawn("zoe", "zoe-a"), pause("zoe", "zoe-a"), spawn("bob", "bob-a")]
    async with migrated_engine(database_url) as engine:
        for body in sent:
            await publish(redis, live, body)
        async with running_worker(live):
            for shard in {shard_of(PROJECT, b["session_id"], live.shards) for b in sent}:
                wanted = sum(shard_of(PROJECT, b["session_id"], live.shards) == shard for b in sent)
                await stream_len_at_least(redis, StreamKeys(live.stream_prefix, shard).dlq, wanted)
        found = await letters(redis, live)
        kept = [fields for rows in found.values() for fields in rows]
        assert len(kept) == 3 and all(f[b"truncated"] == b"true" for f in kept), kept
        assert holding(found, secret("zoe")) == 2 and holding(found, secret("bob")) == 1

        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, user_id="zoe", shards=live.shards
        )
        assert receipt.ok, receipt.errors
        found = await letters(redis, live)
        assert holding(found, secret("zoe")) == 0, "zoe's excerpts outlived her forget"
        assert holding(found, secret("bob")) == 1, "bob's excerpt went with zoe's forget"
        dlqs = {stream: n for stream, n in receipt.streams.items() if stream in found}
        assert sum(dlqs.values()) == 2, receipt.streams  # counted, by DLQ stream

        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, session_id="bob-a", shards=live.shards
        )
        assert receipt.ok, receipt.errors
        found = await letters(redis, live)
        assert holding(found, secret("bob")) == 0, "bob's excerpt outlived his session's forget"
        assert sum(n for stream, n in receipt.streams.items() if stream in found) == 1


async def test_the_redrive_drops_an_excerpt_a_forget_covers(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """An excerpt the forget's scrub did not meet (dead-lettered meanwhile, its source entry
    older than the cutoff) is dropped by the redrive, as a whole dead letter is; before, the
    redrive left every excerpt in place for good."""
    async with migrated_engine(database_url) as engine:
        receipt = await forget_everywhere(
            engine, redis, settings.stream_prefix, PROJECT, user_id="zoe", shards=settings.shards
        )
        assert receipt.ok, receipt.errors
    keys = StreamKeys(settings.stream_prefix, shard_of(PROJECT, "zoe-late", settings.shards))
    letter = dead_letter(
        fields={b"data": orjson.dumps(spawn("zoe", "zoe-late"))},
        source_stream=keys.lifecycle,
        source_id="1-0",  # published long before the forget
        group="lifecycle",
        reason="unparseable",
        error="not read",
        deliveries=1,
        keep_bytes=5_120,
    )
    assert letter["truncated"] == "true"
    await redis.xadd(keys.dlq, letter)  # type: ignore[arg-type]
    erased = await load_erased(redis, settings.stream_prefix)
    assert await redrive(redis, keys.dlq, None, erased) == 0
    assert int(await redis.xlen(keys.dlq)) == 0, "the excerpt of a forgotten user was kept"


def late_ids(body: dict[str, Any], user: str) -> dict[str, Any]:
    """``body`` with a large field first: every id comes after the excerpt's cut."""
    return {"note": secret(user) + PADDING, **body}


async def test_an_excerpt_whose_ids_come_after_the_cut_goes_with_its_user_and_session(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """An entry whose ids all come after its first 4 KB is dead-lettered as an excerpt that
    holds no id: the ids found in the whole entry are kept beside it, so a forget of the user
    (dry run counts included) and of the session still finds it. Before, such an excerpt
    named nobody and outlived both forgets until the DLQ's retention."""
    live = settings.model_copy(update={"max_event_bytes": 1024, "database_url": database_url})
    sent = [
        late_ids(command("spawn", "ann-a-spawn", "ann-a", PROJECT, user_id="ann"), "ann"),
        late_ids(command("pause", "ann-a-pause", "ann-a", PROJECT), "ann"),
        late_ids(command("spawn", "cal-a-spawn", "cal-a", PROJECT, user_id="cal"), "cal"),
    ]
    async with migrated_engine(database_url) as engine:
        for body in sent:
            await publish(redis, live, body)
        async with running_worker(live):
            for shard in {shard_of(PROJECT, b["session_id"], live.shards) for b in sent}:
                wanted = sum(shard_of(PROJECT, b["session_id"], live.shards) == shard for b in sent)
                await stream_len_at_least(redis, StreamKeys(live.stream_prefix, shard).dlq, wanted)
        found = await letters(redis, live)
        kept = [fields for rows in found.values() for fields in rows]
        assert len(kept) == 3 and all(f[b"truncated"] == b"true" for f in kept), kept
        assert not any(PROJECT.encode() in f[b"data"] for f in kept), "an id before the cut"
        assert {f[b"original_session_id"] for f in kept} == {b"ann-a", b"cal-a"}

        async def forget(dry_run: bool, user: str | None = None, session: str | None = None) -> int:
            receipt = await forget_everywhere(
                engine,
                redis,
                live.stream_prefix,
                PROJECT,
                session_id=session,
                user_id=user,
                shards=live.shards,
                dry_run=dry_run,
            )
            assert receipt.ok, receipt.errors
            return sum(n for stream, n in receipt.streams.items() if stream in found)

        assert await forget(True, user="ann") == 2, "the dry run missed ann's excerpts"
        assert holding(await letters(redis, live), secret("ann")) == 2
        assert await forget(False, user="ann") == 2
        found = await letters(redis, live)
        assert holding(found, secret("ann")) == 0, "ann's excerpts outlived her forget"
        assert holding(found, secret("cal")) == 1, "cal's excerpt went with ann's forget"

        assert await forget(True, session="cal-a") == 1
        assert await forget(False, session="cal-a") == 1
        found = await letters(redis, live)
        assert holding(found, secret("cal")) == 0, "cal's excerpt outlived his session's forget"
