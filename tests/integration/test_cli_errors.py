"""The CLI's failures are one line a person can act on, with exit status 1 (2 for usage).

Every case runs the real ``memworker`` in a subprocess against real servers (or none, where the
failure is that there is none) and asserts the exit status and the whole of stderr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import make_url

from tests.integration.disposable_postgres import DisposablePostgres
from tests.redis_process import free_port


def memworker(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env={**os.environ, "MEMWORKER_LOG_JSON": "true", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (asserting there is only one)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("memworker: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and "sqlalche.me" not in proc.stderr
    return lines[0].removeprefix("memworker: error: ")


@pytest.fixture(scope="module")
def password_postgres() -> Iterator[str]:
    """A Postgres of the test's own that checks passwords (scram-sha-256); user postgres has
    password ``right``. The URL returned carries that password."""
    server = DisposablePostgres()
    try:
        url = server.start()
    except Exception as exc:  # pragma: no cover - depends on the embedded extra
        from tests import servers

        servers.unavailable("PostgreSQL", f"pgserver did not start: {exc}")
    try:
        import asyncio

        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine

        async def set_password() -> None:
            engine = create_async_engine(url)
            try:
                async with engine.begin() as conn:
                    await conn.execute(text("ALTER ROLE postgres PASSWORD 'right'"))
            finally:
                await engine.dispose()

        asyncio.run(set_password())
        (server.pgdata / "pg_hba.conf").write_text("local all all scram-sha-256\n")
        server.kill()
        server.restart()
        yield make_url(url).set(password="right").render_as_string(hide_password=False)
    finally:
        server.cleanup()


def test_a_wrong_postgres_password_says_so_and_where_to_fix_it(password_postgres: str) -> None:
    wrong = make_url(password_postgres).set(password="wrong").render_as_string(False)
    line = one_error_line(memworker("migrate", DATABASE_URL=wrong))
    assert line.startswith("Postgres refused the login: password authentication failed"), line
    assert "fix the password in DATABASE_URL" in line
    right = memworker("migrate", DATABASE_URL=password_postgres)
    assert right.returncode == 0, right.stderr


def test_an_unknown_postgres_role_says_so(postgres_url: str) -> None:
    url = make_url(postgres_url).set(username="no_such_role_here").render_as_string(False)
    line = one_error_line(memworker("migrate", DATABASE_URL=url))
    assert line.startswith("Postgres refused the login"), line
    assert '"no_such_role_here"' in line and "DATABASE_URL" in line


def test_a_missing_database_says_so_and_how_to_create_it(postgres_url: str) -> None:
    url = make_url(postgres_url).set(database="no_such_db_here").render_as_string(False)
    line = one_error_line(memworker("migrate", DATABASE_URL=url))
    assert 'database "no_such_db_here" does not exist' in line, line
    assert "createdb" in line and "DATABASE_URL" in line


def test_a_database_without_memworker_s_schema_says_to_migrate(database_url: str) -> None:
    # A fresh, empty database: what the default DATABASE_URL names on a new machine.
    line = one_error_line(
        memworker(
            "replay", "results", "--source", "postgres", "--since", "1d", DATABASE_URL=database_url
        )
    )
    assert 'relation "lifecycle_events" does not exist' in line, line
    assert "no memworker schema" in line and "memworker migrate" in line and "dev.env" in line


def test_an_unreachable_postgres_names_the_url_without_its_password() -> None:
    url = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/postgres"
    line = one_error_line(memworker("migrate", DATABASE_URL=url))
    assert line.startswith("cannot reach Postgres at postgresql+asyncpg://postgres:***@"), line
    assert "secret" not in line


def test_a_redis_url_with_another_scheme_is_a_configuration_error() -> None:
    line = one_error_line(memworker("stats", REDIS_URL="http://127.0.0.1:6379"))
    assert line.startswith("invalid configuration: REDIS_URL: must start with redis://"), line


def test_a_redis_url_whose_port_is_no_number_is_one_configuration_line() -> None:
    # it was an 88-line traceback from serve and "unexpected ValueError" from stats
    for command in (["stats"], ["serve", "--port", "1"]):
        url = "redis://u:S3cretPort@127.0.0.1:notaport/0"
        line = one_error_line(memworker(*command, REDIS_URL=url))
        assert line.startswith("invalid configuration: REDIS_URL: the port is not a number"), line
        assert "S3cretPort" not in line and "notaport" not in line


@pytest.mark.parametrize("mark", ["/", "#", "?"])
@pytest.mark.parametrize(
    ("setting", "url", "command"),
    [
        ("REDIS_URL", "redis://u:S3c{m}retPw@127.0.0.1:6399/0", ["stats"]),
        ("DATABASE_URL", "postgresql://u:S3c{m}retPw@127.0.0.1:5432/x", ["migrate"]),
    ],
)
def test_a_password_with_an_unencoded_slash_hash_or_question_mark_shows_no_piece_of_it(
    mark: str, setting: str, url: str, command: list[str]
) -> None:
    # the rest of such a password was read as the port (or the query) and quoted back
    line = one_error_line(memworker(*command, **{setting: url.format(m=mark)}))
    assert line.startswith(f"invalid configuration: {setting}: the part before the host"), line
    assert "percent-encode" in line
    assert "S3c" not in line and "retPw" not in line


def test_a_database_url_for_another_database_is_a_configuration_error() -> None:
    line = one_error_line(memworker("migrate", DATABASE_URL="mysql://u:p@127.0.0.1/db"))
    assert line.startswith("invalid configuration: DATABASE_URL: memworker stores in PostgreSQL")
    assert "ModuleNotFoundError" not in line


def test_dlq_show_of_something_that_is_no_entry_id_says_what_an_id_looks_like(
    redis_url: str, prefix: str
) -> None:
    proc = memworker("dlq", "show", "nosuchid", REDIS_URL=redis_url, MEMWORKER_STREAM_PREFIX=prefix)
    line = one_error_line(proc)
    assert line.startswith("not a stream entry id"), line
    assert "memworker dlq list" in line


def test_a_taken_metrics_port_names_the_port_and_the_option(
    redis_url: str, database_url: str, prefix: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = memworker(
            "dev",
            "--data-dir",
            str(tmp_path),
            "--metrics-port",
            str(port),
            REDIS_URL=redis_url,
            DATABASE_URL=database_url,
            MEMWORKER_STREAM_PREFIX=prefix,
        )
    line = one_error_line(proc)
    assert line.startswith(f"port {port} is already in use"), line
    assert "--metrics-port" in line
    assert not (tmp_path / "dev.env").exists(), "a dev that did not start wrote no dev.env"


@pytest.mark.parametrize(("command", "option"), [("serve", "--port"), ("mcp", "--http")])
def test_a_taken_api_port_names_the_port_and_the_option(
    redis_url: str, database_url: str, command: str, option: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = memworker(
            command,
            option,
            str(port),
            REDIS_URL=redis_url,
            DATABASE_URL=database_url,
            MEMWORKER_API_TOKEN="t0ken",
            MEMWORKER_LOG_JSON="true",
        )
    line = one_error_line(proc)
    assert line.startswith(f"port {port} is already in use"), line
    assert option in line


def test_shard_rejects_ids_every_other_command_rejects() -> None:
    proc = memworker("shard", "-p", "my project", "-s", "s1")
    assert proc.returncode == 2, proc.stderr
    assert "project_id must be" in proc.stderr
    assert memworker("shard", "-p", "my-project", "-s", "s1").stdout.strip().isdigit()


def test_reading_episodes_from_an_unreachable_postgres_names_it_without_its_password() -> None:
    url = f"postgresql://postgres:secret@127.0.0.1:{free_port()}/postgres"
    line = one_error_line(memworker("episodes", "list", "-p", "demo", DATABASE_URL=url))
    assert line.startswith("cannot reach Postgres at postgresql+asyncpg://postgres:***@"), line
    assert "DATABASE_URL" in line and "secret" not in line


def test_episodes_show_without_an_id_or_a_session_asks_for_one_of_them() -> None:
    proc = memworker("episodes", "show", "-p", "demo")
    assert proc.returncode == 2, proc.stderr
    assert "give an EPISODE_ID or --session" in proc.stderr, proc.stderr
    assert "not both" not in proc.stderr
    both = memworker("episodes", "show", "-p", "demo", "-s", "s1", "some-id")
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr


SHARD_COMMANDS = [
    ("dlq", "list"),
    ("dlq", "show", "1-0"),
    ("dlq", "redrive"),
    ("dlq", "purge", "--yes"),
    ("replay", "lifecycle"),
    ("replay", "results"),
]


@pytest.mark.parametrize("command", SHARD_COMMANDS, ids=" ".join)
@pytest.mark.parametrize("shard", ["2", "-1"])
def test_every_shard_option_refuses_a_shard_that_does_not_exist_alike(
    redis_url: str, prefix: str, command: tuple[str, ...], shard: str
) -> None:
    proc = memworker(
        *command,
        "--shard",
        shard,
        REDIS_URL=redis_url,
        MEMWORKER_STREAM_PREFIX=prefix,
        MEMWORKER_SHARDS="2",
    )
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Error: Invalid value for --shard: must be 0..1 (MEMWORKER_SHARDS is 2)" in proc.stderr


def test_every_shard_option_reads_alike_in_help() -> None:
    for command in SHARD_COMMANDS:
        shown = " ".join(memworker(*command[:2], "--help").stdout.split())
        assert (
            "--shard <int> One shard, 0 to MEMWORKER_SHARDS - 1 (default: every shard)." in shown
        ), (command, shown)


def usage_error(proc: subprocess.CompletedProcess[str], option: str) -> str:
    """The stderr of a usage error (exit status 2) about ``option``, without a traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "unexpected" not in proc.stderr, proc.stderr
    assert option in proc.stderr, proc.stderr
    return proc.stderr


