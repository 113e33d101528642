"""docs/contract.md is the project's own: its raw example works, and nothing in the repository
points outside it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest
from redis.asyncio import Redis

from tests.helpers import running_worker, wait_until
from worker.keys import StreamKeys
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "contract.md"


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_points_outside_the_repository() -> None:
    outside = re.compile(r"\.\./shared|/work/shared|/work/wt/|/work/main")
    offenders = []
    for path in tracked_files():
        if path == Path(__file__) or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offenders += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in outside.finditer(text)]
    assert not offenders, offenders


def test_every_relative_link_in_the_markdown_resolves_inside_the_repository() -> None:
    link = re.compile(r"\]\((?!https?:|mailto:|#)([^)#\s]+)")
    broken = []
    for path in tracked_files():
        if path.suffix != ".md":
            continue
        for target in link.findall(path.read_text()):
            resolved = (path.parent / target).resolve()
            if not resolved.is_relative_to(ROOT) or not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)} → {target}")
    assert not broken, broken


def code_blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


@pytest.mark.skipif(
    shutil.which("redis-cli") is None and not os.environ.get("CI"), reason="no redis-cli here"
)
async def test_the_contracts_raw_redis_cli_example_is_applied_by_a_running_worker(
    redis: Redis, settings: Settings, redis_url: str
) -> None:
    (example,) = code_blocks(CONTRACT, "bash")
    assert "XADD 'agents:lifecycle:{0}'" in example
    script = example.replace("'agents:", f"'{settings.stream_prefix}:")
    async with running_worker(settings):
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            env={**os.environ, "REDIS_URL": redis_url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        results = StreamKeys(settings.stream_prefix, 0).results

        async def answered() -> bool:
            entries: Any = await redis.xrange(results)
            found = [orjson.loads(f[b"data"]) for _, f in entries]
            mine = [r for r in found if r["causation_id"] == "raw-cli-1"]
            assert len(mine) <= 1
            return (
                bool(mine) and mine[0]["type"] == "agent.spawned" and mine[0]["initial_items"] == 1
            )

        await wait_until(answered)
