"""The memory inspector's pages as a browser loads them: a user with ``--turns`` turns
(10,000) and ``--facts`` facts (1,000), loaded in SQL into a database of its own (dropped at
the end), served by a real ``memworker serve`` and opened ``--loads`` times each in headless
Chromium (Debian's ``chromium`` and ``chromium-driver``: ``deploy/browser.sh``). The time is
the browser's own (Navigation Timing): from the navigation's start to ``loadEventEnd`` (the
HTML, its CSS and script fetched, parsed and laid out), the cache off; "server" is its part
from ``requestStart`` to ``responseStart`` (the server's work on the page).

    PYTHONPATH=.:bench .venv/bin/python bench/inspector_page.py [--redis-url URL] \\
        [--database-url URL | --pgvector] [--turns 10000] [--facts 1000] [--loads 30] \\
        [--pages recall user] [--before CHECKOUT] [--breakdown]

The pages: the project's users, the user's page (its 200 latest facts, blocks, sessions,
profile), a session's messages, recall and the live page. Recall is by words alone on a
Postgres without pgvector; ``--pgvector`` runs an embedded one with it (pgserver) and gives
every turn and fact a random vector of the local model, so recall also embeds the query and
searches by meaning. ``--before CHECKOUT`` serves that checkout's code too, on the same data,
its loads alternating with this code's (the ratio under the same load), on a copy of the
database at that checkout's own schema revision (an index this code's migrations add is not
there for it), and checks that both show the same content on every page but the live one
(the turns, facts and scores the recall page shows among it); ``--breakdown`` times
the recall page's parts in process (the turns' recall and its steps, the facts', the render).
The target: a page in at most 200 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    cleanup,
    fresh_database,
    markdown_table,
    percentile,
    unique_prefix,
)
from recall_common import pgvector_server
from redis.asyncio import Redis
from sqlalchemy import Connection, make_url, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from user_memory import PROJECT, load_facts, load_turns

from worker.db.engine import create_database_engine
from worker.db.migrate import alembic_config, head_revision
from worker.db.vectors import VECTOR_TABLE, has_vector_table, hnsw_index_sql
from worker.settings import (
    LOCAL_EMBEDDING_DIMENSION,
    LOCAL_EMBEDDING_MODEL,
    Settings,
    asyncpg_url,
)
from worker.user_memory.memory import Memory

USER = "heavy-user"
TOKEN = "bench-inspector-token"
TARGET_MS = 200.0
PAGES = [
    ("users", "/ui/"),
    ("user", f"/ui/users/{USER}"),
    ("session", f"/ui/users/{USER}/sessions/s10"),
    ("recall", f"/ui/users/{USER}/recall?q=invoice+refund+shipping"),
    ("live", "/ui/live"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chromium() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        sys.exit("no chromium / chromedriver: run deploy/browser.sh (as root)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,900",
        "--disk-cache-size=1",
    ):
        options.add_argument(flag)
    web = webdriver.Chrome(service=Service(driver), options=options)
    web.execute_cdp_cmd("Network.enable", {})
    web.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
    return web


def load_ms(web: Any, url: str) -> tuple[float, float]:
    """The page's load as the browser timed it (Navigation Timing): navigation start to
    ``loadEventEnd``, and of it the server's part (``requestStart`` to ``responseStart``)."""
    web.get(url)
    for _ in range(100):
        timing = web.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            " return n && n.loadEventEnd > 0"
            " ? [n.loadEventEnd - n.startTime, n.responseStart - n.requestStart] : null;"
        )
        if timing is not None:
            return float(timing[0]), float(timing[1])
        time.sleep(0.01)
    raise RuntimeError(f"{url} did not finish loading")


async def seed(database_url: str, redis_url: str, prefix: str, turns: int, facts: int) -> None:
    settings = Settings(redis_url=redis_url, database_url=database_url, stream_prefix=prefix)
    async with Memory(PROJECT, settings=settings) as memory:
        await load_turns(memory, USER, turns)
        await load_facts(memory, USER, facts)
        for name in ("persona", "preferences", "projects"):
            await memory.update_block(name, f"{name} of {USER}: " + "words " * 60, user_id=USER)
        async with memory.engine.begin() as conn:
            if await has_vector_table(conn):  # every turn and fact embedded (random vectors)
                await seed_vectors(conn)


