"""Deterministic ids: the fast uuid5 is the standard one, so ids stay stable across versions."""

from __future__ import annotations

import uuid

import pytest

from worker.ids import uuid5_text
from worker.lifecycle.result_ids import (
    CHECKPOINT_NAMESPACE,
    RESULT_NAMESPACE,
    default_checkpoint_id,
    result_event_id,
)


@pytest.mark.parametrize("name", ["", "p/e1", "proj:a/evt-é", "x" * 300])
def test_uuid5_text_equals_the_standard_library(name: str) -> None:
    for namespace in (RESULT_NAMESPACE, CHECKPOINT_NAMESPACE, uuid.NAMESPACE_DNS):
        assert uuid5_text(namespace, name) == str(uuid.uuid5(namespace, name))


def test_result_and_checkpoint_ids_depend_on_project_and_event() -> None:
    assert result_event_id("a", "e") == result_event_id("a", "e")
    assert result_event_id("a", "e") != result_event_id("b", "e")
    assert default_checkpoint_id("a", "e") != result_event_id("a", "e")
