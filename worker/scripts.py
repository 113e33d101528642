"""Lua scripts, loaded from ``worker/lua/*.lua`` and run by SHA.

Session scripts are prefixed with the ``_session.lua`` prelude, so every script that touches a
session shares one definition of the key layout, idle expiry and checkpoints. Scripts that
touch no session (``STANDALONE``) are loaded as they are.

A script that writes starts with the Redis 7 shebang ``#!lua`` (no flags: it may write, and
is not ``allow-oom``). Redis then refuses it up front under ``maxmemory`` (``-OOM command not
allowed when used memory > 'maxmemory'.``) instead of at its first write that may grow memory,
so a full server grows no further by scripts that only ``PEXPIRE``/``HDEL`` before writing.
The shebang must be the source's first line: it is moved ahead of the prelude. Such a script
may only touch keys of its declared keys' hash slot (no ``allow-cross-slot-keys``). Scripts
that only read or only delete (``wm_delete``, ``wm_clear``, ``wm_scratch_clear``,
``wm_checkpoint_delete``) have none: on a full server they still run, so an agent can free
memory, and reads still push the session's idle expiry (``PEXPIRE`` is no ``denyoom`` write).

The lifecycle worker's hot path, ``apply_command.lua``, is a Redis *function* instead
(``LuaFunction``): a library loaded once with ``FUNCTION LOAD`` and run with ``FCALL``, so the
prelude's and the script's functions are defined once per load, not on every call (an
``EVALSHA`` re-runs the script's whole body, closures and tables included: ~3 µs of Redis CPU
per command; BENCHMARKS.md). Library and function are named after the source's SHA-1, so
workers of two versions can share a server during a rolling upgrade. A function that may write
(no ``no-writes`` flag) and is not ``allow-oom`` is refused under ``maxmemory`` before it runs,
as the shebang does for a script. Functions are kept in RDB/AOF and replicated, so they survive
a failover; a server restarted without persistence (or ``FUNCTION FLUSH``) answers ``ERR
Function not found``, and the caller loads the library again and retries (``is_missing``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

_PRELUDE = "_session.lua"
STANDALONE = frozenset({"dead_letter.lua", "publish_command.lua", "delete_idle_consumer.lua"})
# Session scripts bind their keys first (the prelude only declares them): see _session.lua.
_BIND = "bind_session(KEYS)\n"


def _read(name: str) -> str:
    return resources.files("worker").joinpath("lua", name).read_text(encoding="utf-8")


@dataclass(slots=True)
class LuaScript:
    """One script: its source (prelude included) and SHA1, loaded into a server on demand."""

    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()

    @classmethod
    def load(cls, name: str) -> LuaScript:
        body = _read(name)
        if not name.startswith("_") and name not in STANDALONE:
            shebang = ""
            if body.startswith("#!"):
                shebang, body = body.split("\n", 1)
                shebang += "\n"
            body = shebang + _read(_PRELUDE) + "\n" + _BIND + body
        return cls(name, body)

    async def __call__(
        self,
        redis: Redis | RedisCluster,
        keys: Sequence[str],
        args: Sequence[str | int | float | bytes],
    ) -> Any:
        """Run by SHA; load the script first if the server does not know it (e.g. restarted)."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[misc]
        except NoScriptError:
            if isinstance(redis, RedisCluster) and keys:
                # Load it where it runs: a replica promoted in a failover has no script
                # cache, and SCRIPT LOAD to every master fails while a dead one is listed.
                node = redis.get_node_from_key(keys[0])
                await redis.execute_command("SCRIPT", "LOAD", self.source, target_nodes=node)
            else:
                await redis.script_load(self.source)
            return await redis.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[misc]

    def command(self, keys: Sequence[str], args: Sequence[str | int | float | bytes]) -> list[Any]:
        """The EVALSHA command as a list, for a ``ScriptChannel`` batch."""
        return ["EVALSHA", self.sha, len(keys), *keys, *args]

    def queue(
        self, pipe: Pipeline, keys: Sequence[str], args: Sequence[str | int | float | bytes]
    ) -> None:
        """Add a run to a pipeline; the caller makes sure the script is loaded (``ensure``)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    async def ensure(self, redis: Redis) -> None:
        exists = await redis.script_exists(self.sha)
        if not exists[0]:
            await redis.script_load(self.source)


@dataclass(slots=True)
class LuaFunction:
    """A Redis function: ``worker/lua/<name>`` after the prelude, as a library of its own.

    The file defines its callback and ends with ``redis.register_function`` of
    ``FUNCTION_NAME``, which this class sets (``memworker_<stem>_<sha>``: a new version of
    the source is a new library beside the old one, never a replacement of it).
    """

    name: str
    source: str
    function: str
    library: str

    @classmethod
    def load(cls, name: str) -> LuaFunction:
        body = _read(_PRELUDE) + "\n" + _read(name)
        stem = name.removesuffix(".lua")
        digest = hashlib.sha1(body.encode()).hexdigest()[:16]
        library = f"memworker_{stem}_{digest}"
        function = library
        if body.count("FUNCTION_NAME") != 1:
            raise ValueError(f"{name} must register its callback as FUNCTION_NAME, once")
        source = f"#!lua name={library}\n" + body.replace("FUNCTION_NAME", f"'{function}'")
        return cls(name, source, function, library)

    def command(self, keys: Sequence[str], args: Sequence[str | int | float | bytes]) -> list[Any]:
        """The FCALL command as a list, for a ``ScriptChannel`` batch."""
        return ["FCALL", self.function, len(keys), *keys, *args]

    def load_command(self) -> list[Any]:
        """``FUNCTION LOAD`` of the library; check its reply with ``loaded``."""
        return ["FUNCTION", "LOAD", self.source]

    def list_command(self) -> list[Any]:
        """``FUNCTION LIST`` of this library alone: an empty list when the server lacks it."""
        return ["FUNCTION", "LIST", "LIBRARYNAME", self.library]

    @staticmethod
    def loaded(reply: Any) -> None:
        """Raise the error in a ``FUNCTION LOAD`` reply, unless it says the library is there
        already (another worker loaded it first)."""
        if isinstance(reply, Exception) and "already exists" not in str(reply):
            raise reply

    @staticmethod
    def is_missing(reply: Any) -> bool:
        """Whether an ``FCALL`` reply says the server does not have the function."""
        text = str(reply).removeprefix("ERR ")  # hiredis keeps the prefix, redis-py drops it
        return isinstance(reply, ResponseError) and text.startswith("Function not found")


_CACHE: dict[str, LuaScript] = {}
_FUNCTIONS: dict[str, LuaFunction] = {}


def function(name: str) -> LuaFunction:
    """The function library of ``worker/lua/<name>``, read once per process."""
    found = _FUNCTIONS.get(name)
    if found is None:
        found = _FUNCTIONS[name] = LuaFunction.load(name)
    return found


def script(name: str) -> LuaScript:
    """The script ``worker/lua/<name>``, read once per process."""
    found = _CACHE.get(name)
    if found is None:
        found = _CACHE[name] = LuaScript.load(name)
    return found
