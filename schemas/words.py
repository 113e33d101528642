"""The contract's closed word lists that need no model: command types and outcomes
(``schemas.commands`` and ``schemas.results`` use them; a producer checks them without
building either module's models)."""

from __future__ import annotations

from typing import Literal

Outcome = Literal["success", "failure", "partial", "abandoned"]
CommandType = Literal["spawn", "pause", "resume", "terminate"]
COMMAND_TYPES: tuple[str, ...] = ("spawn", "pause", "resume", "terminate")
