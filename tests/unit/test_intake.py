"""Intake: how a command's values are checked before they reach a script."""

from __future__ import annotations

import orjson
import pytest

from worker.lifecycle.intake import Refused, Unusable, encode_as_nested, parse_entry
from worker.settings import Settings


def test_a_value_is_encoded_as_itself_and_refused_when_too_deep_for_a_result() -> None:
    values: list[object] = [1, "x", {"a": [1, {"b": None}]}, [], {}]
    for value in values:
        assert encode_as_nested(value) == orjson.dumps(value)
    deep: object = 1
    for _ in range(253):
        deep = [deep]
    with pytest.raises(TypeError):
        encode_as_nested(deep)


def test_an_entry_far_over_the_size_limit_is_never_parsed() -> None:
    """Over 4x MEMWORKER_MAX_EVENT_BYTES the entry is refused unread: peak memory stays near its
    own size (parsing a 5 MB list of strings took 132 MB); up to it, an oversized command is
    still answered ``limit_exceeded`` naming its event."""
    import tracemalloc

    settings = Settings(max_event_bytes=1024)
    spawn = {"type": "spawn", "event_id": "big-1", "project_id": "p", "session_id": "s"}
    over = orjson.dumps({**spawn, "pad": ["a"] * 1_000_000})
    tracemalloc.start()
    try:
        unread = parse_entry({b"data": over}, 0, settings)
        _size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(unread, Unusable)
    assert "not read" in unread.error and "MEMWORKER_MAX_EVENT_BYTES" in unread.error
    assert peak < len(over), f"{peak} bytes allocated to refuse {len(over)} bytes"
    near = orjson.dumps({**spawn, "pad": "a" * 2048})
    refused = parse_entry({b"data": near}, 0, settings)
    assert isinstance(refused, Refused) and refused.reason == "limit_exceeded"
