"""``memworker memory blocks|recall|facts|profile|export``: the real CLI in a subprocess against
real Redis and Postgres, beside ``worker.Memory`` writing what it reads."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from tests.helpers import worker_env
from tests.integration.results_factory import migrated_engine
from worker.keys import changes_stream
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

ANONYMOUS = "memworker: no --user: using the anonymous bucket of project"


def memworker(settings: Settings, *args: str, stdin: str | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", "memory", *args],
        env=worker_env(settings),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def run(settings: Settings, *args: str, stdin: str | None = None) -> Any:
    return await asyncio.to_thread(memworker, settings, *args, stdin=stdin)


def ok(done: Any) -> Any:
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    return done


def as_json(done: Any) -> Any:
    return json.loads(ok(done).stdout)


def error_line(done: Any, status: int = 1) -> str:
    """The one stderr line a failed command printed (usage errors: Click's ``Error:`` line, or
    the input rule's ``memworker: error: <field>: …`` alone)."""
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    if status == 1 or lines[-1].startswith("memworker: error: "):  # 2: the input rule's
        assert len(lines) == 1 and lines[0].startswith("memworker: error: "), done.stderr
        return str(lines[0])
    [line] = [line for line in lines if line.startswith("Error: ")]
    return str(line)


async def migrated(settings: Settings, database_url: str) -> Settings:
    async with migrated_engine(database_url):
        pass
    return settings.model_copy(update={"database_url": database_url})


async def test_blocks_set_append_and_list_in_pin_order(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    done = ok(await run(settings, "blocks", "-u", "ann", "--set", "persona", "--content", "Ann"))
    assert done.stdout.strip() == "set block 'persona' (slot 0, 3 bytes)" and not done.stderr
    ok(await run(settings, "blocks", "-u", "ann", "--set", "goals", "--content", "ship v2"))
    appended = as_json(
        await run(
            settings,
            "blocks",
            "-u",
            "ann",
            "--append",
            "persona",
            "--content",
            "-",
            "--json",
            stdin=" likes tea",
        )
    )
    assert (appended["name"], appended["content"], appended["pinned_order"]) == (
        "persona",
        "Ann likes tea",
        0,
    )
    listed = as_json(await run(settings, "blocks", "--user", "ann", "--json"))
    assert [(b["name"], b["content"], b["pinned_order"]) for b in listed] == [
        ("persona", "Ann likes tea", 0),
        ("goals", "ship v2", 1),
    ]
    table = ok(await run(settings, "blocks", "-u", "ann")).stdout
    assert table.index("persona") < table.index("goals") and "Ann likes tea" in table
    # another user's and the anonymous bucket are their own
    assert as_json(await run(settings, "blocks", "-u", "ben", "--json")) == []
    anonymous = await run(settings, "blocks", "--json")
    assert as_json(anonymous) == []
    assert anonymous.stderr.strip().splitlines() == [
        f"{ANONYMOUS} default (what was stored without a user id)"
    ]
    # every write went out on the change feed (three block.updated)
    entries: Any = await redis.xrange(
        changes_stream(settings.stream_prefix, "default", settings.shards)
    )
    kinds = [json.loads(fields[b"data"])["type"] for _id, fields in entries]
    assert kinds == ["block.updated"] * 3


async def test_recall_prints_scored_turns_of_the_user_within_the_time_range(
    settings: Settings, database_url: str, redis: Redis
) -> None:
    settings = await migrated(settings, database_url)
    now = datetime.now(UTC)
    words_only = settings.model_copy(update={"remember_embedding": "indexer"})
    async with Memory("demo", settings=words_only) as memory:
        for n, (user, text, age) in enumerate(
            [
                ("ann", "book a flight to Lisbon", 3),
                ("ann", "which hotel in Lisbon", 1),
                ("ben", "a flight to Lisbon too", 1),
            ]
        ):
            await memory.remember(
                Episode(
                    id=f"t{n}",
                    session_id=f"s-{user}",
                    user_id=user,
                    input=text,
                    output="done",
                    occurred_at=now - timedelta(days=age),
                )
            )
    hits = as_json(
        await run(settings, "recall", "Lisbon flight", "-u", "ann", "-p", "demo", "--json")
    )
    assert [h["episode"]["id"] for h in hits] == ["t0", "t1"]
    best = hits[0]
    assert best["score"] > hits[1]["score"] and best["bm25_score"] > 0
    assert best["vector_score"] is None  # words only: no vectors here
    assert (best["episode"]["input"], best["episode"]["output"]) == (
        "book a flight to Lisbon",
        "done",
    )
    assert best["episode"]["session_id"] == "s-ann" and best["episode"]["occurred_at"]
    recent = as_json(
        await run(
            settings, "recall", "Lisbon", "-u", "ann", "-p", "demo", "--since", "2d", "--json"
        )
    )
    assert [h["episode"]["id"] for h in recent] == ["t1"]
    older = await run(
        settings,
        "recall",
        "Lisbon",
        "-u",
        "ann",
        "-p",
        "demo",
        "--until",
        "2d",
        "--limit",
        "1",
        "--json",
    )
    assert [h["episode"]["id"] for h in as_json(older)] == ["t0"]
    table = ok(await run(settings, "recall", "hotel", "-u", "ann", "-p", "demo")).stdout
    assert "which hotel in Lisbon" in table and "s-ann" in table and "bm25" in table
    # the anonymous bucket holds none of them, said once on stderr (no isolation warning)
    anonymous = await run(settings, "recall", "Lisbon", "-p", "demo", "--json")
    assert as_json(anonymous) == []
    assert anonymous.stderr.strip().splitlines() == [
        f"{ANONYMOUS} demo (what was stored without a user id)"
    ]


async def test_facts_add_supersede_recall_and_valid_at(
    settings: Settings, database_url: str, redis: Redis
) -> None:
    settings = await migrated(settings, database_url)
    tea = as_json(
        await run(settings, "facts", "-u", "ann", "--add", "ann", "likes", "tea", "--json")
    )
    again = ok(await run(settings, "facts", "-u", "ann", "--add", "ann", "likes", "tea"))
    assert again.stdout.startswith(f"fact {tea['id']}: ann likes tea")  # the same claim is one
    coffee = as_json(
        await run(settings, "facts", "-u", "ann", "--add", "ann", "Likes", "coffee", "--json")
    )
    assert coffee["predicate"] == "likes" and coffee["valid_until"] is None
    everything = as_json(await run(settings, "facts", "-u", "ann", "--json"))
    assert [f["object"] for f in everything] == ["coffee", "tea"]
    assert everything[1]["valid_until"] == coffee["valid_from"]  # superseded, kept
    assert [
        f["id"] for f in as_json(await run(settings, "facts", "coffee", "-u", "ann", "--json"))
    ] == [coffee["id"]]
    between = tea["valid_from"]
    at_tea = as_json(
        await run(settings, "facts", "ann", "-u", "ann", "--valid-at", between, "--json")
    )
    assert [f["object"] for f in at_tea] == ["tea"]
    assert as_json(await run(settings, "facts", "-u", "ben", "--json")) == []
    table = ok(await run(settings, "facts", "-u", "ann", "--limit", "1")).stdout
    assert "coffee" in table and "tea" not in table


async def test_profile_and_export_are_the_users_memory_as_json(
    settings: Settings, database_url: str, redis: Redis, tmp_path: Path
) -> None:
    settings = await migrated(settings, database_url)
    async with Memory("default", settings=settings) as memory:
        await memory.remember(
            Episode(id="t1", session_id="s1", user_id="ann", input="hi", output="hello")
        )
        await memory.update_block("persona", "Ann", user_id="ann")
    ok(await run(settings, "facts", "-u", "ann", "--add", "ann", "lives_in", "Porto"))
    profile = as_json(await run(settings, "profile", "-u", "ann"))
    assert profile["user_id"] == "ann" and profile["episode_count"] == 1
    assert profile["fact_count"] == 1 and profile["recent_sessions"] == ["s1"]
    assert [f["object"] for f in profile["sample_facts"]] == ["Porto"]
    exported = as_json(await run(settings, "export", "-u", "ann"))
    assert set(exported) == {"user_id", "episodes", "facts", "blocks", "exported_at"}
    assert [e["id"] for e in exported["episodes"]] == ["t1"]
    assert [b["name"] for b in exported["blocks"]] == ["persona"]
    assert [f["object"] for f in exported["facts"]] == ["Porto"]
    target = tmp_path / "ann.json"
    written = ok(await run(settings, "export", "-u", "ann", "--out", str(target)))
    assert (
        written.stdout == "" and json.loads(target.read_text())["episodes"] == exported["episodes"]
    )
    empty = await run(settings, "profile")
    assert as_json(empty)["episode_count"] == 0 and ANONYMOUS in empty.stderr


async def test_bad_input_and_missing_servers_are_one_line_never_a_traceback(
    settings: Settings, database_url: str, redis: Redis, tmp_path: Path
) -> None:
    settings = await migrated(settings, database_url)
    assert "user_id" in error_line(await run(settings, "blocks", "-u", "no way"), status=2)
    assert "project_id" in error_line(
        await run(settings, "facts", "-p", "a/b", "-u", "x"), status=2
    )
    bad_time = await run(settings, "recall", "x", "-u", "ann", "--since", "yesterday")
    assert "--since" in error_line(bad_time, status=2) and "RFC 3339" in bad_time.stderr
    assert "--valid-at" in error_line(
        await run(settings, "facts", "-u", "ann", "--valid-at", "soon"), status=2
    )
    assert "after --until" in error_line(
        await run(settings, "recall", "x", "-u", "ann", "--since", "1h", "--until", "2h"), status=2
    )
    assert "--content" in error_line(await run(settings, "blocks", "-u", "ann", "--set", "x"), 2)
    assert "--set or --append" in error_line(
        await run(settings, "blocks", "-u", "a", "--set", "x", "--append", "y", "--content", "z"), 2
    )
    too_big = "x" * (settings.max_value_bytes + 1)
    line = error_line(
        await run(settings, "blocks", "-u", "ann", "--set", "b", "--content", "-", stdin=too_big),
        2,  # bad input: a usage error
    )
    assert "MEMWORKER_MAX_VALUE_BYTES" in line
    assert as_json(await run(settings, "blocks", "-u", "ann", "--json")) == []  # nothing changed
    nowhere = tmp_path / "missing" / "x.json"
    line = error_line(await run(settings, "export", "-u", "ann", "--out", str(nowhere)))
    assert line.startswith("memworker: error: --out ") and "does not exist" in line, line
    down = settings.model_copy(update={"database_url": "postgresql://postgres@127.0.0.1:1/none"})
    for args in (("blocks", "-u", "ann"), ("recall", "x", "-u", "ann"), ("profile", "-u", "ann")):
        assert "cannot reach Postgres" in error_line(await run(down, *args))


async def test_an_unmigrated_database_says_to_run_migrate(
    settings: Settings, database_url: str, redis: Redis
) -> None:
    empty = settings.model_copy(update={"database_url": database_url})
    for args in (("facts", "-u", "ann"), ("blocks", "-u", "ann", "--set", "a", "--content", "b")):
        assert "memworker migrate" in error_line(await run(empty, *args))


def episodes_cli(settings: Settings, *args: str) -> Any:
    """``memworker <args>`` (not under ``memory``): ``recall``, ``episodes …``."""
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=worker_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_recall_and_episodes_list_show_what_a_turn_said(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    """A turn of user memory is its input and output, not an empty task of outcome ``turn``."""
    settings = await migrated(settings, database_url)
    async with Memory("demo", settings=settings) as memory:
        await memory.remember(
            Episode(
                id="t1",
                session_id="chat-2",
                user_id="ann",
                input="Book the Lisbon train",
                output="Booked for Friday.",
            )
        )
    listed = as_json(
        await asyncio.to_thread(episodes_cli, settings, "episodes", "list", "-p", "demo", "--json")
    )
    assert [(e["turn_id"], e["input"], e["output"]) for e in listed] == [
        ("t1", "Book the Lisbon train", "Booked for Friday.")
    ]
    table = ok(await asyncio.to_thread(episodes_cli, settings, "episodes", "list", "-p", "demo"))
    assert "Book the Lisbon train" in table.stdout
    found = as_json(
        await asyncio.to_thread(
            episodes_cli, settings, "recall", "-p", "demo", "-u", "ann", "Lisbon train", "--json"
        )
    )
    assert [(h["turn_id"], h["input"], h["output"]) for h in found] == [
        ("t1", "Book the Lisbon train", "Booked for Friday.")
    ]
    shown = ok(
        await asyncio.to_thread(
            episodes_cli, settings, "recall", "-p", "demo", "-u", "ann", "Lisbon train"
        )
    )
    assert "Book the Lisbon train" in shown.stdout and "Booked for Friday." in shown.stdout


async def test_stdin_content_drops_its_line_end_and_json_keeps_non_ascii_as_is(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    done = await run(
        settings,
        "blocks",
        "-u",
        "ann",
        "--set",
        "persona",
        "--content",
        "-",
        "--json",
        stdin="Ann mag Grüße\n",
    )
    assert as_json(done)["content"] == "Ann mag Grüße"
    assert "Grüße" in done.stdout and "\\u00fc" not in done.stdout
    remembered = await asyncio.to_thread(
        episodes_cli, settings, "remember", "-p", "demo", "--id", "n1", "--task", "Grüße senden"
    )
    ok(remembered)
    listed = ok(
        await asyncio.to_thread(episodes_cli, settings, "episodes", "list", "-p", "demo", "--json")
    )
    assert "Grüße senden" in listed.stdout and "\\u00fc" not in listed.stdout


async def test_episodes_show_of_a_forgotten_session_says_it_was_forgotten(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    ok(
        await asyncio.to_thread(
            episodes_cli,
            settings,
            "remember",
            "-p",
            "demo",
            "--id",
            "n1",
            "--task",
            "Keep it short",
        )
    )
    show = ("episodes", "show", "-p", "demo", "-s", "remember:n1")
    assert (
        json.loads(ok(await asyncio.to_thread(episodes_cli, settings, *show)).stdout)[
            "task_description"
        ]
        == "Keep it short"
    )
    ok(await asyncio.to_thread(episodes_cli, settings, "forget", "-p", "demo", "-s", "remember:n1"))
    gone = await asyncio.to_thread(episodes_cli, settings, *show)
    line = error_line(gone)
    assert "no episode for session demo/remember:n1: it was forgotten" in line, line
    never = error_line(
        await asyncio.to_thread(
            episodes_cli, settings, "episodes", "show", "-p", "demo", "-s", "never"
        )
    )
    assert "forgotten" not in never and "not terminated yet" in never
