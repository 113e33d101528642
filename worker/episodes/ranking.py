"""Hybrid recall: episodes ranked by meaning and words together, then recency and importance.

``EpisodeStore.recall`` runs two searches over one project's episodes (the same filters on both):

1. **Vector similarity**: cosine distance between the query's embedding and each episode's
   (``episode_embeddings``, HNSW), the ``candidates`` nearest.
2. **Full-text rank**: ``ts_rank`` of the episode's ``search_vector`` against the query's
   words joined by OR (so an episode sharing some of the words still counts), the
   ``candidates`` best (of at most ``text_cap`` matches ranked: ``episodes.text_search``).

They are fused by weighted **reciprocal rank fusion** (Cormack et al., 2009): ``relevance(e)
= Σ weight / (rrf_k + rank)`` over the lists ``e`` is in (``vector_weight``, ``text_weight``),
divided by its maximum so it lies in ``[0, 1]``. Ranks, not raw scores, are fused, so a
cosine and a ``ts_rank`` never need a common scale. The final score follows the Generative
Agents paper (Park et al., 2023):
``relevance_weight × relevance + recency_weight × recency + importance_weight × importance``,
with ``recency = recency_decay ** hours since the episode`` and ``importance`` the episode's
``importance_score`` (0..1). Recency and importance only reorder what matched; they never
bring in an episode neither search found.

The weights are ``RecallWeights`` (pass your own to ``recall``). The defaults make relevance
dominate (the labeled set in ``bench/recall_quality.py`` is what they were chosen on) and let
recency and importance break near-ties.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class RecallWeights:
    relevance_weight: float = 1.0
    recency_weight: float = 0.15
    importance_weight: float = 0.15
    recency_decay: float = 0.995
    """Per hour, as in Generative Agents: an episode a week old keeps 0.995**168 ≈ 0.43."""
    vector_weight: float = 1.0
    text_weight: float = 0.3
    """Of each search's ranks in the fusion. Full-text matches on any of the query's words, so
    a common word ranks unrelated episodes; on the labeled set equal weights (plain RRF) let
    those push the right episode out of the top 3 (see BENCHMARKS.md)."""
    rrf_k: int = 10
    """Smaller than the usual 60: the first places of each list count more (BENCHMARKS.md)."""
    candidates: int = 50
    """How many episodes each search contributes (at least ``limit``)."""


DEFAULT_WEIGHTS = RecallWeights()


@dataclass(frozen=True, slots=True)
class Candidate:
    episode_id: str
    occurred_at: datetime
    importance: float


def fuse(
    ranked_lists: Sequence[Sequence[str]],
    candidates: dict[str, Candidate],
    weights: RecallWeights,
    now: datetime | None = None,
) -> list[tuple[str, float, float]]:
    """``(episode_id, score, relevance)``, best first, of every episode in ``ranked_lists``
    (the vector search's ranking, then the full-text one's)."""
    now = now or datetime.now(UTC)
    relevance: dict[str, float] = {}
    list_weights = (weights.vector_weight, weights.text_weight)
    for ranked, weight in zip(ranked_lists, list_weights, strict=True):
        for rank, episode_id in enumerate(ranked, start=1):
            share = weight / (weights.rrf_k + rank)
            relevance[episode_id] = relevance.get(episode_id, 0.0) + share
    used = sum(w for ranked, w in zip(ranked_lists, list_weights, strict=True) if ranked)
    best = (used or 1.0) / (weights.rrf_k + 1)
    scored = []
    for episode_id, fused in relevance.items():
        candidate = candidates[episode_id]
        hours = max(0.0, (now - candidate.occurred_at).total_seconds() / 3600)
        recency = weights.recency_decay**hours
        importance = min(1.0, max(0.0, candidate.importance))
        normalised = fused / best
        score = (
            weights.relevance_weight * normalised
            + weights.recency_weight * recency
            + weights.importance_weight * importance
        )
        scored.append((episode_id, score, normalised))
    scored.sort(key=lambda item: (-item[1], item[0]))
    return scored
