"""``memworker forget`` of a whole project or user asks first: on a terminal it asks, off one it
needs ``--yes``; a session, ``--before`` and ``--dry-run`` need neither. Real processes, real
servers; the terminal is a pseudo-terminal."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from tests.cli_process import GENEROUS
from tests.helpers import worker_env
from worker.settings import Settings

PROJECT = "throwaway"


def memworker(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def on_a_terminal(env: dict[str, str], answer: str, *args: str) -> tuple[int, str]:
    """Run on a pseudo-terminal; answer the first question; exit status and what it showed."""
    leader, follower = os.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    shown, answered = b"", False
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], GENEROUS)
            if not ready:
                raise AssertionError(f"no output for {GENEROUS} s: {shown!r}")
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal closed: the process ended
                break
            if not chunk:
                break
            shown += chunk
            if not answered and b"[y/N]" in shown:
                os.write(leader, answer.encode() + b"\n")
                answered = True
        return proc.wait(timeout=GENEROUS), shown.decode(errors="replace")
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def episodes(env: dict[str, str]) -> str:
    done = memworker(env, "episodes", "list", "-p", PROJECT)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.usefixtures("redis")  # its teardown deletes the streams these commands write
def test_forgetting_a_whole_project_or_user_asks_first(
    settings: Settings, database_url: str
) -> None:
    env = worker_env(settings.model_copy(update={"database_url": database_url}))
    assert memworker(env, "migrate").returncode == 0
    remembered = memworker(env, "remember", "-p", PROJECT, "--id", "a", "--task", "Keep me")
    assert remembered.returncode == 0, remembered.stderr

    for narrowing in ((), ("--user", "ann")):
        refused = memworker(env, "forget", "-p", PROJECT, *narrowing)
        assert refused.returncode == 2, refused.stderr
        assert "needs --yes when not on a terminal" in refused.stderr
    assert "Keep me" in episodes(env)

    status, shown = on_a_terminal(env, "n", "forget", "-p", PROJECT)
    assert status == 1 and "nothing forgotten" in shown, shown
    assert "Keep me" in episodes(env)

    for needs_none in (("--dry-run",), ("-s", "remember:other"), ("--before", "1000d")):
        done = memworker(env, "forget", "-p", PROJECT, *needs_none)
        assert done.returncode == 0, (needs_none, done.stderr)
    assert "Keep me" in episodes(env)

    status, shown = on_a_terminal(env, "y", "forget", "-p", PROJECT)
    assert status == 0, shown
    assert f"forgot project {PROJECT}" in shown
    assert "Keep me" not in episodes(env)

    again = memworker(env, "remember", "-p", PROJECT, "--id", "b", "--task", "Keep me too")
    assert again.returncode == 0, again.stderr
    done = memworker(env, "forget", "-p", PROJECT, "--yes")
    assert done.returncode == 0, done.stderr
    assert "Keep me too" not in episodes(env)
