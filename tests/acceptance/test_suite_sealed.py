"""``make test`` beside ``make run``: the suite neither uses nor changes a running dev's data.

A user's ``memworker dev`` runs in the user's HOME (it writes ``dev.env`` there, which the CLI
reads to find its servers); the suite, started from that same shell, runs with a HOME of its own
(``tests.sealed_home``): its CLI runs print no "using … of the memworker dev" line, pass, and
leave the user's data dir and the dev's data as they were, to the byte.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.cli_process import Memworker
from tests.redis_process import free_port

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "worker.cli"]
PICKUP = "of the memworker dev running on"

NESTED = [
    "tests/integration/test_working_memory.py::test_a_missing_key_reads_as_the_default",
    "tests/integration/test_cli_errors.py::test_an_unreachable_postgres_names_the_url_without_its_password",
    "tests/integration/test_cli_errors.py::test_a_redis_url_with_another_scheme_is_a_configuration_error",
    "tests/integration/test_cli_errors.py::test_a_database_url_for_another_database_is_a_configuration_error",
]
"""Tests that run the CLI in the suite's environment with one server URL unset: beside a dev
whose ``dev.env`` the CLI read, they saw its servers and an extra line; and one on the suite's
Redis (a run on the user's dev's Redis deletes the worker's function library when it ends)."""


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


async def _user_data(redis: Redis, prefix: str) -> dict[str, object]:
    """What the user's Redis holds under the dev's prefix: each key, a stream by its entries."""
    held: dict[str, object] = {}
    async for key in redis.scan_iter(match=f"{prefix}:*"):
        kind = await redis.type(key)
        held[key.decode()] = (
            await redis.xrange(key) if kind == b"stream" else (kind, await redis.dump(key))
        )
    held["FUNCTION LIST"] = await redis.function_list()  # type: ignore[misc]  # the dev's worker loaded its library
    return held


@pytest.mark.parametrize("sourced", [False, True], ids=["dev-running", "dev-env-sourced"])
async def test_the_suite_beside_a_running_dev_leaves_the_users_data_alone(
    tmp_path: Path, redis_url: str, database_url: str, prefix: str, redis: Redis, sourced: bool
) -> None:
    """``sourced``: the user ran ``source dev.env`` in the shell that runs ``make test``."""
    user_home = tmp_path / "user"
    user_home.mkdir()
    # The user's shell: their HOME, no server URLs, nothing of the suite's sealing.
    user_env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "HOME")
        and not k.startswith("XDG_")
        and (not k.startswith("MEMWORKER_") or k == "MEMWORKER_EMBEDDING_CACHE_DIR")
    }
    user_env["HOME"] = str(user_home)
    dev = Memworker(
        ["dev", "--metrics-port", str(free_port())],
        {
            **user_env,
            "REDIS_URL": redis_url,
            "DATABASE_URL": database_url,
            "MEMWORKER_STREAM_PREFIX": prefix,
            "MEMWORKER_LOG_JSON": "true",
        },
    )
    try:
        dev.wait_for("memworker dev is running.")
        users = subprocess.run(
            [
                *CLI,
                "publish",
                "spawn",
                "-p",
                "demo",
                "-s",
                "s1",
                "--state",
                '{"goal": "hi"}',
                "--wait",
            ],
            env=user_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        # The user's own commands do use the dev (the setting this test is about is real).
        assert users.returncode == 0 and PICKUP in users.stderr, users.stderr
        data_dir = user_home / ".local/share/memworker"
        files, held = _files(data_dir), await _user_data(redis, prefix)
        assert "dev.env" in files and held["FUNCTION LIST"]
        shell = dict(user_env)
        if sourced:
            for line in files["dev.env"].decode().splitlines():
                name, _, value = line.removeprefix("export ").partition("=")
                shell[name] = shlex.split(value)[0]

        nested = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NESTED],
            cwd=ROOT,
            env=shell,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        output = nested.stdout + nested.stderr
        assert nested.returncode == 0, output[-3000:]
        assert PICKUP not in output
        assert _files(data_dir) == files
        assert await _user_data(redis, prefix) == held
        assert dev.proc.poll() is None
    finally:
        if dev.proc.poll() is None:
            dev.stop_with(signal.SIGINT)
        dev.close()
