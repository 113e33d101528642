"""The wire contract in code: pydantic models of every event memworker reads or writes."""

from schemas.commands import (
    COMMAND_ADAPTER,
    COMMAND_TYPES,
    Command,
    CommandBase,
    PauseCommand,
    ResumeCommand,
    SpawnCommand,
    TerminateCommand,
)
from schemas.ids import ID_PATTERN, Id
from schemas.limits import SCHEMA_VERSION
from schemas.results import (
    RESULT_ADAPTER,
    RESULT_TYPES,
    AgentPaused,
    AgentResumed,
    AgentSpawned,
    AgentTerminated,
    CommandRejected,
    Result,
    ResultBase,
    Snapshot,
)
from schemas.streams import DeadLetter, EpisodeRecorded, MemoryForgotten

__all__ = [
    "COMMAND_ADAPTER",
    "COMMAND_TYPES",
    "ID_PATTERN",
    "RESULT_ADAPTER",
    "RESULT_TYPES",
    "SCHEMA_VERSION",
    "AgentPaused",
    "AgentResumed",
    "AgentSpawned",
    "AgentTerminated",
    "Command",
    "CommandBase",
    "CommandRejected",
    "DeadLetter",
    "EpisodeRecorded",
    "Id",
    "MemoryForgotten",
    "PauseCommand",
    "Result",
    "ResultBase",
    "ResumeCommand",
    "Snapshot",
    "SpawnCommand",
    "TerminateCommand",
]
