"""Working memory of one agent session: ``WorkingMemory`` and what it hands back or raises.

Owns each session's keys in Redis (variables, task state, scratchpad, checkpoints).
"""

from worker.memory.api import WorkingMemory
from worker.memory.errors import (
    CheckpointNotFoundError,
    InvalidKeyError,
    InvalidValueError,
    LimitExceededError,
    MemoryNotFoundError,
    RedisUnavailableError,
    ReservedKeyError,
    SessionBytesExceededError,
    SessionForgottenError,
    SessionPausedError,
    SessionTerminatedError,
    UnstorableTextError,
    WorkingMemoryError,
)
from worker.memory.models import (
    CheckpointInfo,
    MemoryStats,
    ScratchpadEntry,
    TaskState,
    TaskStatus,
)

__all__ = [
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "InvalidKeyError",
    "InvalidValueError",
    "LimitExceededError",
    "MemoryNotFoundError",
    "MemoryStats",
    "RedisUnavailableError",
    "ReservedKeyError",
    "ScratchpadEntry",
    "SessionBytesExceededError",
    "SessionForgottenError",
    "SessionPausedError",
    "SessionTerminatedError",
    "TaskState",
    "TaskStatus",
    "UnstorableTextError",
    "WorkingMemory",
    "WorkingMemoryError",
]
