"""The hybrid ranking (``worker.episodes.ranking.fuse``): no server needed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from worker.episodes.ranking import DEFAULT_WEIGHTS, Candidate, RecallWeights, fuse

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def candidates(*items: tuple[str, float, float]) -> dict[str, Candidate]:
    """``(id, hours ago, importance)`` each."""
    return {i: Candidate(i, NOW - timedelta(hours=h), imp) for i, h, imp in items}


def test_an_episode_both_searches_found_outranks_one_found_by_one_search() -> None:
    found = candidates(("both", 1, 0.5), ("vector", 1, 0.5), ("text", 1, 0.5))
    ranked = fuse([["vector", "both"], ["text", "both"]], found, DEFAULT_WEIGHTS, NOW)
    assert ranked[0][0] == "both"


def test_the_vector_search_weighs_more_than_the_text_search_by_default() -> None:
    found = candidates(("v", 1, 0.5), ("t", 1, 0.5))
    ranked = fuse([["v"], ["t"]], found, DEFAULT_WEIGHTS, NOW)
    assert [r[0] for r in ranked] == ["v", "t"]


def test_between_equally_relevant_episodes_the_recent_and_important_one_wins() -> None:
    found = candidates(("old", 24 * 30, 0.2), ("new", 1, 0.9))
    only_recency = RecallWeights(vector_weight=1.0, text_weight=1.0)
    ranked = fuse([["old"], ["new"]], found, only_recency, NOW)
    assert ranked[0][0] == "new"
    assert ranked[0][2] == ranked[1][2]  # same relevance: recency and importance decided


def test_relevance_is_between_zero_and_one_and_nothing_unmatched_is_returned() -> None:
    found = candidates(("a", 1, 0.5), ("b", 1, 0.5), ("c", 1, 0.5))
    ranked = fuse([["a", "b"], ["a"]], found, DEFAULT_WEIGHTS, NOW)
    assert {r[0] for r in ranked} == {"a", "b"}
    assert ranked[0][2] == 1.0
    assert all(0.0 < r[2] <= 1.0 for r in ranked)
