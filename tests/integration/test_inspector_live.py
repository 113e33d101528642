"""The inspector's live page against a real ``memworker serve``, Redis and Postgres: a dead
letter shown with its reason and redriven only after the confirmation (its entry back on its
stream, the DLQ empty); the change feed as server-sent events, carrying a change made after it
opened, and on a server pinned to ann, none of bob's."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.cli_process import GENEROUS
from tests.inspector_server import PROJECT, TOKEN, csrf_of, env_for, serving
from tests.integration.results_factory import migrated_engine
from worker.consumers.dead_letters import dead_letter
from worker.keys import changes_dlq, changes_stream
from worker.settings import Settings

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def env(redis: Redis, settings: Settings, database_url: str) -> dict[str, str]:
    async with migrated_engine(database_url):
        pass
    return env_for(settings, database_url)


async def test_a_dead_letter_is_shown_and_redriven_only_after_the_confirmation(
    env: dict[str, str], redis: Redis, settings: Settings
) -> None:
    source = changes_stream(settings.stream_prefix, PROJECT, settings.shards)
    dlq = changes_dlq(settings.stream_prefix)
    event = {"type": "fact.added", "project_id": PROJECT, "user_id": "ann", "fact_id": "f1"}
    letter = dead_letter(
        fields={"data": json.dumps(event)},
        source_stream=source,
        source_id="1-0",
        group="my-follower",
        reason="handler_failed",
        error="ValueError: <b>no such fact</b>",
        deliveries=5,
    )
    entry_id = (await redis.xadd(dlq, letter)).decode()  # type: ignore[arg-type]
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as http:
            page = await http.get("/ui/live")
            assert page.status_code == 200, page.text
            assert entry_id in page.text and "handler_failed" in page.text
            assert "&lt;b&gt;no such fact&lt;/b&gt;" in page.text
            form = {"csrf": csrf_of(page.text), "stream": dlq, "entry_id": entry_id}
            ask = await http.post("/ui/live/redrive", data={**form, "step": "preview"})
            assert ask.status_code == 200 and "Redrive it" in ask.text, ask.text
            assert await redis.xlen(dlq) == 1, "nothing moved before the confirmation"
            done = await http.post("/ui/live/redrive", data={**form, "step": "confirm"})
            assert done.status_code == 200 and "1 dead letter(s) redriven" in done.text
            assert await redis.xlen(dlq) == 0
            [(_id, fields)] = await redis.xrange(source)
            assert json.loads(fields[b"data"])["fact_id"] == "f1"
            again = await http.post("/ui/live/redrive", data={**form, "step": "confirm"})
            assert again.status_code == 404, again.text


async def test_another_projects_dead_letter_is_neither_shown_nor_redriven(
    env: dict[str, str], redis: Redis, settings: Settings
) -> None:
    # the DLQ streams are shared by every project of the prefix: a server is its project's door
    source = changes_stream(settings.stream_prefix, "otherproj", settings.shards)
    dlq = changes_dlq(settings.stream_prefix)
    event = {"type": "fact.added", "project_id": "otherproj", "user_id": "eve", "fact_id": "f9"}
    letter = dead_letter(
        fields={"data": json.dumps(event)},
        source_stream=source,
        source_id="1-0",
        group="my-follower",
        reason="handler_failed",
        error="ValueError: otherproj-secret",
        deliveries=5,
    )
    entry_id = (await redis.xadd(dlq, letter)).decode()  # type: ignore[arg-type]
    garbage = dead_letter(
        fields={"data": "not json at all"},
        source_stream=source,
        source_id="2-0",
        group="my-follower",
        reason="unparseable",
        error="garbage-secret",
        deliveries=1,
    )
    await redis.xadd(dlq, garbage)  # type: ignore[arg-type]
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as http:
            page = await http.get("/ui/live")
            assert page.status_code == 200, page.text
            assert entry_id not in page.text and "otherproj-secret" not in page.text
            assert "garbage-secret" not in page.text
            assert "1 dead letter(s) whose project cannot be read" in page.text
            form = {"csrf": csrf_of(page.text), "stream": dlq, "entry_id": entry_id}
            for step in ("preview", "confirm"):
                answer = await http.post("/ui/live/redrive", data={**form, "step": step})
                assert answer.status_code == 404, answer.text
            assert await redis.xlen(dlq) == 2, "nothing redriven"
            assert await redis.xlen(source) == 0


async def _changes(http: httpx.AsyncClient, url: str, got: list[dict[str, Any]]) -> None:
    async with http.stream("GET", url) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                got.append(json.loads(line[6:]))


async def _fact(http: httpx.AsyncClient, user: str, value: str) -> None:
    fact = {"user_id": user, "subject": user, "predicate": "likes", "object": value}
    assert (await http.post("/v1/add_fact", json=fact, headers=AUTH)).status_code == 200


async def test_the_change_feed_arrives_live_and_a_pinned_server_streams_its_user_only(
    env: dict[str, str],
) -> None:
    with serving(env) as plain, serving({**env, "MEMWORKER_API_USER": "ann"}) as pinned:
        async with (
            httpx.AsyncClient(base_url=plain, timeout=GENEROUS, headers=AUTH) as writer,
            httpx.AsyncClient(base_url=pinned, timeout=GENEROUS, headers=AUTH) as reader,
        ):
            everyone: list[dict[str, Any]] = []
            anns: list[dict[str, Any]] = []
            tasks = [
                asyncio.create_task(_changes(writer, "/ui/live/changes", everyone)),
                asyncio.create_task(_changes(reader, "/ui/live/changes", anns)),
            ]
            await asyncio.sleep(2)  # both feeds open: what follows is "from now on"
            await _fact(writer, "bob", "ferries")
            await _fact(writer, "ann", "tea")
            async with asyncio.timeout(GENEROUS):
                while len(everyone) < 2 or not anns:
                    await asyncio.sleep(0.1)
            await asyncio.sleep(1)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert [e["user_id"] for e in everyone] == ["bob", "ann"]
    assert [e["user_id"] for e in anns] == ["ann"], anns
    assert all(e["type"] == "fact.added" for e in everyone)


async def test_a_time_range_is_forgotten_from_the_forget_page_after_its_dry_run(
    env: dict[str, str],
) -> None:
    months = ["2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"]
    selector = {"since": "2026-01-15T00:00:00Z", "before": "2026-02-15T00:00:00Z"}
    with serving(env) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60, headers=AUTH) as http:
            for when in months:
                turn = {"user_id": "ann", "session_id": "chat", "occurred_at": when}
                turn |= {"input": f"said in {when[:7]}", "output": "ok"}
                assert (await http.post("/v1/remember", json=turn)).status_code == 200
            page = await http.get("/ui/users/ann/forget")
            assert 'id="since"' in page.text
            form = {"csrf": csrf_of(page.text), **selector}
            ask = await http.post("/ui/users/ann/forget", data={**form, "step": "preview"})
            assert ask.status_code == 200, ask.text
            assert "history from 2026-01-15T00:00:00+00:00 to before 2026-02-15" in ask.text
            assert "postgres episodes: 1" in ask.text
            assert 'name="since" value="2026-01-15T00:00:00Z"' in ask.text  # kept to confirm
            done = await http.post("/ui/users/ann/forget", data={**form, "step": "confirm"})
            assert done.status_code == 200 and "1 episode(s)" in done.text, done.text
            left = await http.post(
                "/v1/session_messages", json={"user_id": "ann", "session_id": "chat"}
            )
            said = [m["content"] for m in left.json() if m["role"] == "user"]
            assert said == ["said in 2026-01", "said in 2026-03"], said
