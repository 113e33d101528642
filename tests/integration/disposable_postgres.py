"""A PostgreSQL server of the test's own, which the test may kill and start again.

Built on ``pgserver`` (the ``embedded`` extra, a real PostgreSQL in a wheel), which also copes
with running as root (initdb refuses root: it runs the server as an unprivileged user). The
server listens on a unix socket in a directory of its own, so it never fights for a port.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from worker.ops.embedded import socket_database_url


class DisposablePostgres:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="memworker-outage-"))
        self.root.chmod(0o755)
        self.pgdata = self.root / "data"
        self._server: Any = None
        self._socket_dir = ""

    def start(self) -> str:
        """Create and start the server; return an asyncpg URL of its ``postgres`` database."""
        import pgserver

        get_server = getattr(pgserver, "get_server")  # noqa: B009 - not re-exported for mypy
        self._server = get_server(str(self.pgdata), cleanup_mode="delete")
        uri: str = self._server.get_uri()
        self._socket_dir = uri.rsplit("host=", 1)[1]
        return socket_database_url(self._socket_dir)

    def _pg_ctl(self, *args: str) -> None:
        from pgserver import _commands

        pg_ctl = getattr(_commands, "pg_ctl")  # noqa: B009 - generated at import time
        pg_ctl(list(args), pgdata=self.pgdata, user=self._server.system_user, timeout=60)

    def kill(self) -> None:
        """Stop at once, as a crash would: no checkpoint, clients cut off."""
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        self._pg_ctl(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {self._socket_dir}",
            "-l",
            str(self.pgdata / "log"),
            "start",
        )

    def cleanup(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
        shutil.rmtree(self.root, ignore_errors=True)
