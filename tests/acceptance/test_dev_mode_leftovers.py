"""``memworker dev`` leaves no server behind: every stop signal stops its embedded Valkey and
PostgreSQL, and what a ``dev`` killed with SIGKILL left running, the next ``dev`` on the data dir
stops before it starts its own (never two Valkeys on one data dir); a ``dev`` killed with SIGKILL
has its servers stopped within seconds by its watchdog. It also takes its metrics
port from ``MEMWORKER_METRICS_PORT`` as ``run`` does."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.cli_process import Memworker
from tests.redis_process import free_port

Dev = Callable[..., Memworker]


def servers_on(data_dir: Path) -> list[psutil.Process]:
    """The Valkey and PostgreSQL server processes serving ``data_dir`` (Valkey runs in its data
    dir; the postmaster names its data dir on its command line)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            name = proc.info["name"] or ""
            valkey = "valkey" in name and Path(proc.cwd()).is_relative_to(data_dir)
            postmaster = name == "postgres" and str(data_dir / "postgres") in (
                proc.info["cmdline"] or []
            )
            if valkey or postmaster:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def valkeys_on(data_dir: Path) -> list[psutil.Process]:
    return [p for p in servers_on(data_dir) if "valkey" in p.name()]


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "data"
    yield path
    for proc in servers_on(path):  # whatever a failing test left: only servers of this test
        with contextlib.suppress(psutil.Error):
            proc.kill()


@pytest.fixture
def dev(prefix: str, data_dir: Path) -> Iterator[Dev]:
    """``memworker dev`` on ``data_dir`` with embedded Valkey and PostgreSQL."""
    started: list[Memworker] = []

    def start(*, metrics_port: int | None = None, env: dict[str, str] | None = None) -> Memworker:
        environ = {
            k: v
            for k, v in os.environ.items()
            if k not in ("REDIS_URL", "DATABASE_URL", "MEMWORKER_METRICS_PORT")
        }
        environ.update(MEMWORKER_STREAM_PREFIX=prefix, MEMWORKER_LOG_JSON="true", **(env or {}))
        args = ["dev", "--data-dir", str(data_dir)]
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port)]
        proc = Memworker(args, environ)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.stop_with(signal.SIGTERM)
        proc.close()


def gone(procs: list[psutil.Process], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_every_stop_signal_stops_the_embedded_servers(
    dev: Dev, data_dir: Path, signum: signal.Signals
) -> None:
    proc = dev(metrics_port=free_port())
    proc.wait_for("memworker dev is running.")
    servers = servers_on(data_dir)
    assert len(valkeys_on(data_dir)) == 1 and len(servers) >= 2, servers
    assert proc.stop_with(signum) == 0, "".join(proc.lines[-20:])
    assert gone(servers), f"still running after {signum.name}: {servers_on(data_dir)}"


def watchdogs_of(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "worker.ops.dev_watchdog" in cmdline and str(data_dir / "dev.lock") in cmdline:
            found.append(proc)
    return found


def with_children(procs: list[psutil.Process]) -> list[psutil.Process]:
    every = list(procs)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            every += proc.children(recursive=True)
    return every


def test_nothing_outlives_a_dev_killed_with_sigkill_by_more_than_seconds(
    dev: Dev, data_dir: Path
) -> None:
    proc = dev(metrics_port=free_port())
    proc.wait_for("memworker dev is running.")
    every = with_children(servers_on(data_dir)) + watchdogs_of(data_dir.resolve())
    assert len(every) >= 4, every  # Valkey, the postmaster and its children, the watchdog
    proc.proc.send_signal(signal.SIGKILL)
    proc.proc.wait()
    assert gone(every, timeout=10), f"outlived the killed dev: {every}"


def test_servers_left_by_a_killed_dev_are_stopped_by_the_next_one(dev: Dev, data_dir: Path) -> None:
    first = dev(metrics_port=free_port())
    first.wait_for("memworker dev is running.")
    left = servers_on(data_dir)
    [watchdog] = watchdogs_of(data_dir.resolve())
    watchdog.kill()  # a kill of everything the dev started: its servers stay
    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait()
    assert not gone(left, timeout=1), "SIGKILL leaves the daemons running: the case at hand"

    second = dev(metrics_port=free_port())
    second.wait_for("memworker dev is running.")
    assert gone(left), f"left running beside the new servers: {servers_on(data_dir)}"
    assert len(valkeys_on(data_dir)) == 1, "one Valkey on the data dir"
    notes = [line for line in second.lines if line.startswith("note: stopped the embedded")]
    assert len(notes) == 2, second.lines
    assert "Valkey" in notes[0] and "PostgreSQL" in notes[1]
    now = servers_on(data_dir)
    assert second.stop_with(signal.SIGTERM) == 0
    assert gone(now), f"the second dev's servers outlive it: {servers_on(data_dir)}"


def test_dev_serves_metrics_on_memworker_metrics_port(dev: Dev) -> None:
    port = free_port()
    proc = dev(env={"MEMWORKER_METRICS_PORT": str(port)})
    proc.wait_for("memworker dev is running.")
    banner = proc.lines[proc.wait_for("  metrics ")]
    assert f"http://127.0.0.1:{port}/metrics" in banner
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
        assert reply.status == 200
