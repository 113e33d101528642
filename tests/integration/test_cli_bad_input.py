"""Bad input on the command line is a usage error (exit status 2) naming the field, never
"unexpected" and never a hang. Before, ``publish --set ttl_seconds=1e400 --wait`` exited 1 with
``unexpected ValueError``, ``stats --rate-seconds 1e400`` slept for ever, and a 40,000-byte
``recall`` query exited 1."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import worker_env
from tests.integration.test_access import migrated
from worker.settings import Settings

LONG = "a" * 40_000


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            ["publish", "spawn", "-p", "pr", "-s", "x", "--set", "ttl_seconds=1e400", "--wait"],
            "ttl_seconds",
        ),
        (["stats", "--rate-seconds", "1e400"], "--rate-seconds"),
        (["stats", "--rate-seconds", "nan"], "--rate-seconds"),
        (["stats", "--rate-seconds", "3601"], "--rate-seconds"),
        (["recall", "-p", "pr", LONG], "query"),
        (["memory", "recall", "-p", "pr", "-u", "ann", LONG], "query"),
    ],
)
async def test_bad_input_is_a_usage_error_naming_the_field(
    settings: Settings, database_url: str, args: list[str], named: str
) -> None:
    settings = await migrated(settings, database_url)
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=worker_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr[-500:])
    assert named in done.stderr
    assert "unexpected" not in done.stderr.lower() and "Traceback" not in done.stderr