def test_bad_values_are_usage_errors_before_anything_is_sent() -> None:
    """Each would reach the (unreachable) servers if it got past its check: exit 1, not 2."""
    dead = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    dead["DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    spawn = ("publish", "spawn", "-p", "demo", "-s", "s1", "--state")
    assert "NaN is not JSON" in usage_error(memworker(*spawn, '{"x": NaN}', **dead), "--state")
    listed = usage_error(memworker(*spawn, "[1, 2]", **dead), "--state")
    assert "must be a JSON object, not list" in listed
    outcome = usage_error(
        memworker("recall", "-p", "demo", "x", "--outcome", "bogus", **dead), "--outcome"
    )
    assert "success, failure, partial, abandoned" in outcome
    for verb in ("--set", "--append"):
        blocks = memworker("memory", "blocks", "-u", "ann", verb, "", "--content", "x", **dead)
        assert "a block needs a name" in usage_error(blocks, verb)


def test_usage_lines_write_arguments_as_click_does() -> None:
    for args, usage in (
        (("recall",), "recall [OPTIONS] QUERY"),
        (("publish",), "publish [OPTIONS] TYPE"),
        (("memory", "recall", "--help"), "memory recall [OPTIONS] QUERY"),
        (("episodes", "show", "--help"), "episodes show [OPTIONS] [EPISODE_ID]"),
    ):
        shown = memworker(*args)
        assert usage in shown.stdout + shown.stderr, shown
        assert "{" not in (shown.stdout + shown.stderr).splitlines()[0], shown
