"""The watchdog of ``memworker dev``'s embedded servers: nothing outlives a killed ``dev``.

The embedded Valkey and PostgreSQL are daemons (a parent-death signal cannot reach them: they
are not ``dev``'s children by the time they serve), so a ``dev`` killed with SIGKILL would leave
them running. ``dev`` starts this small process first, in a session of its own (a kill of
``dev``'s process group leaves it), with the read end of a pipe whose write end only ``dev``
holds. However ``dev`` ends, the pipe closes with it: the watchdog then takes the data dir's
lock and stops what is still running there (``EmbeddedRedis/EmbeddedPostgres.stop_leftover``,
which check a pid is that data dir's server), within a second or two, and exits. After a clean
stop there is nothing left to stop. When a new ``dev`` holds the lock already, it has stopped
the leftovers itself: the watchdog leaves its servers alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

from worker.ops.embedded import EmbeddedPostgres, EmbeddedRedis

LOCK_WAIT_SECONDS = 10.0
"""How long the watchdog waits for the dead ``dev``'s lock to be released by the kernel."""


def start_watchdog(lock: Path, valkey_dir: Path, postgres_dir: Path) -> int:
    """Start the watchdog of this process's servers; the pipe's write end (keep it open for the
    life of this process: it is never inherited by the servers, its fd is not inheritable)."""
    read_end, write_end = os.pipe()
    paths = (str(lock), str(valkey_dir), str(postgres_dir))
    try:
        subprocess.Popen(
            [sys.executable, "-m", "worker.ops.dev_watchdog", str(os.getpid()), *paths],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(read_end)
    return write_end


def _lock_after(owner: int, lock: Path) -> int | None:
    """``lock``'s fd, held, once the dead ``owner`` released it; None when another ``dev`` holds
    it now (or the data dir is gone)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        return None
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            if (holder and holder != str(owner)) or time.monotonic() > deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def watch(owner: int, lock: Path, valkey_dir: Path, postgres_dir: Path) -> None:
    """Block until stdin's pipe closes (``dev`` ended), then stop what it left running."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    fd = _lock_after(owner, lock)
    if fd is None:
        return
    try:
        EmbeddedRedis(valkey_dir).stop_leftover()
        EmbeddedPostgres(postgres_dir).stop_leftover()
    finally:
        os.close(fd)


if __name__ == "__main__":
    pid, *paths = sys.argv[1:]
    watch(int(pid), *(Path(p) for p in paths))
