"""Dead letters (CONTRACT.md "Dead letters"): entries that cannot become a result.

A dead letter is written and its source entry acknowledged in one MULTI/EXEC, so an entry is
never both lost and acknowledged, nor dead-lettered twice by one delivery.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

import orjson
from redis.asyncio.client import Pipeline


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value


def entry_fields_json(fields: Mapping[bytes | str, bytes | str]) -> str:
    """The original entry's fields as one JSON object (bytes shown with backslash escapes)."""
    return orjson.dumps({_text(k): _text(v) for k, v in fields.items()}).decode()


def dead_letter(
    *,
    fields: Mapping[bytes | str, bytes | str],
    source_stream: str,
    source_id: str,
    group: str,
    reason: str,
    error: str,
    deliveries: int,
) -> dict[str, str]:
    """The fields of a DLQ entry, all strings as a stream entry needs."""
    return {
        "data": entry_fields_json(fields),
        "source_stream": source_stream,
        "source_id": source_id,
        "group": group,
        "reason": reason,
        "error": error[:2000],
        "deliveries": str(deliveries),
        "failed_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }


def queue_dead_letter(
    pipe: Pipeline,
    dlq_stream: str,
    letter: dict[str, str],
) -> None:
    """Add the XADD to the DLQ and the XACK of the source entry to a transaction pipeline."""
    pipe.xadd(dlq_stream, letter)  # type: ignore[arg-type]
    pipe.xack(letter["source_stream"], letter["group"], letter["source_id"])
