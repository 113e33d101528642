"""A pytest plugin that runs LoomFlow's own tests with memworker's ``Memory`` in place of
LoomFlow's ``InMemoryMemory`` and ``InMemoryFactStore`` (``-p memworker_loomflow_shim``, with
``tests/loomflow`` on ``PYTHONPATH``).

Each ``InMemoryMemory(...)`` a LoomFlow test builds becomes a ``Memory`` of a project of its
own on the Redis and Postgres that ``MEMWORKER_REDIS_URL`` and ``MEMWORKER_DATABASE_URL`` name
(so tests never see each other's data); each ``InMemoryFactStore()`` a ``FactStore`` of a project
of its own. Each has its own connection pool (a LoomFlow test runs its own event loop), closed
after its test (``pytest_runtest_teardown``).
LoomFlow's test code is read from its sdist, never copied here.
"""

from __future__ import annotations

import uuid
from functools import lru_cache
from typing import Any

import loomflow
import loomflow.core.types
import loomflow.memory
import loomflow.memory.facts
import loomflow.memory.inmemory
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.engine import create_database_engine
from worker.settings import Settings
from worker.user_memory.facts import FactStore
from worker.user_memory.memory import Memory


@lru_cache(maxsize=1)
def _settings() -> Settings:
    """LoomFlow's ``InMemoryMemory`` ranks by words alone (BM25, no embedder), and its tests
    say so (a query without a word in common falls back to recency with score 0): turns are
    left to an indexer (none runs here), so recall is by words as there."""
    return Settings(remember_embedding="indexer")


_ENGINES: list[AsyncEngine] = []


def _engine() -> AsyncEngine:
    engine = create_database_engine(_settings().database_url)
    _ENGINES.append(engine)
    return engine


def pytest_runtest_teardown(item: Any) -> None:
    """Close the test's pools: their connections belong to its event loop, gone by now, so
    they are terminated rather than returned."""
    while _ENGINES:
        _ENGINES.pop().sync_engine.pool.dispose()


def _project() -> str:
    return f"loomflow-{uuid.uuid4().hex[:16]}"


class MemworkerFactStore(FactStore):
    """``InMemoryFactStore(embedder=...)`` as a ``FactStore`` of a fresh project."""

    def __init__(self, *, embedder: Any = None) -> None:
        super().__init__(_engine(), _project(), embedder=embedder)


class MemworkerMemory(Memory):
    """``InMemoryMemory(...)`` as a ``Memory`` of a fresh project (LoomFlow's arguments)."""

    def __init__(
        self,
        *,
        consolidator: Any = None,
        fact_store: Any = None,
        max_users: int | None = None,
        user_idle_ttl_seconds: float | None = None,
    ) -> None:
        settings = _settings()
        super().__init__(
            _project(),
            settings=settings,
            consolidator=consolidator,
            fact_store=fact_store,
            engine=_engine(),
            redis=Redis.from_url(settings.redis_url, single_connection_client=False),
        )


for module in (loomflow, loomflow.memory, loomflow.memory.inmemory):
    if hasattr(module, "InMemoryMemory"):
        module.InMemoryMemory = MemworkerMemory  # type: ignore[attr-defined]
for module in (loomflow, loomflow.memory, loomflow.memory.facts):
    if hasattr(module, "InMemoryFactStore"):
        module.InMemoryFactStore = MemworkerFactStore  # type: ignore[attr-defined]

DIFFERENT_BY_DESIGN = {
    "test_memory_gdpr.py::test_inmemory_profile_returns_counts_and_recent_sessions": (
        "isinstance(profile, loomflow's MemoryProfile): Memory returns worker.MemoryProfile"
    ),
    "test_memory_gdpr.py::test_inmemory_export_round_trips_episodes_and_facts": (
        "isinstance(export, loomflow's MemoryExport): Memory returns worker.MemoryExport"
    ),
    "test_recall_scored.py::test_inmemory_recall_scored_returns_episode_match": (
        "isinstance(match, loomflow's EpisodeMatch): Memory returns worker.EpisodeMatch"
    ),
    "test_tool_transcript_persistence.py::test_inmemory_episode_carries_transcript_field": (
        "message.role is loomflow's Role.USER: Memory returns worker.Role.USER (== 'user')"
    ),
    "test_tool_transcript_persistence.py::test_agent_with_persist_off_writes_no_transcript": (
        "reads InMemoryMemory's private dict memory._episodes"
    ),
    "test_tool_transcript_persistence.py::test_agent_with_persist_on_writes_transcript": (
        "reads InMemoryMemory's private dict memory._episodes"
    ),
    "test_smoke.py::test_agent_persists_episode_to_memory": (
        "reads InMemoryMemory.snapshot(), its in-process test helper"
    ),
    "test_smoke.py::test_recall_surfaces_prior_episode_in_context": (
        "reads InMemoryMemory.snapshot(), its in-process test helper"
    ),
    "test_polish.py::test_agent_repr_includes_model_memory_runtime_max_turns": (
        "expects the class name InMemoryMemory in the agent's repr"
    ),
    "test_bounded_per_user_state.py::test_inmemory_evicts_lru_user_blocks_past_max_users": (
        "InMemoryMemory drops a user's blocks past max_users (an in-process LRU); a durable"
        " store keeps them until forget"
    ),
    "test_bounded_per_user_state.py::test_inmemory_ttl_evicts_idle_user_blocks": (
        "InMemoryMemory drops an idle user's blocks after a TTL; a durable store keeps them"
        " until forget"
    ),
}
"""LoomFlow tests that check LoomFlow's own classes (identity, private attributes) rather than
behaviour: ``Memory`` returns memworker's models of the same names and fields (a LoomFlow
program that moved to memworker imports them from ``worker``). They run, expected to fail
(``xfail(strict=True)``): if one ever passes, the run says so."""


TIMING = {
    "test_consolidation_worker.py::test_async_context_manager_runs_in_background": (
        "gives a background consolidation cycle 50 ms of wall time; on Postgres a cycle is a"
        " few round trips (~10-30 ms here), so on a loaded machine it can miss the window"
    ),
    "test_rate_limit.py::test_agent_throttle_mode_paces_consecutive_runs": (
        "times the rate limiter's wait before a second run (>= 15 ms of a 20 ms refill); the"
        " first run's episode is stored in Postgres meanwhile (~10 ms), so less is left to wait"
    ),
}
"""LoomFlow tests that assert a wall-clock window: run, allowed to miss it (non-strict xfail)."""


def pytest_collection_modifyitems(items: list[Any]) -> None:
    import pytest

    for item in items:
        test = item.nodeid.removeprefix("tests/")
        if test in DIFFERENT_BY_DESIGN:
            item.add_marker(pytest.mark.xfail(reason=DIFFERENT_BY_DESIGN[test], strict=True))
        elif test in TIMING:
            item.add_marker(pytest.mark.xfail(reason=TIMING[test], strict=False))
