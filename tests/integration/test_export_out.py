"""``--out`` of ``memworker export`` and ``memworker memory export`` writes a user's whole
memory: a new file of mode 0600, never through a symbolic link, never over a file without
``--force``, and a path that cannot be written is one line naming ``--out``. Before: 0644,
silent overwrite, the link followed, "unexpected FileNotFoundError"."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.integration.test_access import migrated
from tests.integration.test_client_and_cli import memworker
from worker.settings import Settings

COMMANDS = [
    ["export", "-p", "projA", "-u", "alice"],
    ["memory", "export", "-p", "projA", "-u", "alice"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=["export", "memory-export"])
async def test_out_is_private_new_and_never_through_a_link(
    redis: Redis, settings: Settings, database_url: str, tmp_path: Path, command: list[str]
) -> None:
    settings = await migrated(settings, database_url)
    target = tmp_path / "user.json"
    done = memworker(settings, *command, "--out", str(target))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    json.loads(target.read_text())

    again = memworker(settings, *command, "--out", str(target))
    assert again.returncode == 1
    assert (
        again.stderr.strip()
        == f"memworker: error: --out {target} exists: pass --force to overwrite it"
    )

    target.chmod(0o644)
    forced = memworker(settings, *command, "--out", str(target), "--force")
    assert forced.returncode == 0, forced.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600

    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    for extra in ([], ["--force"]):
        refused = memworker(settings, *command, "--out", str(link), *extra)
        assert refused.returncode == 1 and "--out" in refused.stderr, refused.stderr
        assert victim.read_text() == "keep me"

    for bad in [str(tmp_path / "sub" / "missing" / "x.json"), "", str(tmp_path)]:
        refused = memworker(settings, *command, "--out", bad)
        assert refused.returncode == 1, refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith("memworker: error: --out ") and "unexpected" not in line, line
