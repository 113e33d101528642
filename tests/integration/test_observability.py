"""What operators watch: trace context carried to results, consolidation metrics moving."""

from __future__ import annotations

from typing import Any

import orjson
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from tests.helpers import command, running_worker, stream_len_at_least
from tests.integration.results_factory import migrated_engine, publish, terminated
from worker.consolidation.consolidator import Consolidator
from worker.keys import StreamKeys
from worker.settings import Settings

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_a_commands_traceparent_is_copied_to_its_result(
    redis: Redis, settings: Settings
) -> None:
    streams = StreamKeys(settings.stream_prefix, 0)
    await redis.xadd(
        streams.lifecycle, {"data": orjson.dumps(command("spawn", "traced")), "traceparent": TRACE}
    )
    await redis.xadd(streams.lifecycle, {"data": orjson.dumps(command("pause", "untraced"))})
    async with running_worker(settings):
        await stream_len_at_least(redis, streams.results, 2)
    rows: Any = await redis.xrange(streams.results)
    assert rows[0][1][b"traceparent"] == TRACE.encode()
    assert b"traceparent" not in rows[1][1]


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_consolidation_counts_results_episodes_and_dead_letters(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    stored = sample("memworker_results_consolidated_total")
    episodes = sample("memworker_episodes_recorded_total")
    dead = sample(
        "memworker_dead_letters_total", {"group": "consolidation", "reason": "unparseable"}
    )
    batches = sample("memworker_consolidation_batch_seconds_count")
    await publish(redis, settings, [terminated("p", f"s{n}", n) for n in range(5)])
    await redis.xadd(StreamKeys(settings.stream_prefix, 0).results, {"data": b"not json"})
    async with migrated_engine(database_url) as engine:
        consolidator = Consolidator(settings, redis, engine)
        await consolidator.run_once()
    assert sample("memworker_results_consolidated_total") - stored == 5
    assert sample("memworker_episodes_recorded_total") - episodes == 5
    assert (
        sample("memworker_dead_letters_total", {"group": "consolidation", "reason": "unparseable"})
        - dead
        == 1
    )
    assert sample("memworker_consolidation_batch_seconds_count") > batches
