"""Real servers for the tests: the environment's, else testcontainers, else embedded.

Order: ``REDIS_URL`` / ``DATABASE_URL`` when set; else a container when a
Docker engine answers; else the embedded servers shipped in wheels. With ``CI=true`` a test
that cannot get its server fails; elsewhere it is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.ops.embedded import EmbeddedPostgres, EmbeddedRedis


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(what: str, why: str) -> None:
    message = f"no {what} for the tests: {why}"
    if in_ci():
        pytest.fail(message + " (CI=true: integration tests never skip)", pytrace=False)
    pytest.skip(message)


def docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    if docker_answers():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7-alpine") as container:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        return
    server = EmbeddedRedis()
    try:
        url = server.start()
    except Exception as exc:
        unavailable("Redis", str(exc))
        raise
    try:
        yield url
    finally:
        server.stop()


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """A URL of a Postgres server's ``postgres`` database, for creating test databases."""
    if url := os.environ.get("DATABASE_URL"):
        yield url
        return
    if docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver="asyncpg") as container:
            yield container.get_connection_url()
        return
    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="memworker-pg-")) / "data", keep=False)
    try:
        url = server.start()
    except Exception as exc:
        unavailable("PostgreSQL", str(exc))
        raise
    try:
        yield url
    finally:
        server.stop()
