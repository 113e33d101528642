"""A Redis-compatible server started with ``deploy/redis/users.acl``, for the least-privilege tests.

The file is used as shipped, plus one line: a ``test-admin`` user the tests use to set up data
and to read the ACL log. Every other user is exactly the deployment's, with its development
password ``dev-<user>-change-me`` (whose SHA-256 the file holds).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.redis_process import free_port, server_binary

REPO = Path(__file__).resolve().parents[2]
ACL_FILE = REPO / "deploy" / "redis" / "users.acl"
ADMIN = "test-admin"
ADMIN_LINE = f"user {ADMIN} on >{ADMIN} ~* &* +@all"


def dev_password(user: str) -> str:
    """The development password of ``user`` in users.acl (and in docker-compose.yml)."""
    return f"dev-{user}-change-me"


class AclRedis:
    """A server process with the deployment's ACL users; stopped with :meth:`stop`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, user: str, password: str | None = None) -> str:
        secret = password if password is not None else self.password(user)
        return f"redis://{user}:{secret}@127.0.0.1:{self.port}/0"

    @property
    def anonymous_url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def admin_url(self) -> str:
        return self.url(ADMIN, ADMIN)

    @staticmethod
    def password(user: str) -> str:
        return ADMIN if user == ADMIN else dev_password(user)

    def start(self) -> None:
        acl = self.data_dir / "users.acl"
        acl.write_text(ACL_FILE.read_text(encoding="utf-8").rstrip("\n") + "\n" + ADMIN_LINE + "\n")
        log = self.data_dir / "server.log"
        self.proc = subprocess.Popen(
            [
                server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.data_dir),
                "--aclfile",
                str(acl),
                "--save",
                "",
                "--appendonly",
                "no",
                "--logfile",
                str(log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        auth = f"AUTH {ADMIN} {ADMIN}\r\nPING\r\n".encode()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"the server refused users.acl: {text[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(auth)
                    time.sleep(0.02)
                    if b"+PONG" in s.recv(64):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis server with ACLs on port {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
