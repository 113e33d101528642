"""The stream door's bounds that need no server: commands over a field's bound are refused
naming it, and a setting cannot give spawns more than a spawn may ask for."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas.commands import (
    COMMAND_ADAPTER,
    MAX_LESSONS,
    MAX_SAFE_INT,
    MAX_SESSION_TTL_SECONDS,
)
from worker.consumers.dead_letters import EXCERPT_BYTES, dead_letter
from worker.settings import Settings

BASE = {"event_id": "e", "project_id": "p", "session_id": "s", "agent_instance_id": "a"}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"type": "spawn", "ttl_seconds": MAX_SESSION_TTL_SECONDS + 1}, "ttl_seconds"),
        ({"type": "pause", "seq": MAX_SAFE_INT + 1}, "seq"),
        ({"type": "terminate", "tokens_used": MAX_SAFE_INT + 1}, "tokens_used"),
        ({"type": "terminate", "lessons_learned": ["x"] * (MAX_LESSONS + 1)}, "lessons_learned"),
        ({"type": "terminate", "lessons_learned": ["x" * 2001]}, "lessons_learned"),
        ({"type": "resume", "schema_version": -(2**60)}, "schema_version"),
    ],
)
def test_a_field_over_its_bound_is_refused_naming_it(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        COMMAND_ADAPTER.validate_python({**BASE, **fields})


def test_fields_at_their_bounds_are_accepted() -> None:
    spawn = COMMAND_ADAPTER.validate_python(
        {**BASE, "type": "spawn", "ttl_seconds": MAX_SESSION_TTL_SECONDS, "seq": MAX_SAFE_INT}
    )
    assert spawn.seq == MAX_SAFE_INT


def test_a_default_session_ttl_past_the_spawns_maximum_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MEMWORKER_SESSION_TTL_SECONDS", str(2**62))
    with pytest.raises(ValueError, match="session_ttl_seconds"):
        Settings()
    monkeypatch.setenv("MEMWORKER_SESSION_TTL_SECONDS", str(MAX_SESSION_TTL_SECONDS))
    assert Settings().session_ttl_seconds == MAX_SESSION_TTL_SECONDS


def test_a_dead_letter_keeps_an_excerpt_of_an_entry_over_the_bound_and_says_so() -> None:
    fields = {b"data": b"x" * 100_000, b"other": b"y" * 10}
    letter = dead_letter(
        fields=fields,
        source_stream="s",
        source_id="1-0",
        group="g",
        reason="unparseable",
        error="e",
        deliveries=1,
        keep_bytes=50_000,
    )
    assert letter["truncated"] == "true"
    assert letter["original_bytes"] == str(100_000 + 4 + 5 + 10)
    assert len(letter["data"]) <= EXCERPT_BYTES + 64
    whole = dead_letter(
        fields=fields,
        source_stream="s",
        source_id="1-0",
        group="g",
        reason="unparseable",
        error="e",
        deliveries=1,
    )
    assert whole["truncated"] == "false" and len(whole["data"]) > 100_000


def test_an_excerpts_ids_are_found_past_the_cut_and_bounded_whatever_the_entry_holds() -> None:
    """A hostile entry: tens of thousands of id-looking fields, nested ones, an id far longer
    than an id may be, the real ids last. The dead letter records each identifying field once
    (the last given, as a parser reads it), never a nested one, each cut to 129 characters."""
    many = b"".join(
        b'"user_id":"u%d","x%d":{"project_id":"nested"},' % (i, i) for i in range(50_000)
    )
    data = b'{"pad":"' + b"z" * 10_000 + b'",' + many
    data += b'"project_id":"' + b"p" * 100_000 + b'","session_id":"real","episode_id":7}'
    letter = dead_letter(
        fields={b"data": data},
        source_stream="s",
        source_id="1-0",
        group="g",
        reason="unparseable",
        error="e",
        deliveries=1,
        keep_bytes=len(data) // 2,
    )
    recorded = {
        k: v for k, v in letter.items() if k.startswith("original_") and k != "original_bytes"
    }
    assert recorded == {
        "original_user_id": "u49999",
        "original_project_id": "p" * 129,
        "original_session_id": "real",
    }
    assert sum(len(k) + len(v) for k, v in letter.items()) <= EXCERPT_BYTES + 1_000
