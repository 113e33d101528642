"""``memworker dev`` on one data dir: one instance at a time, its env file private and stable,
its banner's commands runnable as printed."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from redis import Redis

from tests.cli_process import Memworker
from tests.redis_process import free_port

Dev = Callable[..., Memworker]


@pytest.fixture
def dev(prefix: str, database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Dev]:
    """Start ``memworker dev`` on ``tmp_path/data``; real Postgres, Redis real unless
    ``embedded_redis``."""
    started: list[Memworker] = []

    def start(*, embedded_redis: bool = False) -> Memworker:
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env.update(
            DATABASE_URL=database_url,
            MEMWORKER_STREAM_PREFIX=prefix,
            MEMWORKER_LOG_JSON="true",
        )
        if not embedded_redis:
            env["REDIS_URL"] = redis_url
        args = ["dev", "--data-dir", str(tmp_path / "data"), "--metrics-port", str(free_port())]
        proc = Memworker(args, env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.stop_with(signal.SIGTERM)
        proc.close()
    with Redis.from_url(redis_url) as redis:  # what the dev instances left under this prefix
        keys = list(redis.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            redis.unlink(*keys)


def test_a_second_dev_on_the_same_data_dir_is_refused_and_leaves_dev_env_alone(
    dev: Dev, tmp_path: Path
) -> None:
    first = dev()
    first.wait_for("memworker dev is running.")
    env_file = tmp_path / "data" / "dev.env"
    before = env_file.read_bytes(), env_file.stat().st_mtime_ns
    second = dev(embedded_redis=True)
    assert second.proc.wait(timeout=120) == 1
    second.close()
    errors = [line for line in second.lines if not line.startswith("{")]
    assert len(errors) == 1, second.lines
    assert errors[0].startswith(
        f"memworker: error: another memworker dev (pid {first.proc.pid}) is running on "
    ), errors
    assert "--data-dir" in errors[0]
    assert (env_file.read_bytes(), env_file.stat().st_mtime_ns) == before
    assert first.proc.poll() is None, "the first instance runs on"


def test_dev_env_holding_the_database_password_is_readable_by_its_owner_only(
    dev: Dev, tmp_path: Path
) -> None:
    env_file = tmp_path / "data" / "dev.env"
    env_file.parent.mkdir(parents=True)
    env_file.write_text("old\n")
    env_file.chmod(0o644)
    dev().wait_for("memworker dev is running.")
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert "DATABASE_URL" in env_file.read_text()


def test_a_lock_left_by_a_dead_dev_is_taken_over(dev: Dev, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dev.lock").write_text("999999\n")  # no process holds its flock
    proc = dev()
    proc.wait_for("memworker dev is running.")
    assert (tmp_path / "data" / "dev.lock").read_text().strip() == str(proc.proc.pid)


def test_the_banner_commands_work_as_printed_from_a_shell_without_the_virtualenv(
    dev: Dev,
) -> None:
    proc = dev()
    at = proc.wait_for("From another terminal:")
    proc.wait_for("Ctrl-C stops everything")
    commands = [line.strip() for line in proc.lines[at + 1 :] if line.startswith("  ")]
    assert commands[0].startswith("source ")
    assert all(not c.startswith("memworker ") for c in commands), commands
    script = " && ".join(commands[:3])  # source, spawn, terminate (tail follows forever)
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert '"type": "agent.terminated"' in done.stdout


def _redis_port(env_file: Path) -> int:
    found = re.search(r"REDIS_URL='redis://127\.0\.0\.1:(\d+)/", env_file.read_text())
    assert found, env_file.read_text()
    return int(found.group(1))


def test_the_embedded_redis_keeps_its_port_across_restarts_or_says_it_moved(
    dev: Dev, tmp_path: Path
) -> None:
    env_file = tmp_path / "data" / "dev.env"
    first = dev(embedded_redis=True)
    first.wait_for("memworker dev is running.")
    port = _redis_port(env_file)
    assert first.stop_with(signal.SIGTERM) == 0
    again = dev(embedded_redis=True)
    again.wait_for("memworker dev is running.")
    assert _redis_port(env_file) == port
    assert again.stop_with(signal.SIGTERM) == 0
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        moved = dev(embedded_redis=True)
        moved.wait_for("memworker dev is running.")
        assert _redis_port(env_file) != port
        note = moved.lines[moved.wait_for("note: the embedded Redis's port")]
        assert f"port {port} (last run) is taken" in note
        assert f"source {env_file}" in note


def test_publish_wait_exits_3_on_a_rejection_and_still_prints_the_result(
    dev: Dev, tmp_path: Path
) -> None:
    dev().wait_for("memworker dev is running.")
    env_file = tmp_path / "data" / "dev.env"
    run = f"source {shlex.quote(str(env_file))} && {shlex.quote(sys.executable)} -m worker.cli"
    rejected = subprocess.run(
        ["bash", "-c", f"{run} publish pause -p demo -s never-spawned --wait"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert rejected.returncode == 3, rejected.stderr
    assert '"type": "command.rejected"' in rejected.stdout
    assert rejected.stderr.strip().startswith("memworker: rejected: unknown_session"), (
        rejected.stderr
    )
    help_text = subprocess.run(
        ["bash", "-c", f"{run} publish --help"], capture_output=True, text=True, check=False
    ).stdout
    assert "exit status 3 if the command was rejected" in " ".join(help_text.split())


def test_episodes_show_prints_a_finished_sessions_episode_or_says_why_there_is_none(
    dev: Dev, tmp_path: Path
) -> None:
    dev().wait_for("memworker dev is running.")
    env_file = tmp_path / "data" / "dev.env"
    run = f"source {shlex.quote(str(env_file))} && {shlex.quote(sys.executable)} -m worker.cli"

    def cli(args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", f"{run} {args}"], capture_output=True, text=True, timeout=120
        )

    assert cli('publish spawn -p demo -s ep1 --state \'{"goal": "g"}\' --wait').returncode == 0
    ended = cli("publish terminate -p demo -s ep1 --set lessons_learned='[\"kept\"]' --wait")
    assert ended.returncode == 0, ended.stderr
    assert cli("tail episodes --from-start --count 1").returncode == 0
    shown = cli("episodes show -p demo -s ep1")
    assert shown.returncode == 0, shown.stderr
    episode = json.loads(shown.stdout)
    assert episode["lessons_learned"] == ["kept"]
    assert "goal" in episode["context_summary"]
    listed = cli("episodes list -p demo --json")
    assert [e["id"] for e in json.loads(listed.stdout)] == [episode["id"]]
    missing = cli("episodes show -p demo -s never-ran")
    assert missing.returncode == 1
    assert missing.stderr.startswith("memworker: error: no episode for session demo/never-ran")
    assert len(missing.stderr.strip().splitlines()) == 1


def test_commands_use_a_running_devs_servers_without_sourcing_dev_env(
    prefix: str, database_url: str, tmp_path: Path
) -> None:
    unset = ("REDIS_URL", "DATABASE_URL", "MEMWORKER_STREAM_PREFIX", "MEMWORKER_METRICS_PORT")
    plain = {k: v for k, v in os.environ.items() if k not in unset}
    plain["XDG_DATA_HOME"] = str(tmp_path / "xdg")  # the default data dir: xdg/memworker
    env = {**plain, "DATABASE_URL": database_url, "MEMWORKER_STREAM_PREFIX": prefix}
    dev = Memworker(["dev", "--metrics-port", str(free_port())], env)  # embedded Valkey
    try:
        dev.wait_for("memworker dev is running.")
        env_file = tmp_path / "xdg" / "memworker" / "dev.env"
        sourced = f"source {shlex.quote(str(env_file))} && {shlex.quote(sys.executable)}"
        spawned = subprocess.run(
            ["bash", "-c", f"{sourced} -m worker.cli publish spawn -p demo -s s1 --wait"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert spawned.returncode == 0, spawned.stderr

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "worker.cli", *args],
                env=plain,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )

        shown = cli("inspect", "-p", "demo", "-s", "s1")  # read-only: no other server touched
        assert shown.returncode == 0, shown.stderr
        assert "active" in shown.stdout
        assert shown.stderr.splitlines() == [
            "memworker: using DATABASE_URL, MEMWORKER_STREAM_PREFIX, REDIS_URL of the memworker "
            f"dev running on {tmp_path / 'xdg' / 'memworker'} (set them to use other servers)"
        ]
        ended = cli("publish", "terminate", "-p", "demo", "-s", "s1", "--wait")
        assert ended.returncode == 0, ended.stderr
        assert '"type": "agent.terminated"' in ended.stdout
    finally:
        if dev.proc.poll() is None:
            dev.stop_with(signal.SIGTERM)
        dev.close()


ODD = 'it\'s $HOME `id` "q" \\n; end'
"""A password as a person may choose one: a quote, ``$``, backticks, double quotes, a
backslash, spaces (no ``@``, ``/``, ``%`` or ``?``: those are URL syntax)."""


def _with_password(url: str, password: str) -> str:
    """``url`` (no password of its own) with ``password`` written raw after its user."""
    scheme, _, rest = url.partition("://")
    user, at, tail = rest.partition("@")
    if not at or ":" in user:
        pytest.skip(f"the test database's URL has no user, or a password already: {scheme}")
    return f"{scheme}://{user}:{password}@{tail}"


def test_dev_env_gives_back_any_value_whole_to_source_and_to_other_commands(
    prefix: str, database_url: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DATABASE_URL whose password holds quotes, ``$`` and backticks (the test server trusts
    local connections: any password connects): ``source dev.env`` sets it unchanged, runs
    nothing, and a command reading ``dev.env`` itself takes it unchanged too. (Written between
    bare single quotes, the quote ended the value and the rest was run as shell words.)"""
    odd_url = _with_password(database_url, ODD)
    unset = ("REDIS_URL", "DATABASE_URL", "MEMWORKER_STREAM_PREFIX", "MEMWORKER_METRICS_PORT")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(
        XDG_DATA_HOME=str(tmp_path / "xdg"),  # the default data dir: xdg/memworker
        DATABASE_URL=odd_url,
        REDIS_URL=redis_url,
        MEMWORKER_STREAM_PREFIX=prefix,
    )
    dev = Memworker(["dev", "--metrics-port", str(free_port())], env)
    try:
        dev.wait_for("memworker dev is running.")
        env_file = tmp_path / "xdg" / "memworker" / "dev.env"
        show = 'printf "%s\\n" "$DATABASE_URL" "$REDIS_URL" "$MEMWORKER_STREAM_PREFIX"'
        sourced = subprocess.run(
            ["bash", "-c", f"source {shlex.quote(str(env_file))} && {show}"],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (sourced.returncode, sourced.stderr) == (0, ""), env_file.read_text()
        assert sourced.stdout.splitlines() == [odd_url, redis_url, prefix]

        from worker.cli.common import running_dev_env

        for name in (*unset, "MEMWORKER_REDIS_URL", "MEMWORKER_DATABASE_URL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        assert running_dev_env() == {
            "DATABASE_URL": odd_url,
            "REDIS_URL": redis_url,
            "MEMWORKER_STREAM_PREFIX": prefix,
        }
    finally:
        if dev.proc.poll() is None:
            dev.stop_with(signal.SIGTERM)
        dev.close()
        with Redis.from_url(redis_url) as redis:  # what the dev left under this prefix
            keys = list(redis.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                redis.unlink(*keys)


def test_the_embedded_valkey_listens_on_loopback_only(dev: Dev, tmp_path: Path) -> None:
    """It has no password (README, quick start): no other machine may reach it."""
    import psutil

    dev(embedded_redis=True).wait_for("memworker dev is running.")
    pid = int((tmp_path / "data" / "valkey" / "valkey.pid").read_text().split()[0])
    listening = [
        c.laddr
        for c in psutil.Process(pid).net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening, "the embedded Valkey listens on no TCP port"
    assert {address.ip for address in listening} == {"127.0.0.1"}, listening
    assert {address.port for address in listening} == {_redis_port(tmp_path / "data" / "dev.env")}
