"""memworker: the agent-memory lifecycle worker and its working-memory library.

``from worker import AgentLifecycleManager, LifecycleResult, LifecycleHooks, LifecycleEvent``
gives the syndarix-shaped lifecycle API; ``from worker import Memory, Episode, Fact, ...``
LoomFlow's user memory (``worker.user_memory``); the names are imported on first use, so importing
any ``worker`` module stays cheap (docs/architecture.md maps the packages).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.agents.hooks import LifecycleEvent, LifecycleHooks
    from worker.agents.manager import AgentLifecycleManager, LifecycleResult
    from worker.user_memory.memory import Memory
    from worker.user_memory.models import (
        Episode,
        EpisodeMatch,
        Fact,
        FactMatch,
        IsolationWarning,
        MemoryBlock,
        MemoryExport,
        MemoryProfile,
        Message,
        Role,
    )

__version__ = "0.1.0"
_USER_MEMORY = (
    "Episode",
    "EpisodeMatch",
    "Fact",
    "FactMatch",
    "IsolationWarning",
    "MemoryBlock",
    "MemoryExport",
    "MemoryProfile",
    "Message",
    "Role",
)
__all__ = [
    "AgentLifecycleManager",
    "Episode",
    "EpisodeMatch",
    "Fact",
    "FactMatch",
    "IsolationWarning",
    "LifecycleEvent",
    "LifecycleHooks",
    "LifecycleResult",
    "Memory",
    "MemoryBlock",
    "MemoryExport",
    "MemoryProfile",
    "Message",
    "Role",
]

_LAZY = {
    "AgentLifecycleManager": "worker.agents.manager",
    "LifecycleResult": "worker.agents.manager",
    "LifecycleEvent": "worker.agents.hooks",
    "LifecycleHooks": "worker.agents.hooks",
    "Memory": "worker.user_memory.memory",
    **{name: "worker.user_memory.models" for name in _USER_MEMORY},
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
