"""How recalled facts are ordered and scored (``worker.user_memory.fact_ranking``): the fused
score is ``1 / (60 + rank)`` summed over the rankings that found a fact, and it alone orders
them when both searches ran; words alone keep the search's order; an empty query scores 1.0;
a fact's cosine is given even when it is past the meaning ranking's candidates."""

from __future__ import annotations

import pytest

from worker.user_memory.fact_ranking import FUSED_CANDIDATES, RRF_K, by_cosine, rank_facts
from worker.user_memory.models import Fact


def fact(name: str) -> Fact:
    return Fact(id=name, user_id="ann", subject="ann", predicate="likes", object=name)


def test_both_rankings_fuse_by_reciprocal_rank_and_the_scores_say_so() -> None:
    a, b, c, d = fact("a"), fact("b"), fact("c"), fact("d")
    words = [(a, 0.6), (b, 0.3)]
    meaning = by_cosine([(b, 0.5), (c, 0.9), (d, 0.1)])  # a: no vector yet
    found = rank_facts(words, meaning, limit=10)
    # b: second by words and by meaning; a (words) and c (meaning) first of one each, tied:
    # by id; d: third by meaning alone
    assert [m.fact.id for m in found] == ["b", "a", "c", "d"]
    by_id = {m.fact.id: m for m in found}
    assert by_id["b"].score == pytest.approx(2 / (RRF_K + 2))
    assert by_id["a"].score == pytest.approx(1 / (RRF_K + 1)) == by_id["c"].score
    assert by_id["d"].score == pytest.approx(1 / (RRF_K + 3))
    assert (by_id["b"].word_score, by_id["b"].vector_score) == (0.3, 0.5)
    assert (by_id["a"].word_score, by_id["a"].vector_score) == (0.6, None)
    assert (by_id["c"].word_score, by_id["c"].vector_score) == (None, 0.9)
    assert [m.fact.id for m in rank_facts(words, meaning, limit=1)] == ["b"]


def test_words_alone_keep_the_search_order_and_an_empty_query_scores_one() -> None:
    a, b = fact("a"), fact("b")
    found = rank_facts([(b, 0.2), (a, 0.2)], None, limit=5)
    assert [m.fact.id for m in found] == ["b", "a"]
    assert [m.score for m in found] == pytest.approx([1 / (RRF_K + 1), 1 / (RRF_K + 2)])
    assert all(m.vector_score is None for m in found)
    recent = rank_facts([(a, None), (b, None)], None, limit=5)
    assert [(m.fact.id, m.score, m.word_score) for m in recent] == [
        ("a", 1.0, None),
        ("b", 1.0, None),
    ]
    assert rank_facts([], None, limit=5) == []


def test_meaning_alone_ranks_by_cosine_and_only_its_candidates_count_when_fused() -> None:
    alone = rank_facts(None, by_cosine([(fact("x"), 0.1), (fact("y"), 0.7)]), limit=5)
    assert [(m.fact.id, m.vector_score) for m in alone] == [("y", 0.7), ("x", 0.1)]
    many = by_cosine([(fact(f"n{i:03}"), 1.0 - i / 1000) for i in range(FUSED_CANDIDATES + 5)])
    last = many[-1][0]
    found = rank_facts([(last, 0.4)], many, limit=FUSED_CANDIDATES + 5)
    match = next(m for m in found if m.fact.id == last.id)
    # past the meaning candidates: its cosine is shown, its rank by words alone counts
    assert match.vector_score == many[-1][1] and match.score == pytest.approx(1 / (RRF_K + 1))
    assert len(found) == FUSED_CANDIDATES + 1
