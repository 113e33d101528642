"""Redis replies as text: the one place bytes from Redis become ``str``.

A reply field may come back as ``bytes`` (the default client) or ``str`` (a client built with
``decode_responses``); every room reads both through ``text``.
"""

from __future__ import annotations


def text(value: bytes | str) -> str:
    """``value`` as text; undecodable bytes are kept as ``\\x..`` escapes, never dropped."""
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
