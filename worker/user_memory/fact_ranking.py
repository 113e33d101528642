"""How ``FactStore.recall_scored`` orders a user's facts and the scores it gives each
(``FactMatch``): the searches' results in, the matches out, nothing read here.

- **By meaning alone** (a store with its own embedder): by the cosine, best first;
- **by words alone** (no vectors yet): in the words search's order (``ts_rank``, then the
  shorter claim, then the id);
- **both**: reciprocal rank fusion of the two rankings (k = 60, equal weights), ties by id;
  a fact not embedded yet is still found by its words.

The fused score is ``1 / (RRF_K + rank)`` summed over the rankings that found the fact, also
when only one ranking ran, so a score means the same whichever searches ran; an empty query
gives the most recently recorded facts, each scored 1.0 (LoomFlow's neutral score).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence

from worker.user_memory.models import Fact, FactMatch

FUSED_CANDIDATES = 50
"""How many facts each search brings (the words search's best, the nearest by meaning)."""
RRF_K = 60


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    [found] = cosines(a, [b])
    return found


def cosines(query: Sequence[float], vectors: Iterable[Sequence[float]]) -> list[float]:
    """Each vector's cosine to ``query`` (0.0 for a zero vector), the query's norm taken once
    and the sums made by ``map`` in C: a user's thousand facts of 384 dimensions took ~3× as
    long with a generator per sum (BENCHMARKS.md, the memory inspector)."""
    query_norm = math.sqrt(sum(map(operator.mul, query, query)))
    found = []
    for vector in vectors:
        norm = query_norm * math.sqrt(sum(map(operator.mul, vector, vector)))
        found.append(sum(map(operator.mul, query, vector)) / norm if norm else 0.0)
    return found


def by_cosine(scored: Sequence[tuple[Fact, float]]) -> list[tuple[Fact, float]]:
    """``(fact, cosine)`` pairs, the most similar first (ties by id)."""
    return sorted(scored, key=lambda pair: (-pair[1], pair[0].id))


def rank_facts(
    by_words: Sequence[tuple[Fact, float | None]] | None,
    by_meaning: Sequence[tuple[Fact, float]] | None,
    limit: int,
) -> list[FactMatch]:
    """The best ``limit`` facts with their scores (module doc). ``by_words``: the words
    search's facts in its order with their ``ts_rank`` (None: the query was empty), or None
    when it did not run; ``by_meaning``: every candidate with a vector and its cosine, best
    first (its first ``FUSED_CANDIDATES`` are the ranking; the rest give their cosine only),
    or None when it did not run."""
    words = list(by_words or [])
    if by_meaning is None and words and all(rank is None for _f, rank in words):
        return [FactMatch(fact=f, score=1.0) for f, _rank in words[: max(0, limit)]]
    facts: dict[str, Fact] = {}
    fused: dict[str, float] = {}
    word_score: dict[str, float | None] = {}
    vector_score: dict[str, float] = {}
    for rank, (fact, ts_rank) in enumerate(words, start=1):
        facts[fact.id] = fact
        fused[fact.id] = fused.get(fact.id, 0.0) + 1.0 / (RRF_K + rank)
        word_score[fact.id] = ts_rank
    nearest = list(by_meaning or [])
    for rank, (fact, similarity) in enumerate(nearest, start=1):
        vector_score[fact.id] = similarity
        if by_words is not None and rank > FUSED_CANDIDATES:
            continue  # fused: the nearest FUSED_CANDIDATES are the ranking by meaning
        facts.setdefault(fact.id, fact)
        fused[fact.id] = fused.get(fact.id, 0.0) + 1.0 / (RRF_K + rank)
    if by_meaning is None:  # words alone: the search's own order
        order = [f.id for f, _rank in words]
    else:
        order = sorted(fused, key=lambda i: (-fused[i], i))
    return [
        FactMatch(
            fact=facts[i],
            score=fused[i],
            vector_score=vector_score.get(i),
            word_score=word_score.get(i),
        )
        for i in order[: max(0, limit)]
    ]


def fuse_facts(by_words: list[Fact], by_meaning: list[Fact]) -> list[Fact]:
    """Words and meaning together, by reciprocal rank fusion (k = 60, equal weights): a fact
    not embedded yet is still found by its words."""
    score: dict[str, float] = {}
    facts: dict[str, Fact] = {}
    for ranking in (by_words, by_meaning):
        for rank, fact in enumerate(ranking, start=1):
            score[fact.id] = score.get(fact.id, 0.0) + 1.0 / (RRF_K + rank)
            facts[fact.id] = fact
    return [facts[i] for i in sorted(score, key=lambda i: (-score[i], i))]