async def seed_vectors(conn: AsyncConnection) -> None:
    """A random vector of the local model for every turn (the HNSW index built after) and
    every fact, as if the indexer had embedded them all."""
    dim, random_vector = LOCAL_EMBEDDING_DIMENSION, "array(SELECT random() - 0.5 FROM"
    await conn.execute(
        text(
            f"INSERT INTO {VECTOR_TABLE} (episode_id, project_id, model, dimension, embedding)"
            f" SELECT e.id, e.project_id, :m, {dim}, CAST({random_vector}"
            f" generate_series(1, {dim}) WHERE e.id IS NOT NULL) AS vector) FROM episodes e"
        ),
        {"m": LOCAL_EMBEDDING_MODEL},
    )
    await conn.execute(text(hnsw_index_sql(dim)))
    await conn.execute(
        text(
            f"UPDATE facts f SET embedding_model = :m, embedding = {random_vector}"
            f" generate_series(1, {dim}) WHERE f.id IS NOT NULL)"
        ),
        {"m": LOCAL_EMBEDDING_MODEL},
    )
    await conn.execute(text(f"ANALYZE {VECTOR_TABLE}"))


class Timed:
    """Wall time spent in each wrapped function of a module (``wrap``), per call."""

    def __init__(self) -> None:
        self.spent: dict[str, list[float]] = {}
        self.on = True

    def wrap(self, module: Any, name: str, label: str) -> None:
        inner = getattr(module, name)
        spent = self.spent.setdefault(label, [])

        if asyncio.iscoroutinefunction(inner):

            async def timed(*a: Any, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await inner(*a, **k)
                finally:
                    if self.on:
                        spent.append((time.perf_counter() - start) * 1000)

        else:

            def timed(*a: Any, **k: Any) -> Any:  # type: ignore[misc]
                start = time.perf_counter()
                try:
                    return inner(*a, **k)
                finally:
                    if self.on:
                        spent.append((time.perf_counter() - start) * 1000)

        setattr(module, name, timed)


async def recall_breakdown(database_url: str, redis_url: str, prefix: str, rounds: int) -> str:
    """Where the recall page's time goes, in process (no HTTP, no browser): the turns' recall
    and its steps, the facts' recall, both at once as the page runs them, and the render."""
    from starlette.requests import Request

    from worker.inspector import server as inspector_server
    from worker.inspector.app import Shared
    from worker.user_memory import memory as memory_module
    from worker.user_memory import recall as turn_recall
    from worker.user_memory.facts import FactStore

    timed = Timed()
    for name, label in (
        ("_meaning_beside", "turns: the meaning half, beside the words (embedding + search)"),
        ("_meaning", "turns: the vector search"),
        ("_words", "turns: the words search (one statement)"),
        ("rank", "turns: ranking (twice)"),
        ("read_context_sessions", "turns: the best turns' sessions read"),
        ("_unindexed", "turns: which have no vector"),
    ):
        timed.wrap(turn_recall, name, label)
    timed.wrap(memory_module, "embed_query_or_none", "turns: the query's embedding")
    for name, label in (
        ("_recall_by_words", "facts: the words search"),
        ("_indexed_embedder", "facts: whether the project's facts have vectors"),
        ("_recall_by_meaning", "facts: the query's embedding and the cosines"),
    ):
        timed.wrap(FactStore, name, label)
    query = dict(parse_qsl(PAGES[3][1].split("?", 1)[1]))["q"]
    settings = Settings(redis_url=redis_url, database_url=database_url, stream_prefix=prefix)
    ui = inspector_server.inspector_app(Shared(lambda: None), TOKEN).state.ui  # type: ignore[arg-type,return-value]
    request = Request({"type": "http", "method": "GET", "path": "/", "headers": []})
    spent: dict[str, list[float]] = {}

    def took(label: str, start: float) -> None:
        spent.setdefault(label, []).append((time.perf_counter() - start) * 1000)

    async with Memory(PROJECT, settings=settings) as memory:
        for n in range(rounds + 3):
            if n == 3:  # warm: the first rounds are not counted
                spent.clear()
                for samples in timed.spent.values():
                    samples.clear()
            start = time.perf_counter()
            turns = await memory.recall_scored(query, limit=10, user_id=USER)
            took("turns: Memory.recall_scored, whole", start)
            start = time.perf_counter()
            facts = await memory.recall_facts_scored(query, limit=10, user_id=USER)
            took("facts: Memory.recall_facts_scored", start)
            start, timed.on = time.perf_counter(), False  # its parts overlap: not counted
            await asyncio.gather(
                memory.recall_scored(query, limit=10, user_id=USER),
                memory.recall_facts_scored(query, limit=10, user_id=USER),
            )
            took("both at once (the page's way)", start)
            timed.on = True
            start = time.perf_counter()
            ui.render(
                request,
                "recall.html",
                "Recall",
                base="/ui/users/x",
                crumbs=[],
                floor=0.2,
                q=query,
                limit=10,
                searched=True,
                matches=turns,
                unindexed=turns.unindexed,
                facts=facts,
            )
            took("render recall.html", start)
    rows = [
        [label, f"{percentile(v, 50):.1f}", f"{percentile(v, 95):.1f}", f"{len(v) / rounds:.0f}"]
        for label, v in [*spent.items(), *timed.spent.items()]
        if v
    ]
    return markdown_table(["part of the recall page", "p50 ms", "p95 ms", "calls"], rows, "lrrr")


def revision_of(code: str) -> str:
    """The head schema revision of the checkout ``code``'s migrations."""
    found = subprocess.run(
        [
            sys.executable,
            "-c",
            "from worker.db.migrate import head_revision; print(head_revision())",
        ],
        env={**os.environ, "PYTHONPATH": str(Path(code).resolve())},
        cwd=code,
        capture_output=True,
        text=True,
        check=True,
    )
    return found.stdout.strip()


@contextlib.asynccontextmanager
async def schema_of(url: str, code: str) -> AsyncIterator[str]:
    """The database at ``url`` as the checkout ``code`` would have it: ``url`` itself when its
    migrations end where ours do, else a copy (dropped afterwards) downgraded by our migrations
    to its head revision (e.g. without an index ours add): its code is timed without it."""
    revision = revision_of(code)
    if revision == head_revision():
        yield url
        return
    source = str(make_url(url).database)
    name = source + "_before"
    admin = create_async_engine(asyncpg_url(url), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{source}"'))
        copy = make_url(url).set(database=name).render_as_string(hide_password=False)
        engine = create_database_engine(copy, pool=False)
        try:
            async with engine.begin() as conn:

                def downgrade(sync: Connection) -> None:
                    from alembic import command

                    command.downgrade(alembic_config(sync), revision)

                await conn.run_sync(downgrade)
        finally:
            await engine.dispose()
        try:
            yield copy
        finally:
            async with admin.connect() as conn:
                await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


def shown(web: Any, url: str) -> str:
    """The text a page shows in its ``main`` (its tables, scores and times among it)."""
    web.get(url)
    return str(web.find_element("id", "main").text)


@contextlib.contextmanager
def serving(env: dict[str, str], code: str | None) -> Iterator[str]:
    """``memworker serve`` of ``PROJECT`` (the code of the checkout ``code``, else this one)
    until the block ends: its base URL."""
    port = free_port()
    env = dict(env)
    if code is not None:
        env["PYTHONPATH"] = str(Path(code).resolve())
    args = ["serve", "--port", str(port), "--project", PROJECT, "--host", "127.0.0.1"]
    server = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        env=env,
        cwd=code,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        for line in server.stderr:
            if "memory API of project" in line:
                break
        # the rest of its lines read and dropped: a full pipe would stall the server
        threading.Thread(target=server.stderr.read, daemon=True).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=60)


def sign_in(web: Any, base: str) -> None:
    web.get(base + "/ui/login")
    web.find_element("id", "token").send_keys(TOKEN + "\n")
    time.sleep(1)


Samples = dict[tuple[str, str], list[tuple[float, float]]]


async def measure(args: argparse.Namespace, server_url: str, prefix: str, samples: Samples) -> str:
    """The pages loaded on a fresh database of ``server_url``: into ``samples`` by (page,
    code); the recall page's breakdown (``--breakdown``) returned."""
    pages = [(label, path) for label, path in PAGES if not args.pages or label in args.pages]
    codes: dict[str, str | None] = {"this": None}
    if args.before:
        codes = {"before": args.before, "after": None}
    async with fresh_database(server_url) as url, contextlib.AsyncExitStack() as databases:
        await seed(url, args.redis_url, prefix, args.turns, args.facts)
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMWORKER_")}
        env.update(
            REDIS_URL=args.redis_url,
            MEMWORKER_STREAM_PREFIX=prefix,
            MEMWORKER_API_TOKEN=TOKEN,
            MEMWORKER_LOG_LEVEL="WARNING",
        )
        urls = {
            name: url if c is None else await databases.enter_async_context(schema_of(url, c))
            for name, c in codes.items()
        }
        with contextlib.ExitStack() as stack:
            bases = {
                name: stack.enter_context(serving({**env, "DATABASE_URL": urls[name]}, c))
                for name, c in codes.items()
            }
            web = chromium()
            stack.callback(web.quit)
            for base in bases.values():
                sign_in(web, base)
            for _label, path in pages:
                for base in bases.values():
                    for _ in range(3):  # warm: connections, the server's first queries
                        load_ms(web, base + path)
            for _ in range(args.loads):  # the codes alternate, page by page
                for label, path in pages:
                    for name, base in bases.items():
                        samples.setdefault((label, name), []).append(load_ms(web, base + path))
            for label, path in pages:  # the same content from each code (live: it changes)
                contents = {shown(web, base + path) for base in bases.values()}
                if label != "live" and len(contents) > 1:
                    raise AssertionError(f"the {label} page differs between the codes")
        if args.breakdown:
            return await recall_breakdown(url, args.redis_url, prefix, args.loads)
    return ""


async def run(args: argparse.Namespace) -> str:
    prefix = unique_prefix("inspector")
    redis = Redis.from_url(args.redis_url)
    samples: Samples = {}
    load_before = os.getloadavg()
    try:
        with contextlib.ExitStack() as servers:
            server_url = args.database_url
            if args.pgvector:
                server_url = servers.enter_context(pgvector_server(None))
            breakdown = await measure(args, server_url, prefix, samples)
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    rows = []
    for (label, name), pairs in samples.items():
        loads, server = [p[0] for p in pairs], [p[1] for p in pairs]
        rows.append(
            [
                label,
                *([name] if args.before else []),
                f"{percentile(loads, 50):.0f}",
                f"{percentile(loads, 95):.0f}",
                f"{max(loads):.0f}",
                f"{percentile(server, 50):.0f}",
            ]
        )
    header = ["page", *(["code"] if args.before else []), "p50 ms", "p95 ms", "max ms"]
    table = markdown_table([*header, "server p50 ms"], rows, "l" * (len(header) - 3) + "rrrr")
    load_after = os.getloadavg()
    out = (
        f"inspector pages in headless Chromium, {args.loads} loads each (cache off), "
        f"{args.turns:,} turns and {args.facts:,} facts for one user, "
        f"{'pgvector (random vectors)' if args.pgvector else 'no pgvector (words only)'}; "
        f"target: a page "
        f"≤ {TARGET_MS:.0f} ms; {platform.machine()}, {os.cpu_count()} cores; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after\n\n{table}"
    )
    if breakdown:
        out += "\n\n" + breakdown
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--facts", type=int, default=1_000)
    parser.add_argument("--loads", type=int, default=30)
    parser.add_argument("--pages", nargs="*", help="only these pages (labels: users, user, ...)")
    parser.add_argument(
        "--before", help="also serve the code of this checkout, its loads alternating with ours"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="the recall page's parts, timed in process"
    )
    parser.add_argument(
        "--pgvector",
        action="store_true",
        help="an embedded PostgreSQL with pgvector (every turn and fact with a random vector)",
    )
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
