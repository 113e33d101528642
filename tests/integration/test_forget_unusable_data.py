"""A command whose ``data`` is unusable (``data ''``, ``data 'x'``, ``data '{}'``,
``__data__ 'x'``) beside bare id fields, which the worker dead-letters ``unparseable``, goes
with the user and project its bare fields name: from the lifecycle stream and from the DLQ,
and an export of the user shows it; another user's forget leaves it. A command giving
``data`` twice (``XADD … data <uma's spawn> data '{}'``: the worker reads the last) is found
by every value: the user's and the project's forget take it; one whose values name two users
is the project's, no single user's. On real Redis and Postgres, the worker dead-lettering.
Before, such entries and their dead letters named no project for a forget: no forget nor
export found them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from redis.asyncio import Redis

from tests.helpers import running_worker, stream_len_at_least
from tests.integration.results_factory import migrated_engine
from worker.erasure.export import export_project
from worker.erasure.forget import forget_everywhere
from worker.keys import StreamKeys, shard_of
from worker.settings import Settings

PROJECT = "n2"
SESSION = {"uma": "n2-s1", "vic": "n2-s2"}


def secret(who: str) -> str:
    return f"{who}-secret-2"


def unusable(who: str, data: tuple[str, str]) -> dict[str, str]:
    """A spawn of ``who``'s session as bare fields beside an unusable ``data``."""
    return {
        data[0]: data[1],
        "project_id": PROJECT,
        "user_id": who,
        "session_id": SESSION[who],
        "type": "spawn",
        "secret": secret(who),
    }


def spawn(who: str) -> str:
    return json.dumps(
        {
            "event_id": f"d-{who}",
            "type": "spawn",
            "project_id": PROJECT,
            "session_id": SESSION[who],
            "agent_instance_id": "a",
            "user_id": who,
            "initial_state": {"secret": secret(who)},
        }
    )


def streams(settings: Settings) -> list[str]:
    return [
        stream
        for shard in range(settings.shards)
        for keys in [StreamKeys(settings.stream_prefix, shard)]
        for stream in (keys.lifecycle, keys.dlq)
    ]


async def holding(redis: Redis, settings: Settings) -> set[str]:
    """Whose secrets the lifecycle streams and DLQs still hold, in any field value: read with
    XRANGE's reply as Redis sends it (every pair, a name given twice included)."""
    raw = Redis(connection_pool=redis.connection_pool)
    raw.set_response_callback("XRANGE", lambda response, **_: response)
    held = b""
    for stream in streams(settings):
        rows: Any = await raw.xrange(stream)
        held += b"".join(v for _id, flat in rows for v in flat)
    return {who for who in SESSION if secret(who).encode() in held}


async def published(redis: Redis, settings: Settings, entries: list[list[str]]) -> None:
    """XADD each entry (a flat ``name value …`` list) and run the worker until each is
    dead-lettered."""
    shards: dict[int, int] = {}
    for flat in entries:
        session = flat[flat.index("session_id") + 1] if "session_id" in flat else SESSION["uma"]
        shard = shard_of(PROJECT, session, settings.shards)
        stream = StreamKeys(settings.stream_prefix, shard).lifecycle
        await redis.execute_command("XADD", stream, "*", *flat)  # type: ignore[no-untyped-call]
        shards[shard] = shards.get(shard, 0) + 1
    async with running_worker(settings):
        for shard, wanted in shards.items():
            dlq = StreamKeys(settings.stream_prefix, shard).dlq
            await stream_len_at_least(redis, dlq, wanted)


async def forget(redis: Redis, settings: Settings, url: str, **scope: Any) -> set[str]:
    async with migrated_engine(url) as engine:
        receipt = await forget_everywhere(
            engine, redis, settings.stream_prefix, PROJECT, shards=settings.shards, **scope
        )
    assert receipt.ok, receipt.errors
    return await holding(redis, settings)


async def exported(settings: Settings, redis: Redis, url: str, user: str) -> str:
    async with migrated_engine(url) as engine:
        export = await export_project(
            engine, PROJECT, redis=redis, prefix=settings.stream_prefix, user_id=user
        )
    return json.dumps(export.stream_entries)


DATA = {
    "empty": ("data", ""),
    "not-json": ("data", "x"),
    "empty-object": ("data", "{}"),
    "envelope": ("__data__", "x"),
}


