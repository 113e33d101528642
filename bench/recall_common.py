"""What the recall benches share: a PostgreSQL with pgvector (``--pgvector-url``, else the
embedded pgserver started for the run); importing it puts the project root on ``sys.path``"""

from __future__ import annotations

import contextlib
import shutil
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
    scratch = Path(tempfile.mkdtemp(prefix="memworker-bench-pgv-"))
    server = EmbeddedPostgres(scratch / "data")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)  # its data dir: nothing to keep
