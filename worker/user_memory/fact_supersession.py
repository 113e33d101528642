"""When facts supersede each other (LoomFlow's rule, ``FactStore.append``): a fact of the same
user, subject and predicate with another object closes the one whose valid time it overlaps;
and the claim a fact id stands for (the same id with another claim is a conflict)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from worker.user_memory.models import Fact


def _claim(fact: Fact) -> tuple[Any, ...]:
    return (fact.user_id, fact.subject, fact.predicate, fact.object)


def _overlap_or_touch(a: Fact, b: Fact) -> bool:
    """``a`` and ``b`` overlap in valid time, or one starts where the other ends."""
    return (a.valid_until is None or a.valid_until >= b.valid_from) and (
        b.valid_until is None or b.valid_until >= a.valid_from
    )


class FactConflictError(ValueError):
    """``append`` of a fact id already stored with another claim."""


def _overlap(a: Fact, b: Fact) -> bool:
    return (a.valid_until is None or a.valid_until > b.valid_from) and (
        b.valid_until is None or b.valid_until > a.valid_from
    )


def plan_supersession(
    incoming: Fact, same_key: Iterable[Fact]
) -> tuple[dict[str, datetime], datetime | None]:
    """``({stored id: its new valid_until}, incoming's valid_until)``: LoomFlow's rule."""
    closes: dict[str, datetime] = {}
    until = incoming.valid_until
    for stored in same_key:
        if stored.id == incoming.id or stored.object == incoming.object:
            continue
        if not _overlap(stored, incoming):
            continue
        if stored.valid_from <= incoming.valid_from:
            closes[stored.id] = incoming.valid_from
        elif until is None or until > stored.valid_from:
            until = stored.valid_from
    return closes, until
