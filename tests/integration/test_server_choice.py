"""Which servers the tests get (tests/servers.py): our images in containers only when an engine
answers and holds them; otherwise the embedded servers, never an error and never a pull."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests import servers


class Images:
    def __init__(self, present: set[str]) -> None:
        self.present = present
        self.pulled: list[str] = []

    def get(self, name: str) -> str:
        if name not in self.present:
            raise LookupError(f"No such image: {name}")  # docker.errors.ImageNotFound's role
        return name

    def pull(self, name: str) -> None:  # pragma: no cover - must never be called
        self.pulled.append(name)


class Engine:
    """A stand-in for a docker client: what an engine answers, without an engine."""

    def __init__(self, *, answers: bool, images: set[str]) -> None:
        self.answers = answers
        self.images = Images(images)

    def ping(self) -> bool:
        if not self.answers:
            raise ConnectionError("Cannot connect to the Docker daemon")
        return True


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        (None, False),  # no docker package, or no usable configuration
        (Engine(answers=False, images={servers.REDIS_IMAGE}), False),  # no engine answers
        (Engine(answers=True, images=set()), False),  # an engine without our image
        (Engine(answers=True, images={"redis:7-alpine"}), False),  # only someone else's
        (Engine(answers=True, images={servers.REDIS_IMAGE}), True),
    ],
    ids=["no-client", "no-engine", "image-missing", "other-image", "image-present"],
)
def test_a_container_is_used_only_when_the_engine_answers_and_holds_the_image(
    engine: Any, expected: bool
) -> None:
    assert servers.image_ready(engine, servers.REDIS_IMAGE) is expected
    if engine is not None:
        assert engine.images.pulled == []


def test_without_an_engine_the_fixtures_get_an_embedded_server_that_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert not servers.image_ready(servers.docker_client(), servers.REDIS_IMAGE)
    with servers.redis_server() as url:
        client = redis.Redis.from_url(url)
        try:
            assert client.ping()
        finally:
            client.close()


def test_the_environment_s_servers_come_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/postgres")
    with servers.redis_server() as redis_url, servers.postgres_server() as postgres_url:
        assert (redis_url, postgres_url) == (
            "redis://127.0.0.1:1/0",
            "postgresql://nobody@127.0.0.1:1/postgres",
        )
