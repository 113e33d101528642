"""The public way to publish lifecycle commands: ``from worker.client import LifecycleClient``.

It lives in ``worker.lifecycle.client``; this name stays for the README and users.
"""

from worker.lifecycle.client import (
    ID_PATTERN,
    LifecycleClient,
    RedisConditionError,
    ResultTimeoutError,
)

__all__ = ["ID_PATTERN", "LifecycleClient", "RedisConditionError", "ResultTimeoutError"]
