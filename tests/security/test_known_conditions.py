"""Known conditions are named as such, never "unexpected": a forget left incomplete (Redis
down) answers 503 with what is owed, and a DATABASE_URL parameter the driver does not take is
refused at start in one line naming it, its passwords kept out. Before, the forget's body began
``unexpected ForgetIncompleteError:`` and ``serve`` started with ``?sslpassword=…``, then
``/readyz`` answered ``unexpected TypeError: connect() got an unexpected keyword argument``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.integration.results_factory import migrated_engine
from tests.security.processes import Recorded, clean_env, free_port
from worker.settings import Settings


async def test_an_incomplete_forget_is_a_503_that_says_so_not_unexpected(
    tmp_path: Path, database_url: str
) -> None:
    async with migrated_engine(database_url):
        pass
    env = clean_env(DATABASE_URL=database_url)  # Redis: a port nothing listens on
    port = free_port()
    serve = Recorded(["serve", "--port", str(port), "--host", "127.0.0.1"], env, tmp_path / "s")
    try:
        serve.wait_for("memory API of project")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            got = await http.post("/v1/forget", json={"user_id": "x"})
        assert got.status_code == 503, got.text
        error = got.json()["error"]
        assert error.startswith("forget of project"), error
        assert "incomplete" in error and "owed" in error, error
    finally:
        output = serve.finish()
    assert "unexpected" not in error.lower()
    assert "unexpected ForgetIncompleteError" not in output, output


def test_a_database_url_parameter_the_driver_does_not_take_is_refused_at_start() -> None:
    url = "postgresql://u:pw1secret@127.0.0.1:1/x?sslmode=require&sslpassword=pw2secret"
    done = subprocess.run(
        [sys.executable, "-m", "worker.cli", "serve", "--port", str(free_port())],
        env=clean_env(DATABASE_URL=url),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("memworker: error: invalid configuration: DATABASE_URL:"), lines
    assert "'sslpassword'" in lines[0]
    assert "secret" not in done.stderr + done.stdout
    assert "unexpected" not in lines[0]


def test_an_sslmode_the_driver_does_not_take_is_refused_at_start_naming_database_url() -> None:
    """Before, ``?sslmode=bogus`` started ``serve`` and every connection failed with
    ``unexpected InterfaceError``."""
    for query in ("sslmode=bogus", "ssl=true", "sslmode=Require", "sslmode="):
        url = f"postgresql://u:pw1secret@127.0.0.1:1/x?{query}"
        done = subprocess.run(
            [sys.executable, "-m", "worker.cli", "serve", "--port", str(free_port())],
            env=clean_env(DATABASE_URL=url),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("memworker: error: invalid configuration: DATABASE_URL:"), lines
        assert "sslmode must be one of disable, allow, prefer, require" in lines[0], lines
        assert "secret" not in done.stderr + done.stdout
    for mode in ("disable", "verify-full"):
        url = f"postgresql://u@127.0.0.1:1/x?sslmode={mode}"
        assert Settings(database_url=url).database_url.endswith(f"?ssl={mode}")


def test_the_connection_parameters_taken_are_those_asyncpg_connect_takes() -> None:
    import inspect

    import asyncpg  # type: ignore[import-untyped]

    from worker.settings import _CONNECT_PARAMETERS

    taken = set(inspect.signature(asyncpg.connect).parameters)
    assert _CONNECT_PARAMETERS - {"prepared_statement_cache_size"} <= taken
    internal = {"dsn", "loop", "connection_class", "record_class", "server_settings"}
    assert taken - internal <= _CONNECT_PARAMETERS
