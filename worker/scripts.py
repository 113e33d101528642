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
from redis.exceptions import NoScriptError

_PRELUDE = "_session.lua"
STANDALONE = frozenset({"dead_letter.lua", "publish_command.lua"})


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
            body = shebang + _read(_PRELUDE) + "\n" + body
        return cls(name, body)

    async def __call__(
        self,
        redis: Redis | RedisCluster,
        keys: Sequence[str],
        args: Sequence[str | int | float | bytes],
    ) -> Any:
        """Run by SHA; load the script first if the server does not know it (e.g. restarted)."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await redis.script_load(self.source)
            return await redis.evalsha(self.sha, len(keys), *keys, *args)

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


_CACHE: dict[str, LuaScript] = {}


def script(name: str) -> LuaScript:
    """The script ``worker/lua/<name>``, read once per process."""
    found = _CACHE.get(name)
    if found is None:
        found = _CACHE[name] = LuaScript.load(name)
    return found
