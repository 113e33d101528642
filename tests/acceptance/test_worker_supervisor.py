"""``memworker run --workers N`` as a process manager sees it: each worker process on a metrics
port of its own (``MEMWORKER_METRICS_PORT`` + n), a worker killed is restarted, and one that
keeps dying takes the parent down with one clear line instead of a parent that looks alive."""

from __future__ import annotations

import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import psutil
import pytest

from tests.cli_process import GENEROUS, Memworker
from tests.helpers import worker_env
from tests.redis_process import free_port
from worker.settings import Settings

pytestmark = pytest.mark.slow

Supervisor = Callable[..., Memworker]


def two_free_ports() -> int:
    """A port P such that P and P + 1 are both free now."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two adjacent free ports")


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def until(check: Callable[[], bool], timeout: float = GENEROUS) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


def workers_of(parent: Memworker) -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process(parent.proc.pid).children()
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]


@pytest.fixture
def supervisor(settings: Settings) -> Iterator[Supervisor]:
    started: list[Memworker] = []

    def start(metrics_port: int) -> Memworker:
        env = worker_env(settings, MEMWORKER_METRICS_PORT=str(metrics_port))
        proc = Memworker(["run", "--workers", "2"], env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        children = psutil.Process(proc.proc.pid).children() if proc.proc.poll() is None else []
        if proc.proc.poll() is None:
            proc.stop_with(signal.SIGTERM)
        proc.close()
        for child in children:  # what a failing test's parent left
            if child.is_running():
                child.kill()


def test_each_worker_serves_its_own_metrics_port(supervisor: Supervisor) -> None:
    port = two_free_ports()
    parent = supervisor(port)
    assert until(lambda: ready(port) and ready(port + 1)), "".join(parent.lines[-20:])
    time.sleep(2)  # a worker that lost a race for one port would be gone by now
    assert ready(port) and ready(port + 1)
    assert len(workers_of(parent)) == 2
    assert parent.stop_with(signal.SIGTERM) == 0


def test_a_killed_worker_is_restarted_and_serves_again(supervisor: Supervisor) -> None:
    port = two_free_ports()
    parent = supervisor(port)
    assert until(lambda: ready(port) and ready(port + 1)), "".join(parent.lines[-20:])
    victim = workers_of(parent)[1]
    victim.kill()
    victim.wait(10)
    line = parent.lines[parent.wait_for(f"(pid {victim.pid}) ended (killed by SIGKILL)")]
    assert line.strip().endswith("restarting it")
    assert until(lambda: len(workers_of(parent)) == 2 and ready(port) and ready(port + 1))
    assert victim.pid not in [p.pid for p in workers_of(parent)]
    assert parent.stop_with(signal.SIGTERM) == 0


def test_a_worker_that_keeps_dying_stops_the_parent_with_one_clear_line(
    supervisor: Supervisor,
) -> None:
    port = two_free_ports()
    with socket.socket() as squatter:  # worker 1's port is taken: it exits at every start
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("0.0.0.0", port + 1))
        squatter.listen()
        parent = supervisor(port)
        assert until(lambda: ready(port)), "".join(parent.lines[-20:])
        survivor = workers_of(parent)
        assert parent.proc.wait(timeout=120) == 1
    errors = [line for line in parent.lines if line.startswith("memworker: error:")]
    assert errors[-1].startswith("memworker: error: worker process 1 (pid "), parent.lines
    assert "ended (exit status 1) 6 times within 60 s; stopping the others" in errors[-1]
    assert until(lambda: not any(p.is_running() for p in survivor), timeout=30)
    assert not ready(port), "worker 0 went down with the parent"
