"""One line a person can act on, for every failure the command line knows by kind.

``one_line(exc)`` is the CLI's single translation point (``worker.cli.app.main`` reports every
failure through it): a Postgres login refused, a missing database, a Redis that refuses a
command, a configuration that does not validate, a port already taken. Anything it does not know
is reported by type and its first line, never with a traceback or a second line.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterator

from pydantic import ValidationError
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError

from schemas.inputs import InvalidInputError
from worker.credentials import ShippedSecretError, mask
from worker.redis_conditions import RedisConditionError


class ActionableError(Exception):
    """A failure whose message already is the one line to show (what is wrong, what to do)."""


ENV_NAMES = {"redis_url": "REDIS_URL", "database_url": "DATABASE_URL"}
"""Settings fields read from a variable without the ``MEMWORKER_`` prefix."""


def env_name(field: str) -> str:
    """The environment variable a ``Settings`` field is read from."""
    name = field.lower().removeprefix("memworker_")
    return ENV_NAMES.get(name, f"MEMWORKER_{name.upper()}")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: SQLAlchemy's ``orig``, then causes and contexts."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [getattr(current, "orig", None), current.__cause__, current.__context__]


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _invalid_input(exc: BaseException) -> str | None:
    """An argument the input rule refused (``schemas.inputs``): its message names it."""
    return _first_line(str(exc)) if isinstance(exc, InvalidInputError) else None


def _configuration(exc: BaseException) -> str | None:
    if not isinstance(exc, ValidationError):
        return None
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        # A check of several settings at once has no field: its message names them.
        problems.append(f"{env_name(field)}: {message}" if field else message)
    return "invalid configuration: " + "; ".join(problems)


def _postgres(exc: BaseException) -> str | None:
    sqlstate = getattr(exc, "sqlstate", None)
    if not isinstance(sqlstate, str) or type(exc).__module__.split(".")[0] != "asyncpg":
        return None
    message = _first_line(str(exc))
    if sqlstate == "28P01":
        return f"Postgres refused the login: {message}; fix the password in DATABASE_URL"
    if sqlstate.startswith("28"):
        return f"Postgres refused the login: {message}; fix the user in DATABASE_URL or create it"
    if sqlstate == "3D000":
        return (
            f"Postgres: {message}; create it (createdb NAME) or name an existing database in "
            "DATABASE_URL"
        )
    if sqlstate == "42P01":  # undefined table: a database memworker never migrated
        return (
            f"Postgres: {message}: the database in DATABASE_URL has no memworker schema; run "
            "`memworker migrate`, or point DATABASE_URL at memworker's database (after "
            "`memworker dev`: source ~/.local/share/memworker/dev.env)"
        )
    return f"Postgres error {sqlstate}: {message}"


def _redis(exc: BaseException) -> str | None:
    if isinstance(exc, AuthenticationError) or (
        isinstance(exc, ResponseError) and str(exc).startswith(("WRONGPASS", "NOAUTH"))
    ):
        return (
            f"Redis refused the login: {_first_line(str(exc))}; fix the user/password in REDIS_URL"
        )
    if isinstance(exc, ResponseError):
        text = _first_line(str(exc))
        if "Invalid stream ID" in text:
            return (
                "not a stream entry id: ids look like 1712345678901-0 "
                "(`memworker dlq list` shows the ids)"
            )
        if text.startswith("NOPERM"):  # e.g. an ACL file from before the apply function
            return (
                f"Redis refused the command: {text}; give the user in REDIS_URL what "
                "deploy/redis/users.acl gives its role (the lifecycle worker needs +fcall "
                "+function|load since it applies commands with a Redis function)"
            )
        return f"Redis refused the command: {text}"
    if isinstance(exc, RedisConditionError) and exc.condition.kind != "unreachable":
        # Reached, but full, busy, loading, failing over: say that, not "cannot reach".
        return mask(_first_line(str(exc)))
    if isinstance(exc, RedisConnectionError):
        url = (
            os.environ.get("REDIS_URL")
            or os.environ.get("MEMWORKER_REDIS_URL")
            or "the default redis://127.0.0.1:6379/0"
        )
        return f"cannot reach Redis at {mask(url)}: {_first_line(str(exc))}"
    return None


def _raised_in_asyncpg(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("asyncpg"):
            return True
        tb = tb.tb_next
    return False


def _postgres_unreachable(exc: BaseException) -> str | None:
    """A connection asyncpg could not open (refused, unknown host, no socket, timed out)."""
    if not isinstance(exc, OSError) or not _raised_in_asyncpg(exc):
        return None
    from sqlalchemy import make_url

    from worker.settings import DEFAULT_DATABASE_URL, asyncpg_url

    url = asyncpg_url(
        os.environ.get("DATABASE_URL")
        or os.environ.get("MEMWORKER_DATABASE_URL")
        or DEFAULT_DATABASE_URL
    )
    url = make_url(url).render_as_string(hide_password=True)  # validated before connecting
    return (
        f"cannot reach Postgres at {url}: {_first_line(str(exc)) or type(exc).__name__}; "
        "start it or fix DATABASE_URL"
    )


def _port_in_use(exc: BaseException) -> str | None:
    if not isinstance(exc, OSError) or exc.errno != errno.EADDRINUSE:
        return None
    found = re.search(r"\('[^']*', (\d+)\)", str(exc))
    port = f"port {found.group(1)}" if found else "the metrics port"
    return (
        f"{port} is already in use (another memworker?): choose a free one with "
        "--metrics-port (or MEMWORKER_METRICS_PORT)"
    )


KNOWN: list[Callable[[BaseException], str | None]] = [
    _invalid_input,
    _configuration,
    _postgres,
    _redis,
    _port_in_use,
    _postgres_unreachable,
]
"""Translators, tried on the exception and everything it wraps, first answer wins."""


def one_line(exc: BaseException) -> str:
    """What went wrong and what to do, on one line, every password in it ``***``."""
    return mask(_one_line(exc))


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, ActionableError | ShippedSecretError):
        return _first_line(str(exc))
    for current in _chain(exc):
        for translate in KNOWN:
            message = translate(current)
            if message is not None:
                return message
    text = _first_line(str(exc))
    return (
        f"unexpected {type(exc).__name__}: {text}" if text else f"unexpected {type(exc).__name__}"
    )
