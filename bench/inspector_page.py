"""The memory inspector's pages as a browser loads them: a user with ``--turns`` turns
(10,000) and ``--facts`` facts (1,000), loaded in SQL into a database of its own (dropped at
the end), served by a real ``memworker serve`` and opened ``--loads`` times each in headless
Chromium (Debian's ``chromium`` and ``chromium-driver``: ``deploy/browser.sh``). The time is
the browser's own (Navigation Timing): from the navigation's start to ``loadEventEnd`` (the
HTML, its CSS and script fetched, parsed and laid out), the cache off.

    .venv/bin/python bench/inspector_page.py [--redis-url URL] [--database-url URL] \\
        [--turns 10000] [--facts 1000] [--loads 30]

The pages: the project's users, the user's page (its 200 latest facts, blocks, sessions,
profile), a session's messages, recall (words only without pgvector) and the live page.
The target: the user's page in at most 200 ms (median).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from harness import (
    DEFAULT_DATABASE_URL,
    DEFAULT_REDIS_URL,
    cleanup,
    fresh_database,
    markdown_table,
    percentile,
    unique_prefix,
)
from redis.asyncio import Redis
from user_memory import PROJECT, load_facts, load_turns

from worker.settings import Settings
from worker.user_memory.memory import Memory

USER = "heavy-user"
TOKEN = "bench-inspector-token"
TARGET_MS = 200.0
PAGES = [
    ("users", "/ui/"),
    ("user (10k turns, 1k facts)", f"/ui/users/{USER}"),
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


def load_ms(web: Any, url: str) -> float:
    web.get(url)
    for _ in range(100):
        timing = web.execute_script(
            "const n = performance.getEntriesByType('navigation')[0];"
            " return n && n.loadEventEnd > 0 ? n.loadEventEnd - n.startTime : null;"
        )
        if timing is not None:
            return float(timing)
        time.sleep(0.01)
    raise RuntimeError(f"{url} did not finish loading")


async def seed(database_url: str, redis_url: str, prefix: str, turns: int, facts: int) -> None:
    settings = Settings(redis_url=redis_url, database_url=database_url, stream_prefix=prefix)
    async with Memory(PROJECT, settings=settings) as memory:
        await load_turns(memory, USER, turns)
        await load_facts(memory, USER, facts)
        for name in ("persona", "preferences", "projects"):
            await memory.update_block(name, f"{name} of {USER}: " + "words " * 60, user_id=USER)


async def run(args: argparse.Namespace) -> str:
    prefix = unique_prefix("inspector")
    redis = Redis.from_url(args.redis_url)
    rows = []
    try:
        async with fresh_database(args.database_url) as url:
            await seed(url, args.redis_url, prefix, args.turns, args.facts)
            port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("MEMWORKER_")}
            env.update(
                REDIS_URL=args.redis_url,
                DATABASE_URL=url,
                MEMWORKER_STREAM_PREFIX=prefix,
                MEMWORKER_API_TOKEN=TOKEN,
                MEMWORKER_LOG_LEVEL="WARNING",
            )
            server = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker.cli",
                    "serve",
                    "--port",
                    str(port),
                    "--project",
                    PROJECT,
                    "--host",
                    "127.0.0.1",
                ],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                assert server.stderr is not None
                for line in server.stderr:
                    if "memory API of project" in line:
                        break
                base = f"http://127.0.0.1:{port}"
                web = chromium()
                try:
                    web.get(base + "/ui/login")
                    web.find_element("id", "token").send_keys(TOKEN + "\n")
                    time.sleep(1)
                    for label, path in PAGES:
                        for _ in range(3):  # warm: connections, the server's first queries
                            load_ms(web, base + path)
                        samples = [load_ms(web, base + path) for _ in range(args.loads)]
                        p50, p95 = percentile(samples, 50), percentile(samples, 95)
                        rows.append([label, f"{p50:.0f}", f"{p95:.0f}", f"{max(samples):.0f}"])
                finally:
                    web.quit()
            finally:
                server.terminate()
                server.wait(timeout=60)
    finally:
        await cleanup(redis, prefix)
        await redis.aclose()
    table = markdown_table(["page", "p50 ms", "p95 ms", "max ms"], rows, "lrrr")
    return (
        f"inspector pages in headless Chromium, {args.loads} loads each (cache off), "
        f"{args.turns:,} turns and {args.facts:,} facts for one user; target: the user's page "
        f"≤ {TARGET_MS:.0f} ms; {platform.machine()}, {os.cpu_count()} cores\n\n{table}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--facts", type=int, default=1_000)
    parser.add_argument("--loads", type=int, default=30)
    print(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
