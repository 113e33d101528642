"""A command published as bare fields, no JSON ``data`` (``XADD P:lifecycle:{i} * project_id
projA user_id zoe session_id s1 type spawn …``), which the worker dead-letters ``unparseable``,
goes with the user, session, project or anonymous bucket its fields name: from the lifecycle
stream and from the DLQ, on real Redis and Postgres with the lifecycle worker dead-lettering
it. Another user's stays, and an excerpt that cannot say whose it is is no user's. Before, such
an entry and its dead letter named no project: no forget erased either."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from tests.helpers import running_worker, stream_len_at_least
from tests.integration.results_factory import migrated_engine
from worker.consumers.dead_letters import dead_letter
from worker.erasure.forget import forget_everywhere
from worker.keys import StreamKeys, shard_of
from worker.settings import Settings

PROJECT = "projA"
PEOPLE = {"zoe": "zoe", "mallory": "mallory", "anon": None}
"""Who publishes (the secret's name) → the ``user_id`` field (None: no such field)."""


def secret(who: str) -> str:
    return f"SECRET-{who}-bare"


def bare(who: str, padding: str = "") -> dict[str, str]:
    """A spawn of session ``s-<who>`` as bare fields: no ``data``."""
    fields = {"note": secret(who) + padding} if padding else {}
    fields |= {"project_id": PROJECT, "session_id": f"s-{who}", "type": "spawn"}
    fields |= {"event_id": f"e-{who}", "agent_instance_id": "a1"}
    if (user := PEOPLE[who]) is not None:
        fields["user_id"] = user
    if not padding:
        fields["note"] = secret(who)
    return fields


async def holding(redis: Redis, settings: Settings) -> dict[str, set[str]]:
    """Whose secrets each place still holds: ``lifecycle`` and ``dlq`` (every shard)."""
    out: dict[str, set[str]] = {"lifecycle": set(), "dlq": set()}
    for shard in range(settings.shards):
        keys = StreamKeys(settings.stream_prefix, shard)
        for place, stream in (("lifecycle", keys.lifecycle), ("dlq", keys.dlq)):
            rows: Any = await redis.xrange(stream)
            held = b"".join(v for _id, fields in rows for v in fields.values())
            out[place].update(who for who in PEOPLE if secret(who).encode() in held)
    return out


async def dead_lettered(redis: Redis, settings: Settings, sent: list[dict[str, str]]) -> None:
    """Publish ``sent`` and run the worker until each is dead-lettered."""
    for fields in sent:
        shard = shard_of(PROJECT, fields["session_id"], settings.shards)
        await redis.xadd(StreamKeys(settings.stream_prefix, shard).lifecycle, fields)  # type: ignore[arg-type]
    async with running_worker(settings):
        for shard in {shard_of(PROJECT, f["session_id"], settings.shards) for f in sent}:
            wanted = sum(shard_of(PROJECT, f["session_id"], settings.shards) == shard for f in sent)
            await stream_len_at_least(redis, StreamKeys(settings.stream_prefix, shard).dlq, wanted)


@pytest.mark.parametrize(
    ("scope", "gone"),
    [
        ({"user_id": "zoe"}, {"zoe"}),
        ({"user_id": "mallory"}, {"mallory"}),
        ({"session_id": "s-zoe"}, {"zoe"}),
        ({"anonymous_user": True}, {"anon"}),
        ({}, {"zoe", "mallory", "anon"}),
    ],
    ids=["user", "other-user", "session", "anonymous", "project"],
)
async def test_a_bare_command_and_its_dead_letter_go_with_their_scope(
    redis: Redis, settings: Settings, database_url: str, scope: dict[str, Any], gone: set[str]
) -> None:
    live = settings.model_copy(update={"database_url": database_url})
    await dead_lettered(redis, live, [bare(who) for who in PEOPLE])
    everyone = set(PEOPLE)
    assert await holding(redis, live) == {"lifecycle": everyone, "dlq": everyone}
    async with migrated_engine(database_url) as engine:
        receipt = await forget_everywhere(
            engine, redis, live.stream_prefix, PROJECT, shards=live.shards, **scope
        )
    assert receipt.ok, receipt.errors
    left = everyone - gone
    assert await holding(redis, live) == {"lifecycle": left, "dlq": left}
    assert sum(receipt.streams.values()) == 2 * len(gone), receipt.streams


async def test_a_bare_command_kept_as_an_excerpt_goes_with_its_user_and_session(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """A bare entry too large to keep whole, its ids after the cut: the ids recorded beside
    the excerpt say whose it is. An excerpt that records none (a letter written before they
    were) and holds no ``user_id`` is no user's (the cut may have taken another user's name),
    but its session's and project's."""
    live = settings.model_copy(update={"max_event_bytes": 1024, "database_url": database_url})
    await dead_lettered(redis, live, [bare("zoe", "x" * 20_000), bare("mallory", "x" * 20_000)])
    dlq = StreamKeys(live.stream_prefix, shard_of(PROJECT, "s-anon", live.shards)).dlq
    anon = {k.encode(): v.encode() for k, v in bare("anon").items()}
    anon[b"note"] = secret("anon").encode() + b"x" * 20_000  # last: the excerpt cuts it
    old = dead_letter(
        fields=anon,
        source_stream=StreamKeys(live.stream_prefix, 0).lifecycle,
        source_id="1-0",
        group="lifecycle",
        reason="unparseable",
        error="no data",
        deliveries=1,
        keep_bytes=5_120,
    )
    assert old["truncated"] == "true"
    old = {k: v for k, v in old.items() if not k.startswith("original_")}
    await redis.xadd(dlq, old)  # type: ignore[arg-type]
    assert (await holding(redis, live))["dlq"] == {"zoe", "mallory", "anon"}

    async def forget(**scope: Any) -> set[str]:
        async with migrated_engine(database_url) as engine:
            receipt = await forget_everywhere(
                engine, redis, live.stream_prefix, PROJECT, shards=live.shards, **scope
            )
        assert receipt.ok, receipt.errors
        return (await holding(redis, live))["dlq"]

    assert await forget(user_id="zoe") == {"mallory", "anon"}
    assert await forget(anonymous_user=True) == {"mallory", "anon"}, "taken as no user's"
    assert await forget(user_id="mallory") == {"anon"}
    assert await forget(session_id="s-anon") == set()
