"""What the security tests share: free ports, a ``memworker`` environment with no server of
the machine's in it, and a server process waited for until it listens."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.cli_process import GENEROUS, Memworker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**given: str) -> dict[str, str]:
    """The environment without any memworker setting of the caller's, Redis and Postgres
    URLs naming ports nothing listens on (never the machine's servers), plus ``given`` (JSON
    logs, so every line is one line)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMWORKER_") and k not in ("REDIS_URL", "DATABASE_URL")
    }
    env.update(
        {
            "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "DATABASE_URL": f"postgresql://memworker@127.0.0.1:{free_port()}/memworker",
            "MEMWORKER_LOG_JSON": "true",
            **given,
        }
    )
    return env


@contextmanager
def listening(args: list[str], env: dict[str, str], said: str) -> Iterator[Memworker]:
    """``memworker *args`` until the block ends, once it said ``said`` on stderr."""
    process = Memworker(args, env)
    try:
        process.wait_for(said)
        yield process
    finally:
        process.close()


class Recorded:
    """``memworker *args`` with its stdout and stderr both kept in files, whole."""

    def __init__(self, args: list[str], env: dict[str, str], where: Path) -> None:
        where.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = where / "stdout", where / "stderr"
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker.cli", *args], env=env, stdout=out, stderr=err
            )

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") + self.err_path.read_text(errors="replace")

    def wait_for(self, text: str) -> None:
        """Until the output holds ``text`` (or the process ended: then it must hold it)."""
        deadline = time.monotonic() + GENEROUS
        while text not in self.output():
            if self.proc.poll() is not None:
                assert text in self.output(), f"exited without {text!r}:\n{self.output()}"
                return
            assert time.monotonic() < deadline, f"no {text!r}:\n{self.output()}"
            time.sleep(0.05)

    def finish(self) -> str:
        """Stop it (SIGTERM, if still running) and return everything it wrote."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=GENEROUS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.output()
