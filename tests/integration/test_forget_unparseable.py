"""A command whose ``data`` the worker's reader refuses (a lone surrogate ``\\ud83d`` a Node
orchestrator left cutting an emoji, a number past a double ``1e400``) still goes with the
user, session or project it names, on real Redis and Postgres; an entry naming another user,
or one a user's forget cannot tell whose it is, stays. Before, forget read such an entry as
naming nothing and left the user's text on ``P:lifecycle:{i}`` until retention trimmed it."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from tests.integration.results_factory import migrated_engine
from worker.erasure.forget import forget_everywhere
from worker.keys import StreamKeys
from worker.settings import Settings

PROJECT = "demo"


def broken(session: str, user: str | None, secret: str, tail: str = "\\ud83d") -> bytes:
    """A spawn orjson refuses (``tail`` ends its note), naming ``user`` (None: no user)."""
    named = "" if user is None else f'"user_id":"{user}",'
    return (
        f'{{"type":"spawn","event_id":"{session}-e","project_id":"{PROJECT}",'
        f'"session_id":"{session}","agent_instance_id":"a",{named}'
        f'"initial_state":{{"note":"my card {secret} {tail}"}}}}'
    ).encode()


async def held(redis: Redis, settings: Settings) -> bytes:
    rows: Any = await redis.xrange(StreamKeys(settings.stream_prefix, 0).lifecycle)
    return b"".join(fields[b"data"] for _id, fields in rows)


@pytest.mark.parametrize(
    "scope",
    [{"user_id": "gus"}, {"session_id": "gus-s"}, {}],
    ids=["user", "session", "project"],
)
@pytest.mark.parametrize("tail", ["\\ud83d", '", "n": 1e400, "x":"'], ids=["surrogate", "1e400"])
async def test_an_unparseable_command_goes_with_its_scope(
    redis: Redis, settings: Settings, database_url: str, scope: dict[str, str], tail: str
) -> None:
    stream = StreamKeys(settings.stream_prefix, 0).lifecycle
    await redis.xadd(stream, {"data": broken("gus-s", "gus", "GUSPII", tail)})
    await redis.xadd(stream, {"data": broken("zed-s", "zed", "ZEDPII", tail)})
    async with migrated_engine(database_url) as engine:
        receipt = await forget_everywhere(
            engine,
            redis,
            settings.stream_prefix,
            PROJECT,
            shards=1,
            user_id=scope.get("user_id"),
            session_id=scope.get("session_id"),
        )
    assert receipt.ok, receipt.errors
    assert b"GUSPII" not in await held(redis, settings), "the command kept the user's text"
    assert receipt.streams.get(stream) == (2 if not scope else 1), receipt.streams
    if scope:
        assert b"ZEDPII" in await held(redis, settings), "another user's command went too"


async def test_a_user_forget_never_takes_an_entry_it_cannot_tell_is_the_users(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """JSON no reader takes whole, whose user comes after the break: two users named in it is
    no one's to a user's forget (nor the anonymous bucket's); one named is that one's."""
    stream = StreamKeys(settings.stream_prefix, 0).lifecycle
    cut = '{"type":"spawn","project_id":"demo","session_id":"mix","initial_state":{"x":'
    both = cut + '{"user_id":"gus"} BROKEN MIXPII, "user_id":"zed"}'
    only = cut.replace("mix", "one") + 'BROKEN ONEPII, "user_id":"ann"}'
    await redis.xadd(stream, {"data": both})
    await redis.xadd(stream, {"data": only})
    async with migrated_engine(database_url) as engine:
        for user in ("gus", "zed", None):
            receipt = await forget_everywhere(
                engine,
                redis,
                settings.stream_prefix,
                PROJECT,
                shards=1,
                user_id=user,
                anonymous_user=user is None,
            )
            assert receipt.ok, receipt.errors
            assert b"MIXPII" in await held(redis, settings), user
            assert b"ONEPII" in await held(redis, settings), user
        receipt = await forget_everywhere(
            engine, redis, settings.stream_prefix, PROJECT, shards=1, user_id="ann"
        )
        assert b"ONEPII" not in await held(redis, settings)
        receipt = await forget_everywhere(
            engine, redis, settings.stream_prefix, PROJECT, shards=1, session_id="mix"
        )
        assert receipt.ok, receipt.errors
        assert await held(redis, settings) == b""
