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
MAX_SESSION_TTL_SECONDS = 30 * 86_400
"""A spawn's ``ttl_seconds`` at most (30 days of idleness; a paused session never expires)."""
MAX_TRACEPARENT_BYTES = 512
"""A stream entry's ``traceparent`` field at most (a W3C traceparent is 55 bytes)."""

# The input rule of every door (HTTP, MCP, Python, CLI, streams): ``schemas.inputs`` checks them.
MAX_ID_CHARS = 128
"""Every id (project, user, session, turn, fact, block name): 1-128 of ``[A-Za-z0-9._:-]``."""
MAX_TURN_TEXT_BYTES = 262_144
"""A turn's ``input`` and ``output`` together, UTF-8. Postgres indexes a turn's words in one
``tsvector`` of at most 1 MB; a text of distinct words costs up to ~2.8 times its size there,
so 256 KiB of text always fits (a longer text is refused, never cut)."""
MAX_QUERY_BYTES = 32_768
"""A recall query, UTF-8 (LoomFlow's agents recall with the user's prompt: 32 KiB is a long
prompt; a longer one is refused with an error naming ``query``)."""
MAX_QUERY_WORDS = 128
"""The most distinct words (English stems, stop words dropped) a recall's words search uses:
a query with more is searched by this many of them, in its order but the table's common words
last (``worker.db.query_words``; the meaning half still reads the whole query). Bounds a
recall's work, which grows with the words it searches by: a pasted paragraph (~60-120 distinct
words) is searched whole."""
MAX_FACT_FIELD_BYTES = 4_096
"""A fact's ``subject``, ``predicate``, ``object`` and each of its ``sources``, UTF-8."""
MAX_REMEMBER_BATCH = 1_000
"""The most turns one ``Memory.remember_many`` (the ``remember_many`` tool, ``POST
/v1/remember_many``) takes; more is refused whole (HTTP 413): send smaller batches."""
MAX_RESULTS = 10_000
"""The largest ``limit`` a read takes in Python (the HTTP and MCP tools take up to 100, or
1,000 messages)."""
MAX_TTL_SECONDS = 31_536_000
"""The longest ``ttl_seconds`` (365 days): finite, positive, at most this."""
EARLIEST_YEAR = 1
LATEST_YEAR = 9999
"""A time must be a real instant in 0001-01-01..9999-12-31 UTC (in any offset), but not that
range's two edge instants, which Postgres would store as infinity (``schemas.inputs.EARLIEST``,
``LATEST``)."""
