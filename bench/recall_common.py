"""What the recall benches share: a PostgreSQL with pgvector (``--pgvector-url``, else the
embedded pgserver started for the run); importing it puts the project root on ``sys.path``"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from worker.ops.embedded import EmbeddedPostgres


@contextlib.contextmanager
def pgvector_server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="memworker-bench-pgv-")) / "data")
    try:
        yield server.start()
    finally:
        server.stop()
