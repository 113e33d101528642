"""A PostgreSQL with pgvector for the recall tests, whatever ``DATABASE_URL`` points at.

``MEMWORKER_TEST_PGVECTOR_URL`` names one (a server whose ``postgres`` database may create
databases); else the embedded pgserver (PostgreSQL 16 with pgvector 0.6.2) is started once per
session. The shared test server may lack pgvector (PostgreSQL 15 on the dev machines does),
so these tests never rely on it. With ``CI=true`` a missing pgvector fails, never skips.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests import servers
from worker.ops.embedded import EmbeddedPostgres


@contextlib.contextmanager
def pgvector_server() -> Iterator[str]:
    if url := os.environ.get("MEMWORKER_TEST_PGVECTOR_URL"):
        yield url
        return
    data = Path(tempfile.mkdtemp(prefix="memworker-pgvector-")) / "data"
    with servers.embedded("PostgreSQL with pgvector", EmbeddedPostgres(data, keep=False)) as url:
        yield url
