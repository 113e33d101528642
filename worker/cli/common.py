"""What every command group shares: the consoles, ``CliError``, settings, id checks, stored text
as a terminal may show it (``shown``, ``cell``, ``json_shown``), and the Redis and Postgres
connections a command opens and closes."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar, cast

import typer
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from worker.connections import client_for
from worker.credentials import mask
from worker.errors import ActionableError, one_line
from worker.ids import InvalidIdError, validate_id, validate_write_id
from worker.settings import Settings

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")


class _LazyConsole:
    """A rich ``Console`` made on first use: importing rich costs a command's start ~0.1 s, and
    most commands (``publish``, ``mcp``) print without it."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def _made(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._made(), name)

    def __enter__(self) -> Console:  # rich's Live (progress bars) enters its console
        return self._made().__enter__()

    def __exit__(self, *exc: object) -> None:
        self._made().__exit__(*exc)


# Off a terminal (pipes, CI logs) rich would wrap tables at 80 columns: give them room.
out = cast("Console", _LazyConsole(width=None if sys.stdout.isatty() else 160))
err = cast("Console", _LazyConsole(stderr=True))


_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
"""The Unicode bidi controls: the marks (ALM, LRM, RLM), the embeddings and overrides (LRE, RLE,
PDF, LRO, RLO: ``\\u202e`` shows what follows it right to left), the isolates (LRI, RLI, FSI,
PDI). A stored id or text holding one would reorder what an operator reads in a table."""
_CONTROLS = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
"""The C0 and C1 control characters but tab and newline: ESC (OSC 52 clipboard writes, screen
clears, title changes), BEL, CR, the 8-bit CSI/OSC (``\\x9b``, ``\\x9d``); and the bidi
controls (``_BIDI``)."""
_JSON_UNESCAPED = re.compile(f"[\x7f-\x9f{_BIDI}]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """Stored text (a turn, a block, a fact, an entry) as the terminal shows it but never acts
    on: every control character but tab and newline written as ``\\x1b``, every bidi control
    as ``\\u202e``."""
    return _CONTROLS.sub(_escaped, text)


def cell(text: object) -> Text:
    """A table cell of stored text: ``shown`` and never read as rich markup (``[link=…]``)."""
    from rich.text import Text

    return Text(shown(str(text)))


def json_shown(document: str) -> str:
    """JSON text as a terminal may show it: JSON escapes the C0 controls already (``\\u001b``);
    DEL, the C1 ones (the 8-bit CSI ``\\u009b``) and the bidi controls (``\\u202e``) get the
    same escape (still the same JSON: they are only ever inside its strings)."""
    return _JSON_UNESCAPED.sub(lambda m: f"\\u{ord(m[0]):04x}", document)


def new_table(*columns: str, **options: Any) -> Table:
    """A rich ``Table`` (rich imported only by the commands that print one)."""
    from rich.table import Table

    return Table(*columns, **options)


class CliError(ActionableError):
    """A failure to report as one line on stderr with exit status 1."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


DEV_ENV_KEYS = ("REDIS_URL", "DATABASE_URL", "MEMWORKER_STREAM_PREFIX")


def _set(key: str) -> bool:
    """Whether the environment sets ``key`` (REDIS_URL may also be MEMWORKER_REDIS_URL); an
    empty value is unset, as ``Settings`` reads it."""
    return bool(os.environ.get(key) or os.environ.get(f"MEMWORKER_{key}"))


def running_dev_env() -> dict[str, str]:
    """The settings in ``dev.env`` of a ``memworker dev`` running on the default data dir
    (its lock is held), for those of ``DEV_ENV_KEYS`` the environment does not set; empty when
    no ``dev`` runs there or the environment names both servers."""
    if _set("REDIS_URL") and _set("DATABASE_URL"):
        return {}
    from worker.ops.embedded import default_data_dir

    data_dir = default_data_dir()
    try:
        fd = os.open(data_dir / "dev.lock", os.O_RDONLY)
    except OSError:
        return {}
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return {}  # free: no dev runs there, its dev.env may name servers long gone
    except BlockingIOError:
        pass
    finally:
        os.close(fd)
    found = {}
    with contextlib.suppress(OSError, ValueError):  # ValueError: not shell words (edited)
        # read as the shell reads it (``export NAME='value'``, quoted by ``dev.env_lines``)
        for word in shlex.split((data_dir / "dev.env").read_text()):
            key, _, value = word.partition("=")
            if key in DEV_ENV_KEYS and not _set(key):
                found[key] = value
    return found


def settings_from_env() -> Settings:
    """Settings from the environment; what it leaves out of REDIS_URL, DATABASE_URL and
    MEMWORKER_STREAM_PREFIX from the ``memworker dev`` running on the default data dir (so
    its servers work without sourcing ``dev.env``), said in one line on stderr."""
    dev = running_dev_env()
    if dev:
        from worker.ops.embedded import default_data_dir

        print(
            f"memworker: using {', '.join(sorted(dev))} of the memworker dev running on "
            f"{default_data_dir()} (set them to use other servers)",
            file=sys.stderr,
        )
    try:
        settings = Settings()
        # dev.env holds what that dev's validated settings said: no second validation needed
        fields = {k.lower().removeprefix("memworker_"): v for k, v in dev.items()}
        return settings.model_copy(update=fields)
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
    """Usage error (exit status 2) for any id a key may not carry, e.g. ``project_id="a b"``
    (a reader's or a forget's: ``..``, which an older version stored, is taken)."""
    for name, value in ids.items():
        try:
            validate_id(value, name)
        except InvalidIdError as exc:
            raise typer.BadParameter(str(exc)) from exc


def check_write_ids(**ids: str) -> None:
    """``check_ids`` for the ids a write names: not ``.`` or ``..`` alone either."""
    for name, value in ids.items():
        try:
            validate_write_id(value, name)
        except InvalidIdError as exc:
            raise typer.BadParameter(str(exc)) from exc


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's work; bad input the input rule refuses on the way (a query too long,
    a time outside the calendar) is a usage error: ``main`` says it in one line naming the
    field, exit status 2."""
    return asyncio.run(coro)


async def with_redis(settings: Settings, use: Callable[[Redis], Awaitable[T]]) -> T:
    redis: Any = client_for(settings)
    try:
        await redis.ping()
    except (RedisConnectionError, OSError) as exc:
        await redis.aclose()
        raise CliError(f"cannot reach Redis at {mask(settings.redis_url)}: {exc}") from exc
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


def check_out(path: Path, force: bool) -> None:
    """Refuse ``--out PATH`` before any work: an empty path, a directory, a missing
    directory, a symbolic link, or an existing file without ``--force`` (one line naming
    ``--out``)."""
    text = str(path)
    if text in ("", ".") or path.is_dir():
        fail(f"--out {text!r} is a directory (or empty): name a file to write")
    if not path.parent.is_dir():
        fail(f"--out {text}: the directory {str(path.parent)!r} does not exist")
    if path.is_symlink():
        fail(f"--out {text} is a symbolic link: name the file itself")
    if path.exists() and not force:
        fail(f"--out {text} exists: pass --force to overwrite it")


def write_private(path: Path, data: bytes, force: bool) -> None:
    """Write ``data`` to ``path`` readable by its owner only (0600: it may hold a user's whole
    memory), never through a symbolic link (``O_NOFOLLOW``), and over an existing file only
    with ``force`` (else ``O_EXCL``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        fail(f"--out {path} exists: pass --force to overwrite it")
    except OSError as exc:
        fail(f"--out {path}: cannot write it: {exc.strerror or exc}")
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)  # an existing file overwritten with --force too
        out.write(data)
