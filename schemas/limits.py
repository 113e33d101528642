"""Limits every producer should know; the worker's settings may lower or raise them."""

from __future__ import annotations

SCHEMA_VERSION = 1
"""The highest command ``schema_version`` this release understands."""

MAX_EVENT_BYTES = 1_048_576
MAX_KEYS_PER_SESSION = 10_000
MAX_VALUE_BYTES = 1_048_576
MAX_SCRATCHPAD_ENTRIES = 1_000
MAX_TASK_DESCRIPTION_CHARS = 2_000
MAX_CORRELATION_ID_CHARS = 128
