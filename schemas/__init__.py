"""The wire contract in code: pydantic models of every event memworker reads or writes.

The names below are imported from their module on first use (``from schemas import
Command``): importing ``schemas.ids`` alone does not build every model (a command's start,
``memworker publish``, needs few of them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_HOMES = {
    "commands": (
        "COMMAND_ADAPTER COMMAND_TYPES Command CommandBase PauseCommand ResumeCommand "
        "SpawnCommand TerminateCommand"
    ),
    "ids": "ID_PATTERN Id",
    "limits": "SCHEMA_VERSION",
    "results": (
        "RESULT_ADAPTER RESULT_TYPES AgentPaused AgentResumed AgentSpawned AgentTerminated "
        "CommandRejected Result ResultBase Snapshot"
    ),
    "streams": "DeadLetter EpisodeRecorded MemoryForgotten",
}
_HOME = {name: module for module, names in _HOMES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'schemas' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"schemas.{_HOME[name]}"), name)
    globals()[name] = value
    return value


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
