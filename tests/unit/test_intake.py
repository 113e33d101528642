"""Intake: how a command's values are checked before they reach a script."""

from __future__ import annotations

import orjson
import pytest

from worker.lifecycle.intake import encode_as_nested


def test_a_value_is_encoded_as_itself_and_refused_when_too_deep_for_a_result() -> None:
    values: list[object] = [1, "x", {"a": [1, {"b": None}]}, [], {}]
    for value in values:
        assert encode_as_nested(value) == orjson.dumps(value)
    deep: object = 1
    for _ in range(253):
        deep = [deep]
    with pytest.raises(TypeError):
        encode_as_nested(deep)
