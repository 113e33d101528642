"""Real servers for the tests: the environment's, else our images in containers, else embedded.

Order: ``REDIS_URL`` / ``DATABASE_URL`` when set; else a testcontainers container of the image
``make images`` builds (``memworker-redis:local``, ``memworker-postgres:local``; another with
``MEMWORKER_TEST_REDIS_IMAGE`` / ``MEMWORKER_TEST_POSTGRES_IMAGE``) when a Docker engine answers
*and* has that image already; else the embedded servers shipped in wheels. Nothing is ever
pulled: an engine without the image, or a container that does not start, means the embedded
server, never an error. With ``CI=true`` a test that cannot get its server fails; elsewhere it
is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from worker.ops.embedded import EmbeddedPostgres, EmbeddedRedis

REDIS_IMAGE = "memworker-redis:local"
POSTGRES_IMAGE = "memworker-postgres:local"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def unavailable(what: str, why: str) -> None:
    message = f"no {what} for the tests: {why}"
    if in_ci():
        pytest.fail(message + " (CI=true: integration tests never skip)", pytrace=False)
    pytest.skip(message)


def docker_client() -> Any | None:
    """A client of the engine ``DOCKER_HOST`` (or the default socket) names; None without the
    docker package or a usable configuration. Whether the engine answers is not asked here."""
    try:
        import docker  # type: ignore[import-untyped]

        return docker.from_env(timeout=2)
    except Exception:
        return None


def image_ready(client: Any | None, image: str) -> bool:
    """True when ``client``'s engine answers and holds ``image`` locally (never pulled)."""
    if client is None:
        return False
    try:
        client.ping()
        client.images.get(image)
    except Exception:
        return False
    return True


def _ryuk_off_unless_present(client: Any) -> None:
    """testcontainers starts its reaper (Ryuk) from an image it would pull: without that image
    here, do without it (each container is stopped by its ``with`` block)."""
    from testcontainers.core.config import testcontainers_config

    if not image_ready(client, testcontainers_config.ryuk_image):
        testcontainers_config.ryuk_disabled = True


def _in_container(stack: contextlib.ExitStack, container: Any, url: Any) -> str | None:
    """``container`` started, its server's URL (``url(container)``), and the container's stop
    registered in ``stack``; None when it did not start or its port cannot be reached (then it
    is removed, and the embedded server is used: a warning says why)."""
    started = contextlib.ExitStack()
    try:
        started.enter_context(container)
        found: str = url(container)
    except Exception as exc:
        started.close()
        with contextlib.suppress(Exception):
            container.stop()  # created but never entered: remove it
        warnings.warn(
            f"{container.image} did not start ({exc}): using the embedded server", stacklevel=4
        )
        return None
    stack.enter_context(started)
    return found


@contextlib.contextmanager
def embedded(what: str, server: EmbeddedRedis | EmbeddedPostgres) -> Iterator[str]:
    """``server`` started (``unavailable`` when it cannot be), its URL, stopped afterwards."""
    try:
        url = server.start()
    except Exception as exc:
        unavailable(what, str(exc))
        raise
    try:
        yield url
    finally:
        server.stop()


@contextlib.contextmanager
def _server(
    what: str,
    variable: str,
    image: str,
    container: Callable[[str], Any],
    url: Callable[[Any], str],
    fallback: Callable[[], EmbeddedRedis | EmbeddedPostgres],
) -> Iterator[str]:
    if found := os.environ.get(variable):
        yield found
        return
    with contextlib.ExitStack() as stack:
        client = docker_client()
        if image_ready(client, image):
            _ryuk_off_unless_present(client)
            found = _in_container(stack, container(image), url)
            if found is not None:
                yield found
                return
        yield stack.enter_context(embedded(what, fallback()))


def redis_server() -> contextlib.AbstractContextManager[str]:
    from testcontainers.redis import RedisContainer

    return _server(
        "Redis",
        "REDIS_URL",
        os.environ.get("MEMWORKER_TEST_REDIS_IMAGE") or REDIS_IMAGE,
        RedisContainer,
        lambda c: f"redis://{c.get_container_host_ip()}:{c.get_exposed_port(6379)}/0",
        EmbeddedRedis,
    )


def postgres_server() -> contextlib.AbstractContextManager[str]:
    """A URL of a Postgres server's ``postgres`` database, for creating test databases."""
    from testcontainers.postgres import PostgresContainer

    return _server(
        "PostgreSQL",
        "DATABASE_URL",
        os.environ.get("MEMWORKER_TEST_POSTGRES_IMAGE") or POSTGRES_IMAGE,
        lambda image: PostgresContainer(
            image, username="postgres", password="test", dbname="postgres", driver="asyncpg"
        ),
        lambda c: c.get_connection_url(),
        lambda: EmbeddedPostgres(
            Path(tempfile.mkdtemp(prefix="memworker-pg-")) / "data", keep=False
        ),
    )
