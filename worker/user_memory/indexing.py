"""A remembered turn's vector: who embeds it, waiting until it is recallable by meaning, and
saying when a recall ran without some vectors; a recall's query's vector (``embed_query``).

``MEMWORKER_REMEMBER_EMBEDDING`` decides who embeds a turn ``Memory.remember`` stores:

- ``inline``: ``remember`` itself, before it returns, so the turn is recallable by meaning at
  once (read-your-writes), as with LoomFlow's ``InMemoryMemory``. It writes what the indexer
  would (``worker.episodes.vectorising.embed_and_store``: the same text, model and row, its
  ``episode.recallable`` owed in the same transaction), so an indexer started later skips it.
  Concurrent ``remember`` calls of one ``Memory`` are embedded together (a batch of up to
  ``BATCH`` while the one before it is embedded), in a thread: the event loop keeps running.
- ``indexer``: the ``memworker index`` process (``remember`` only announces the turn);
  ``Memory.wait_recallable(ids, timeout=…)`` returns once their vectors are in.
- ``auto`` (the default): ``indexer`` while one runs, else ``inline``. An indexer runs when
  group ``indexer`` on ``P:episodes`` has a consumer seen in the last ``INDEXER_SEEN_MS``
  (``XINFO CONSUMERS``: a running indexer's blocking read renews it every second), looked up
  at most every ``PROBE_TTL_S`` per ``Memory``; a Redis that does not answer counts as none.

Without pgvector nothing is embedded (recall is by words). A failed embedding never fails
``remember``: it is logged and counted (``memworker_embedded_at_remember_total``), and the
turn stays announced for an indexer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.outages import first_line
from worker.db.vectors import VECTOR_TABLE, has_vector_table
from worker.episodes.embedding import Embedder, EmbeddingError
from worker.episodes.indexer import INDEXER_GROUP
from worker.episodes.vectorising import embed_and_store
from worker.keys import episodes_stream
from worker.logs import get_logger
from worker.metrics import EMBEDDED_AT_REMEMBER, RECALL_WITHOUT_VECTORS
from worker.settings import Settings

log = get_logger("worker.user_memory")

INDEXER_SEEN_MS = 10_000
PROBE_TTL_S = 2.0
BATCH = 64
WARN_EVERY_S = 60.0


class NotRecallableError(TimeoutError):
    """``wait_recallable`` timed out: ``missing`` are the ids still without a vector."""

    def __init__(self, missing: Sequence[str], message: str) -> None:
        super().__init__(message)
        self.missing = list(missing)


class UnknownEpisodeError(ValueError):
    """``wait_recallable`` of ids this project never remembered."""


async def indexer_running(
    redis: Redis | RedisCluster, prefix: str, seen_ms: int = INDEXER_SEEN_MS
) -> bool:
    """Whether group ``indexer`` on ``P:episodes`` has a consumer seen in the last ``seen_ms``
    (module doc)."""
    try:
        consumers: Any = await redis.xinfo_consumers(episodes_stream(prefix), INDEXER_GROUP)
    except ResponseError as exc:
        if "NOGROUP" in str(exc) or "no such key" in str(exc):
            return False
        raise
    return any(int(c.get("idle", seen_ms + 1)) <= seen_ms for c in consumers)


class TurnVectors:
    """One ``Memory``'s side of its turns' vectors (module doc). ``embedder``: the model the
    memory recalls by (its vectors are the ones written and waited for)."""

    def __init__(
        self,
        engine: AsyncEngine,
        redis: Redis | RedisCluster,
        settings: Settings,
        embedder: Callable[[], Embedder],
    ) -> None:
        self.engine = engine
        self.redis = redis
        self.settings = settings
        self.embedder = embedder
        self._table: bool | None = None
        self._probed: tuple[float, bool] | None = None
        self._pending: list[tuple[str, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._warned = 0.0

    async def inline(self) -> bool:
        """Whether this memory embeds what it remembers now (module doc)."""
        mode = self.settings.remember_embedding
        if mode == "indexer":
            return False
        if self._table is None:
            async with self.engine.connect() as conn:
                self._table = await has_vector_table(conn)
        if not self._table:
            return False
        return mode == "inline" or not await self._indexer_running()

    async def _indexer_running(self) -> bool:
        now = time.monotonic()
        if self._probed is not None and self._probed[0] > now:
            return self._probed[1]
        try:
            running = await indexer_running(self.redis, self.settings.stream_prefix)
        except Exception as exc:  # Redis down: embed here rather than leave turns unrecallable
            log.warning("no indexer seen (Redis did not answer)", error=first_line(exc))
            running = False
        self._probed = (now + PROBE_TTL_S, running)
        return running

    async def remembered(self, row_id: str) -> None:
        """A turn was stored: embed it now when this memory embeds (``inline``); a failure is
        logged, and the turn waits for an indexer."""
        if not await self.inline():
            return
        try:
            await self._embed(row_id)
        except Exception as exc:
            EMBEDDED_AT_REMEMBER.labels("failed").inc()
            log.warning(
                "turn not embedded at remember: found by words until an indexer embeds it",
                episode=row_id,
                error=first_line(exc),
            )

    async def _embed(self, row_id: str) -> None:
        loop = asyncio.get_running_loop()
        if self._task is not None and self._task.get_loop() is not loop:
            self._task, self._pending = None, []  # a former event loop's (asyncio.run per call)
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((row_id, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        await future

    async def _drain(self) -> None:
        """Embed the waiting turns, ``BATCH`` at a time, until none waits."""
        while self._pending:
            batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
            live = [(row_id, f) for row_id, f in batch if not f.done()]
            if not live:
                continue
            try:
                done = await embed_and_store(self.engine, self.embedder(), [r for r, _ in live])
            except Exception as exc:
                for _row_id, future in live:
                    if not future.done():
                        future.set_exception(exc)
                continue
            EMBEDDED_AT_REMEMBER.labels("done").inc(done)
            for _row_id, future in live:
                if not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        """Stop embedding; a ``remember`` still waiting gets ``CancelledError``."""
        with contextlib.suppress(RuntimeError):  # a former event loop's, closed
            if self._task is not None and not self._task.done():
                self._task.cancel()
            for _row_id, future in self._pending:
                future.cancel()
        self._pending.clear()

    async def wait_recallable(self, project_id: str, ids: Sequence[str], timeout: float) -> None:
        """Return once each of ``ids`` (turn ids, or session episodes' ids) has a vector of
        the memory's model; ``NotRecallableError`` naming the others after ``timeout``
        seconds. While no indexer runs (``auto``/``inline``), embeds the missing ones itself."""
        rows = await self._rows(project_id, list(dict.fromkeys(ids)))
        model = self.embedder().name
        deadline = time.monotonic() + max(0.0, timeout)
        pause = 0.02
        while True:
            missing = await self._missing(rows, model)
            if not missing:
                return
            if not self._table:
                raise NotRecallableError(
                    [rows[m] for m in missing],
                    "not recallable by meaning: this PostgreSQL has no pgvector (recall is by"
                    f" words): {_names([rows[m] for m in missing])}",
                )
            if await self.inline():
                await embed_and_store(self.engine, self.embedder(), missing)
                if not await self._missing(rows, model):
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                names = [rows[m] for m in missing]
                raise NotRecallableError(
                    names,
                    f"not recallable by meaning after {timeout:g}s (no {model} vector yet; is"
                    f" `memworker index` running?): {_names(names)}",
                )
            await asyncio.sleep(min(pause, left))
            pause = min(0.25, pause * 2)

    async def _rows(self, project_id: str, ids: list[str]) -> dict[str, str]:
        """Row id -> the caller's id, for each of ``ids`` (a turn id: that id's turn of each
        user of the project holding one; an episode's row id: it); UnknownEpisodeError for
        the rest."""
        uuids: dict[str, str] = {}
        for i in ids:
            with contextlib.suppress(ValueError):
                uuids[str(uuid.UUID(i))] = i
        async with self.engine.connect() as conn:
            if self._table is None:
                self._table = await has_vector_table(conn)
            found = await conn.execute(
                text(
                    "SELECT id::text, turn_id FROM episodes WHERE project_id = :p"
                    " AND (turn_id = ANY(CAST(:ts AS text[])) OR id = ANY(CAST(:ids AS uuid[])))"
                ),
                {"p": project_id, "ts": ids, "ids": list(uuids)},
            )
            rows = {row.id: uuids.get(row.id) or row.turn_id for row in found}
        unknown = sorted(set(ids) - set(rows.values()))
        if unknown:
            raise UnknownEpisodeError(
                f"ids: not remembered in project {project_id!r}: {_names(unknown)}"
            )
        return rows

    async def _missing(self, rows: dict[str, str], model: str) -> list[str]:
        if not self._table:
            return list(rows)
        async with self.engine.connect() as conn:
            found = await conn.execute(
                text(
                    f"SELECT episode_id::text FROM {VECTOR_TABLE}"
                    " WHERE episode_id = ANY(CAST(:ids AS uuid[])) AND model = :m"
                ),
                {"ids": list(rows), "m": model},
            )
            have = {row[0] for row in found}
        return [r for r in rows if r not in have]

    def report_unindexed(self, project_id: str, user_id: str | None, count: int) -> None:
        """A recall looked at ``count`` episodes without a vector: counted, and said in a
        warning at most every ``WARN_EVERY_S`` per memory."""
        if count <= 0:
            return
        RECALL_WITHOUT_VECTORS.inc(count)
        now = time.monotonic()
        if now - self._warned >= WARN_EVERY_S:
            self._warned = now
            log.warning(
                "recall ran without vectors for some episodes: they were ranked by words only"
                " (no indexer running? see Memory.wait_recallable)",
                project=project_id,
                user=user_id,
                unindexed=count,
            )


def _names(ids: Sequence[str], most: int = 20) -> str:
    shown = ", ".join(repr(i) for i in ids[:most])
    return shown + (f" and {len(ids) - most} more" if len(ids) > most else "")


async def embed_query(embedder: Embedder | None, query: str) -> list[float] | None:
    if embedder is None or not query.strip():
        return None
    [vector] = await embedder.embed([query])
    return list(vector)


async def embed_query_or_none(embedder: Embedder, query: str) -> list[float] | None:
    """The query's vector; None (logged) when the embedder fails: the recall is by words."""
    try:
        return await embed_query(embedder, query)
    except EmbeddingError as exc:
        get_logger("worker.user_memory").warning(
            "recall by words only: the embedder failed", error=str(exc)
        )
        return None
