"""What can go wrong with working memory, each error saying which key, limit or setting.

Every error derives from :class:`WorkingMemoryError`, so a caller can catch them all; the
invalid-input ones are also ``ValueError``/``TypeError`` so generic handlers still work.
"""

from __future__ import annotations

from worker.redis_conditions import RedisConditionError


class WorkingMemoryError(Exception):
    """Base of every working-memory error."""


class InvalidKeyError(WorkingMemoryError, ValueError):
    """A key name that is empty, too long, or holds control characters."""


class ReservedKeyError(InvalidKeyError):
    """A key starting with ``_``: those names belong to the worker."""


class InvalidValueError(WorkingMemoryError, TypeError, ValueError):
    """A value that cannot be stored as JSON (NaN, a set, an object): a ``TypeError`` as it
    always was, and a ``ValueError`` as every door's bad input is."""


class UnstorableTextError(InvalidValueError, ValueError):
    """A value holding text that cannot be stored as text, at any depth, in a key or a value:
    a NUL character or a lone surrogate (Postgres, where the session's episode goes, holds
    neither). The message names where; a ``ValueError`` as every door's bad input is."""


class LimitExceededError(WorkingMemoryError, ValueError):
    """A write that would take the session past one of its configured limits (a
    ``ValueError``, as every door's bad input is).

    ``limit`` names what was exceeded (``keys``, ``value_bytes``, ``checkpoints``),
    ``setting`` the setting (and environment variable) that raises it, ``maximum`` its value.
    """

    def __init__(self, message: str, *, limit: str, setting: str, maximum: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.setting = setting
        self.maximum = maximum


class SessionBytesExceededError(LimitExceededError, ValueError):
    """A write that would take the session's variables (names and JSON values) past
    ``max_session_bytes`` (``MEMWORKER_MAX_SESSION_BYTES``); a ``ValueError`` too."""


class SessionTerminatedError(WorkingMemoryError):
    """A write to a session the lifecycle worker has terminated."""


class SessionForgottenError(SessionTerminatedError):
    """A write to a session ``memworker forget`` forgot: nothing of it may be kept again."""


class SessionPausedError(WorkingMemoryError):
    """A write to a paused session: resume restores its checkpoint over anything written
    meanwhile, so the write is refused rather than accepted and lost."""


class MemoryNotFoundError(WorkingMemoryError, KeyError):
    """Something asked for by name that the session does not have (the seeds' name for it)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CheckpointNotFoundError(MemoryNotFoundError):
    """A checkpoint id the session does not have."""


class RedisUnavailableError(WorkingMemoryError, RedisConditionError):
    """Redis cannot serve working memory now: unreachable, full (``maxmemory``), busy, loading
    or failing over. ``condition.kind`` says which; the message names the server, the
    condition and what to do. Nothing was written. Also a ``RedisConditionError`` (what
    ``LifecycleClient`` raises) and a ``ConnectionError``."""
