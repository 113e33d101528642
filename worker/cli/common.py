"""What every command group shares: the consoles, ``CliError``, settings, id checks, and the
Redis and Postgres connections a command opens and closes."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rich.console import Console

from worker.connections import client_for
from worker.errors import ActionableError, one_line
from worker.ids import InvalidIdError, validate_id
from worker.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns: give them room.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True)


class CliError(ActionableError):
    """A failure to report as one line on stderr with exit status 1."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


def settings_from_env() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        raise CliError(one_line(exc)) from exc


ShardOption = Annotated[
    int | None,
    typer.Option(help="One shard, 0 to MEMWORKER_SHARDS - 1 (default: every shard)."),
]
"""``--shard`` of every command that takes one (``dlq …``, ``replay``): one form, one check."""


def chosen_shards(settings: Settings, shard: int | None) -> list[int]:
    """The shards ``--shard`` names: all when None; a usage error (exit status 2) outside
    0..MEMWORKER_SHARDS - 1."""
    if shard is None:
        return list(range(settings.shards))
    if not 0 <= shard < settings.shards:
        raise typer.BadParameter(
            f"must be 0..{settings.shards - 1} (MEMWORKER_SHARDS is {settings.shards})",
            param_hint="--shard",
        )
    return [shard]


def check_ids(**ids: str) -> None:
    """Usage error (exit status 2) for any id a key may not carry, e.g. ``project_id="a b"``."""
    for name, value in ids.items():
        try:
            validate_id(value, name)
        except InvalidIdError as exc:
            raise typer.BadParameter(str(exc)) from exc


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def with_redis(settings: Settings, use: Callable[[Redis], Awaitable[T]]) -> T:
    redis: Any = client_for(settings)
    try:
        await redis.ping()
    except (RedisConnectionError, OSError) as exc:
        await redis.aclose()
        raise CliError(f"cannot reach Redis at {settings.redis_url}: {exc}") from exc
    try:
        return await use(redis)
    finally:
        await redis.aclose()


@contextlib.asynccontextmanager
async def database_engine(settings: Settings, *, pool: bool = False) -> AsyncIterator[AsyncEngine]:
    """The Postgres engine of ``settings``, disposed on the way out (unpooled by default:
    a command is one short conversation)."""
    from worker.db.engine import create_database_engine

    engine = create_database_engine(settings.database_url, pool=pool)
    try:
        yield engine
    finally:
        await engine.dispose()
