"""Every bash and python block of README.md and of the documentation site's pages runs as written,
in order (the README, then the pages in the site's navigation order), as a new user runs them.

The setup is the quick start's: ``memworker dev`` (here on the test's own Redis prefix and a
fresh database, in a fresh HOME, so it writes ``~/.local/share/memworker/dev.env`` as
``make run`` does), and a working directory with ``.venv`` (this interpreter's environment).
Bash blocks run with ``bash -euo pipefail`` and no virtualenv on PATH; python blocks run with the
environment ``dev.env`` exports, as after ``source dev.env``.

A block that cannot run in a test says so in its page, right before it, with
``<!-- not run: <why> -->``; that marker is the only way to skip one. ``docs/contract.md`` is the
one page left out: its raw example has a test of its own (tests/integration/test_contract_doc.py)
and its other block is JavaScript. A block in a language this test cannot run (JavaScript, Go,
…), on any page, carries a ``not run`` marker saying why.

A port a block's server listens on (``--port 8765``) is a free one of the test's in the code it
runs: the user's own server may hold the README's, and the test's requests must not reach it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis

from schemas.results import AgentSpawned
from tests.cli_process import Memworker
from tests.redis_process import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# A page of the site's navigation in mkdocs.yml: `  - Title: path.md`.
NAV_PAGE = re.compile(r"^\s*- (?:.*: )?([\w/.-]+\.md)\s*$", re.M)
RUN_ELSEWHERE = {"contract.md"}


def documents() -> list[Path]:
    """The README, then every page of the site in navigation order."""
    nav = NAV_PAGE.findall((ROOT / "mkdocs.yml").read_text())
    assert nav, "mkdocs.yml lists no pages"
    return [README, *(ROOT / "docs" / page for page in nav if page not in RUN_ELSEWHERE)]


FENCE = re.compile(
    r"(?:<!--\s*not run:(?P<why>.*?)-->\s*\n)?```(?P<lang>[\w-]*)\n(?P<code>.*?)```", re.S
)
RUNNABLE = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
# Code this test cannot run (another language's runtime and packages): each such block says,
# in its marker, why it is not run and how a reader runs it.
OTHER_CODE = {"javascript", "js", "typescript", "ts", "go", "java", "ruby", "rust", "csharp"}
LISTENS = re.compile(r"--(?:port|http|metrics-port)[ =](\d+)\b")


def on_free_ports(code: str, free: Callable[[], int] = free_port) -> str:
    """``code`` with every port one of its servers listens on replaced by a free one, each
    occurrence of that number (the URLs that reach it too)."""
    for port in dict.fromkeys(LISTENS.findall(code)):
        code = re.sub(rf"(?<![\d.]){port}(?!\d)", str(free()), code)
    return code


@dataclass
class Block:
    path: str
    line: int
    language: str
    code: str
    not_run: str | None


def blocks_of(path: Path) -> list[Block]:
    text = path.read_text()
    return [
        Block(
            str(path.relative_to(ROOT)),
            text.count("\n", 0, m.start("code")) + 1,
            m.group("lang"),
            m.group("code"),
            m.group("why").strip() if m.group("why") is not None else None,
        )
        for m in FENCE.finditer(text)
    ]


def readme_blocks() -> list[Block]:
    """Every fenced block of the README and of the site's pages, in reading order."""
    return [block for path in documents() for block in blocks_of(path)]


def test_every_block_the_readme_does_not_run_says_why() -> None:
    blocks = readme_blocks()
    assert any(b.language == "python" for b in blocks)
    elsewhere = [b for page in RUN_ELSEWHERE for b in blocks_of(ROOT / "docs" / page)]
    for block in [*blocks, *elsewhere]:
        if block.not_run is not None:
            assert block.not_run, f"{block.path}:{block.line}: `not run:` needs a reason"
            assert block.language in RUNNABLE.keys() | OTHER_CODE, (
                f"{block.path}:{block.line}: only code is marked"
            )
        elif block.language in OTHER_CODE:
            raise AssertionError(
                f"{block.path}:{block.line}: a {block.language} block is never run: say why "
                "and how a reader runs it with <!-- not run: why -->"
            )
    for path in documents():
        prose = FENCE.sub("", path.read_text())
        indented = re.findall(r"\n\n( {4}\S.*)", prose)
        assert not indented, (
            f"{path.name}: indented code blocks are never run: fence them: {indented}"
        )


def test_every_page_of_the_site_is_read_by_this_test() -> None:
    """A page left out of mkdocs.yml's navigation would have its blocks never run."""
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    listed = {p.relative_to(ROOT / "docs").as_posix() for p in documents()[1:]}
    assert pages - RUN_ELSEWHERE == listed, pages.symmetric_difference(listed | RUN_ELSEWHERE)


