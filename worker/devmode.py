"""``memworker dev``: everything in one process on one machine.

Embedded servers (a Valkey and a PostgreSQL shipped in wheels) start unless ``REDIS_URL`` /
``DATABASE_URL`` are set; their data lives under ``--data-dir`` and is kept between runs.
Then the schema is migrated and the lifecycle worker, the consolidator and the indexer (recall
by meaning: ``worker.indexer``) run side by side.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from worker.consolidator import Consolidator
from worker.embedded import EmbeddedPostgres, EmbeddedRedis, default_data_dir
from worker.indexer import Indexer
from worker.lifecycle import LifecycleWorker
from worker.logs import configure_logging
from worker.metrics import serve_http
from worker.migrate import migrate
from worker.settings import Settings


def _say(line: str = "") -> None:
    print(line, file=sys.stderr, flush=True)


async def run_dev(data_dir: Path | None, metrics_port: int) -> None:
    base = Settings()
    configure_logging(base.log_level, base.log_json)
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    redis_server: EmbeddedRedis | None = None
    pg_server: EmbeddedPostgres | None = None
    redis_url, database_url = base.redis_url, base.database_url
    try:
        if not os.environ.get("REDIS_URL"):
            redis_server = EmbeddedRedis(data_dir / "valkey")
            redis_url = redis_server.start()
        if not os.environ.get("DATABASE_URL"):
            pg_server = EmbeddedPostgres(data_dir / "postgres")
            database_url = pg_server.start()
        settings = base.model_copy(update={"redis_url": redis_url, "database_url": database_url})
        revision = await migrate(settings.database_url)
        worker = LifecycleWorker(settings)
        consolidator = Consolidator.from_settings(settings)
        indexer = Indexer.from_settings(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = await serve_http(
            metrics_port,
            lambda: worker.ready and consolidator.is_ready() and indexer.is_ready(),
            host="127.0.0.1",
        )
        env_file = data_dir / "dev.env"
        env_file.parent.mkdir(parents=True, exist_ok=True)
        env_file.write_text(
            f"export REDIS_URL='{settings.redis_url}'\n"
            f"export DATABASE_URL='{settings.database_url}'\n"
            f"export MEMWORKER_STREAM_PREFIX='{settings.stream_prefix}'\n"
        )
        tasks = [
            asyncio.create_task(worker.run(stop)),
            asyncio.create_task(consolidator.run(stop)),
            asyncio.create_task(indexer.run(stop)),
        ]
        _say("memworker dev is running.")
        _say(f"  redis     {settings.redis_url}" + ("  (embedded)" if redis_server else ""))
        _say(f"  postgres  {settings.database_url}" + ("  (embedded)" if pg_server else ""))
        _say(f"  schema    revision {revision}")
        _say(f"  data      {data_dir}")
        _say(f"  metrics   http://127.0.0.1:{metrics_port}/metrics  (/healthz, /readyz)")
        _say(
            f"  streams   {settings.stream_prefix}:lifecycle:{{0}} → worker → "
            f"{settings.stream_prefix}:results:{{0}} → consolidator → Postgres"
        )
        _say()
        _say("From another terminal:")
        _say(f"  source {env_file}")
        _say('  memworker publish spawn -p demo -s s1 --state \'{"goal": "hello"}\' --wait')
        _say(
            "  memworker publish terminate -p demo -s s1 --set lessons_learned='[\"it works\"]'"
            " --wait"
        )
        _say("  memworker tail episodes --from-start")
        _say('  memworker recall -p demo "what worked"')
        _say()
        _say("Ctrl-C stops everything (data is kept).")
        await stop.wait()
        await asyncio.gather(*tasks, return_exceptions=True)
        server.close()
        await consolidator.close()
        await indexer.close()
    finally:
        if pg_server is not None:
            pg_server.stop()
        if redis_server is not None:
            redis_server.stop()
