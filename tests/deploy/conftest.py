"""Fixtures of the deployment tests: a Redis server running the deployment's ACL file."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests import servers
from tests.deploy.acl_redis import AclRedis


@pytest.fixture
def acl_server(tmp_path: Path) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path)
    try:
        server.start()
    except (RuntimeError, OSError) as exc:
        servers.unavailable("Redis with ACLs", str(exc))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def admin(acl_server: AclRedis) -> AsyncIterator[Redis]:
    """A client as ``test-admin``: sets up data and reads the ACL log."""
    client = Redis.from_url(acl_server.admin_url)
    try:
        yield client
    finally:
        await client.aclose()
