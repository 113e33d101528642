"""The forms of ``REDIS_URL`` the settings accept work, and the ones that cannot are refused at
start with one line naming ``REDIS_URL``: before, a ``unix://`` URL failed on every command
("unexpected TypeError: … 'socket_keepalive'") and a host list without
``MEMWORKER_REDIS_SENTINEL_SERVICE`` said "unexpected ValueError: Port could not be cast…"."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_process import server_binary
from worker.settings import Settings


def cli(*args: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    settings = Settings(redis_url="redis://127.0.0.1:1/0")
    env = {
        "PATH": "/usr/bin:/bin",
        "REDIS_URL": redis_url,
        "DATABASE_URL": settings.database_url,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    sock = tmp_path / "r.sock"
    server = subprocess.Popen(
        [
            server_binary(),
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        yield sock
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_unix_socket_url_works(unix_socket: Path) -> None:
    done = cli("stats", redis_url=f"unix://{unix_socket}?db=0")
    assert done.returncode == 0, done.stderr
    assert "lifecycle" in done.stdout


def test_a_host_list_without_the_sentinel_service_is_one_line_naming_redis_url() -> None:
    done = cli("stats", redis_url="redis://S3cretXYZ@h1:26379,h2:26379/0")
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert "REDIS_URL" in line and "MEMWORKER_REDIS_SENTINEL_SERVICE" in line, line
    assert "unexpected" not in line and "S3cretXYZ" not in line