@pytest.mark.parametrize("data", list(DATA.values()), ids=list(DATA))
async def test_an_unusable_data_goes_with_the_bare_fields_user_and_project(
    redis: Redis, settings: Settings, database_url: str, data: tuple[str, str]
) -> None:
    live = settings.model_copy(update={"database_url": database_url})
    sent = [unusable(who, data) for who in SESSION]
    await published(redis, live, [[x for kv in f.items() for x in kv] for f in sent])
    dlq_text = b""
    for stream in streams(live):
        if ":dlq" in stream:
            rows: Any = await redis.xrange(stream)
            dlq_text += b"".join(v for _id, fields in rows for v in fields.values())
    assert secret("uma").encode() in dlq_text, "the worker dead-lettered it"
    assert await holding(redis, live) == {"uma", "vic"}
    shown = await exported(live, redis, database_url, "uma")
    assert secret("uma") in shown and secret("vic") not in shown
    assert await forget(redis, live, database_url, user_id="uma") == {"vic"}
    assert await forget(redis, live, database_url, user_id="nobody") == {"vic"}
    assert await forget(redis, live, database_url) == set()


async def test_each_user_forget_takes_only_its_own_unusable_data(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """The project's forget, with no user forget first, takes every one."""
    live = settings.model_copy(update={"database_url": database_url})
    sent = [unusable(who, ("data", "")) for who in SESSION]
    await published(redis, live, [[x for kv in f.items() for x in kv] for f in sent])
    assert await forget(redis, live, database_url, user_id="vic") == {"uma"}
    assert await forget(redis, live, database_url) == set()


@pytest.mark.parametrize("scope", [{"user_id": "uma"}, {}], ids=["user", "project"])
async def test_a_data_given_twice_is_found_by_its_first_value(
    redis: Redis, settings: Settings, database_url: str, scope: dict[str, Any]
) -> None:
    live = settings.model_copy(update={"database_url": database_url})
    await published(redis, live, [["data", spawn("uma"), "data", "{}"]])
    assert await holding(redis, live) == {"uma"}
    if scope:
        shown = json.loads(await exported(live, redis, database_url, "uma"))
        pairs = [e.get("pairs") for entries in shown.values() for e in entries]
        assert [["data", spawn("uma")], ["data", "{}"]] in pairs
    assert await forget(redis, live, database_url, **scope) == set()


async def test_an_entry_naming_two_users_is_the_projects_not_a_users(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """``data`` given three times, uma's spawn, vic's, ``{}``; and bare fields giving
    ``user_id`` twice: neither user's forget takes them, the project's does."""
    live = settings.model_copy(update={"database_url": database_url})
    both = ["data", spawn("uma"), "data", spawn("vic").replace("n2-s2", "n2-s1"), "data", "{}"]
    bare = [x for kv in unusable("uma", ("type", "spawn")).items() for x in kv]
    bare += ["user_id", "vic", "note", secret("vic")]
    await published(redis, live, [both, bare])
    assert await holding(redis, live) == {"uma", "vic"}
    assert await forget(redis, live, database_url, user_id="uma") == {"uma", "vic"}
    assert await forget(redis, live, database_url, user_id="vic") == {"uma", "vic"}
    assert await forget(redis, live, database_url) == set()


@pytest.mark.parametrize("scope", [{"user_id": "uma"}, {}], ids=["user", "project"])
async def test_a_data_among_many_values_of_the_name_is_found(
    redis: Redis, settings: Settings, database_url: str, scope: dict[str, Any]
) -> None:
    """``data`` given 72 times: 70 junk values, uma's spawn, ``x`` (what the worker reads).
    Before, a forget read the last value and 64 others: neither forget nor export found it."""
    live = settings.model_copy(update={"database_url": database_url})
    flat = [x for n in range(70) for x in ("data", f"j{n}")] + ["data", spawn("uma"), "data", "x"]
    await published(redis, live, [flat])
    assert await holding(redis, live) == {"uma"}
    if scope:
        assert secret("uma") in await exported(live, redis, database_url, "uma")
    assert await forget(redis, live, database_url, **scope) == set()


async def test_bare_ids_naming_another_project_than_the_data_go_with_that_project(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """vic's spawn of project n12 in ``data``, and bare fields ``project_id n2 user_id uma``
    with uma's secret beside it: uma's forget of n2 takes it (before, only n12's did)."""
    live = settings.model_copy(update={"database_url": database_url})
    other = spawn("vic").replace('"n2"', '"n12"')
    flat = ["data", other, "project_id", PROJECT, "user_id", "uma", "secret", secret("uma")]
    stream = StreamKeys(live.stream_prefix, shard_of(PROJECT, SESSION["uma"], live.shards))
    await redis.execute_command("XADD", stream.lifecycle, "*", *flat)  # type: ignore[no-untyped-call]
    assert await holding(redis, live) == {"uma", "vic"}  # vic's secret is in the data too
    assert await forget(redis, live, database_url, user_id="vic") == {"uma", "vic"}
    assert await forget(redis, live, database_url, user_id="uma") == set()
