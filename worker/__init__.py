"""memworker: the agent-memory lifecycle worker and its working-memory library.

``from worker import AgentLifecycleManager, LifecycleResult, LifecycleHooks, LifecycleEvent``
gives the syndarix-shaped lifecycle API; the names are imported on first use, so importing
any ``worker`` module stays cheap (docs/architecture.md maps the packages).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.agents.hooks import LifecycleEvent, LifecycleHooks
    from worker.agents.manager import AgentLifecycleManager, LifecycleResult

__version__ = "0.1.0"
__all__ = ["AgentLifecycleManager", "LifecycleEvent", "LifecycleHooks", "LifecycleResult"]

_LAZY = {
    "AgentLifecycleManager": "worker.agents.manager",
    "LifecycleResult": "worker.agents.manager",
    "LifecycleEvent": "worker.agents.hooks",
    "LifecycleHooks": "worker.agents.hooks",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