MEMWORKERS_GROUPS = {"lifecycle", "consolidation", "indexer"}


async def _groups_left_behind(redis: Redis, prefix: str) -> list[str]:
    """Consumer groups the README's examples created and left: retention never trims below a
    group's unread entries, so a reader who runs an example must not be left with one."""
    left = []
    async for key in redis.scan_iter(match=f"{prefix}:*", _type="stream"):
        for group in await redis.xinfo_groups(key):
            name = group["name"].decode() if isinstance(group["name"], bytes) else group["name"]
            if name not in MEMWORKERS_GROUPS:
                left.append(f"README examples left consumer group {name!r} on {key.decode()}")
    return left


def _dev_env(path: Path) -> dict[str, str]:
    exported = {}
    for line in path.read_text().splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        exported[name] = value.strip("'")
    return exported


def test_the_readme_s_servers_listen_on_free_ports_in_the_test() -> None:
    """A user's ``serve`` on the README's port 8765 must not get the test's requests."""
    http = [
        b
        for b in readme_blocks()
        if b.not_run is None and b.language in RUNNABLE and "memworker serve" in b.code
    ]
    assert http and all(LISTENS.search(b.code) for b in http)
    for block in http:
        ran = on_free_ports(block.code, free=lambda: 40123)
        for port in LISTENS.findall(block.code):
            assert not re.search(rf"(?<![\d.]){port}(?!\d)", ran), ran
        assert "--port 40123" in ran and "http://127.0.0.1:40123/v1/forget" in ran


async def test_every_readme_block_runs_as_written(
    tmp_path: Path, redis_url: str, database_url: str, prefix: str, redis: Redis
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(sys.prefix)
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != venv_bin)
    base_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "XDG_DATA_HOME", "VIRTUAL_ENV")
        and (not k.startswith("MEMWORKER_") or k == "MEMWORKER_EMBEDDING_CACHE_DIR")
    }
    base_env.update(HOME=str(home), PATH=path)
    dev = Memworker(
        ["dev", "--metrics-port", str(free_port())],
        {
            **base_env,
            "REDIS_URL": redis_url,
            "DATABASE_URL": database_url,
            "MEMWORKER_STREAM_PREFIX": prefix,
            "MEMWORKER_LOG_JSON": "true",
        },
    )
    failures = []
    try:
        dev.wait_for("memworker dev is running.")
        sourced = {**base_env, **_dev_env(home / ".local/share/memworker/dev.env")}
        ran = 0
        for block in readme_blocks():
            if block.not_run is not None or block.language not in RUNNABLE:
                continue
            code = on_free_ports(block.code)
            if RUNNABLE[block.language] == "bash":
                command, env = ["bash", "-euo", "pipefail", "-c", code], base_env
            else:
                command, env = [str(work / ".venv/bin/python"), "-c", code], sourced
            done = subprocess.run(
                command, cwd=work, env=env, capture_output=True, text=True, timeout=180, check=False
            )
            ran += 1
            if done.returncode != 0:
                failures.append(
                    f"{block.path}:{block.line} ({block.language}) exit {done.returncode}:\n"
                    f"{done.stderr[-2000:]}"
                )
        assert ran >= 10
        failures += await _groups_left_behind(redis, prefix)
    finally:
        if dev.proc.poll() is None:
            dev.stop_with(signal.SIGINT)
        dev.close()
        # Streams a block publishes to by a name of its own, outside this test's prefix.
        for block in readme_blocks():
            for stream in re.findall(r"--publish-to\s+(\S+)", block.code):
                await redis.delete(stream)
    assert not failures, "\n\n".join(failures)


def test_the_readme_s_sample_spawn_result_has_the_fields_publish_wait_prints() -> None:
    [sample] = [
        json.loads(b.code)
        for b in readme_blocks()
        if b.language == "json" and '"type": "agent.spawned"' in b.code
    ]
    printed = json.loads(AgentSpawned.model_validate(sample).model_dump_json(indent=2))
    assert list(sample) == list(printed)


def test_the_readme_s_mcp_client_config_names_memworker_by_its_path() -> None:
    """``make run`` puts no ``memworker`` on PATH: a client config naming it bare fails."""
    configs = [json.loads(b.code) for b in readme_blocks() if '"mcpServers"' in b.code]
    assert configs
    for config in configs:
        for server in config["mcpServers"].values():
            assert server["command"].endswith("/.venv/bin/memworker"), server
