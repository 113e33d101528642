"""The long-running services: ``run``, ``consolidate``, ``index`` and ``dev``, each serving
/metrics, /healthz and /readyz when asked and stopping on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer

from worker.cli.common import run_async, settings_from_env
from worker.cli.supervisor import run_processes
from worker.credentials import refuse_shipped_secrets
from worker.logs import configure_logging
from worker.settings import Settings


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def serve_metrics(settings: Settings, port: int | None, is_ready: Callable[[], bool]) -> Any:
    chosen = port if port is not None else settings.metrics_port
    if chosen is None:
        return None
    from worker.metrics import serve_http

    return await serve_http(chosen, is_ready)


MetricsPort = Annotated[
    int | None, typer.Option(help="Serve /metrics, /healthz, /readyz on this port.")
]


class GroupProcess(Protocol):
    """A consumer-group process (``Consolidator``, ``Indexer``) as the CLI runs it."""

    def is_ready(self) -> bool: ...

    async def run(self, stop: asyncio.Event) -> None: ...

    async def close(self) -> None: ...


async def serve_consumer(
    settings: Settings, metrics_port: int | None, process: GroupProcess
) -> None:
    """Run ``process`` until SIGTERM/SIGINT, with /metrics, /healthz, /readyz when asked."""
    stop = asyncio.Event()
    install_stop_signals(stop)
    server = await serve_metrics(settings, metrics_port, process.is_ready)
    try:
        await process.run(stop)
    finally:
        if server is not None:
            server.close()
        await process.close()


def run(
    workers: Annotated[int, typer.Option(min=1, max=64, help="Worker processes to run.")] = 1,
    consumer: Annotated[
        str | None, typer.Option(help="Consumer name (default: host-pid-random).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Serve /metrics, /healthz, /readyz on this port (default: "
            "MEMWORKER_METRICS_PORT); with --workers N, worker n serves port + n."
        ),
    ] = None,
) -> None:
    """Run the lifecycle worker (consumer group `lifecycle` on every shard).

    With --workers N: N processes; one that dies is restarted, and one that dies 5 times within
    a minute stops them all (exit status 1).
    """
    settings = settings_from_env()
    refuse_shipped_secrets(settings)
    configure_logging(settings.log_level, settings.log_json)
    if workers > 1:
        port = metrics_port if metrics_port is not None else settings.metrics_port
        raise typer.Exit(run_processes(workers, consumer, port))

    async def serve() -> None:
        from worker.lifecycle.worker import LifecycleWorker

        worker = LifecycleWorker(settings, consumer=consumer)
        stop = asyncio.Event()
        install_stop_signals(stop)
        server = await serve_metrics(settings, metrics_port, lambda: worker.ready)
        try:
            await worker.run(stop)
        finally:
            if server is not None:
                server.close()

    run_async(serve())


def consolidate(
    metrics_port: MetricsPort = None,
) -> None:
    """Run the consolidator (group `consolidation`): results into Postgres, episodes out."""
    settings = settings_from_env()
    refuse_shipped_secrets(settings)
    configure_logging(settings.log_level, settings.log_json)

    from worker.consolidation.consolidator import Consolidator

    run_async(serve_consumer(settings, metrics_port, Consolidator.from_settings(settings)))


def dev(
    data_dir: Annotated[
        Path | None, typer.Option(help="Where the embedded servers keep data (kept between runs).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            help="Port of /metrics, /healthz, /readyz (default: MEMWORKER_METRICS_PORT, else 9464)."
        ),
    ] = None,
) -> None:
    """All-in-one: worker, consolidator, indexer.

    Embedded servers, migrations, the lifecycle worker, the consolidator and the indexer (recall
    by meaning) in one process.

    The embedded servers start unless REDIS_URL / DATABASE_URL are set; SIGTERM, SIGINT and
    SIGHUP stop them, and servers a killed dev left running on the data dir are stopped first.
    """
    from worker.cli.dev import run_dev

    run_async(run_dev(data_dir, metrics_port))


def index(
    metrics_port: MetricsPort = None,
) -> None:
    """Run the indexer (group `indexer` on P:episodes): embed every new episode."""
    settings = settings_from_env()
    refuse_shipped_secrets(settings)
    configure_logging(settings.log_level, settings.log_json)
    if settings.index_nice:
        os.nice(settings.index_nice)  # embedding yields the CPU to the hot path

    from worker.episodes.indexer import Indexer

    run_async(serve_consumer(settings, metrics_port, Indexer.from_settings(settings)))
