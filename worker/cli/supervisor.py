"""``memworker run --workers N``: start N single-process workers, forward SIGTERM/SIGINT to
them, and fail if one fails."""

from __future__ import annotations

import signal
import subprocess
import sys


def run_processes(workers: int, consumer: str | None, metrics_port: int | None) -> int:
    """Run ``workers`` single-process workers; forward SIGTERM/SIGINT; fail if one fails."""
    children = []
    for n in range(workers):
        cmd = [sys.executable, "-m", "worker.cli", "run"]
        if consumer:
            cmd += ["--consumer", f"{consumer}-{n}"]
        if metrics_port is not None:
            cmd += ["--metrics-port", str(metrics_port + n)]
        children.append(subprocess.Popen(cmd))

    asked: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        asked.append(signum)
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = []
    for child in children:
        while True:
            try:
                codes.append(child.wait(timeout=1.0))
                break
            except subprocess.TimeoutExpired:
                # A child still importing when the signal came has no handler yet: it may
                # have ignored the signal (SIGINT is ignored in background jobs). Say it again.
                if asked:
                    forward(asked[-1], None)
    stopped = (0, -signal.SIGTERM, -signal.SIGINT, 130)  # 130: interrupted while starting
    return 1 if any(code not in stopped for code in codes) else 0
