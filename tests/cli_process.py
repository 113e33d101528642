"""``memworker`` as a subprocess whose stderr is read line by line while it runs, so a test can
wait for a state (a log line) before acting, with no timing of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

GENEROUS = 60.0
"""Seconds a state or an exit may take on a loaded machine before the test gives up."""


class Memworker:
    """A ``memworker`` subprocess whose stderr lines are collected as they come."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._seen:
                self.lines.append(line)
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, text: str, after: int = 0) -> int:
        """Block until a stderr line (from line ``after`` on) contains ``text``; its index."""
        with self._seen:
            while True:
                for i in range(after, len(self.lines)):
                    if text in self.lines[i]:
                        return i
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(f"exited before {text!r}:\n{''.join(self.lines)}")
                if not self._seen.wait(timeout=GENEROUS):
                    raise AssertionError(f"no {text!r} on stderr:\n{''.join(self.lines)}")

    def stop_with(self, signum: int) -> int:
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=GENEROUS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"still running {GENEROUS:.0f} s after {signal.Signals(signum).name}:\n"
                + "".join(self.lines[-20:])
            ) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=5)
