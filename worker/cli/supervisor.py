"""``memworker run --workers N``: start N single-process workers, forward SIGTERM/SIGINT to
them, restart one that dies, and stop them all when one keeps dying.

Child ``n`` (0-based) serves /metrics, /healthz and /readyz on the metrics port + ``n``, so no
two bind one port. A child that exits while no stop was asked is restarted after
``RESTART_DELAY`` seconds, with a line on stderr; one that died ``MAX_RESTARTS`` times within
``RESTART_WINDOW`` seconds is not: the others are stopped and the parent exits 1 with one line
naming the child and how it ended, so a process manager sees the failure instead of a parent
that stays up while a worker is gone.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

RESTART_DELAY = 1.0
MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
STOPPED = (0, -signal.SIGTERM, -signal.SIGINT, 130)  # 130: interrupted while starting


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def how_it_ended(code: int) -> str:
    """``exit status 1`` or ``killed by SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


@dataclass
class Child:
    """Worker process ``n``: how to start it and when it died lately."""

    n: int
    cmd: list[str]
    proc: subprocess.Popen[bytes] | None = None
    deaths: deque[float] = field(default_factory=deque)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd)

    def died_too_often(self, now: float) -> bool:
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > RESTART_WINDOW:
            self.deaths.popleft()
        return len(self.deaths) > MAX_RESTARTS


def run_processes(workers: int, consumer: str | None, metrics_port: int | None) -> int:
    """Run ``workers`` single-process workers until stopped; the exit status of the whole."""
    children = []
    for n in range(workers):
        cmd = [sys.executable, "-m", "worker.cli", "run"]
        if consumer:
            cmd += ["--consumer", f"{consumer}-{n}"]
        if metrics_port is not None:
            cmd += ["--metrics-port", str(metrics_port + n)]
        children.append(Child(n, cmd))
    for child in children:
        child.start()

    asked: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        for child in children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failure = _watch(children, asked)
    if failure is not None:
        forward(signal.SIGTERM, None)
    codes = [_reap(child, asked) for child in children]
    if failure is not None:
        _say(f"memworker: error: {failure}")
        return 1
    return 1 if any(code not in STOPPED for code in codes) else 0


def _watch(children: list[Child], asked: list[int]) -> str | None:
    """Watch every child until a stop is asked: restart the dead; the failure that ends the
    whole, or None once a stop was asked."""
    restart_at: dict[int, float] = {}
    while not asked:
        now = time.monotonic()
        for child in children:
            assert child.proc is not None
            if child.n in restart_at:
                if now >= restart_at[child.n]:
                    del restart_at[child.n]
                    child.start()
                continue
            code = child.proc.poll()
            if code is None or asked:
                continue
            if child.died_too_often(now):
                return (
                    f"worker process {child.n} (pid {child.proc.pid}) ended "
                    f"({how_it_ended(code)}) {len(child.deaths)} times within "
                    f"{RESTART_WINDOW:g} s; stopping the others"
                )
            _say(
                f"memworker: worker process {child.n} (pid {child.proc.pid}) ended "
                f"({how_it_ended(code)}); restarting it"
            )
            restart_at[child.n] = now + RESTART_DELAY
        time.sleep(0.1)
    return None


def _reap(child: Child, asked: list[int]) -> int:
    """Wait for ``child`` to exit; its exit status."""
    assert child.proc is not None
    while True:
        try:
            return child.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            # A child still importing when the signal came has no handler yet: it may
            # have ignored the signal (SIGINT is ignored in background jobs). Say it again.
            if asked:
                child.proc.send_signal(asked[-1])
