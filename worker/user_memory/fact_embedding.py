"""A fact's text and vector: what ``FactStore`` embeds (``subject predicate object``), with a
LoomFlow embedder (``embed_batch``) or ours (``embed``), and the model name its vector is
stored under."""

from __future__ import annotations

from typing import Any

from worker.episodes.embedding import fact_text
from worker.user_memory.models import Fact


async def embed_texts(embedder: Any, texts: list[str]) -> list[list[float]]:
    """Vectors of ``texts`` from a LoomFlow embedder (``embed_batch``) or ours (``embed``)."""
    batch = getattr(embedder, "embed_batch", None)
    vectors = await (batch(texts) if callable(batch) else embedder.embed(texts))
    return [[float(x) for x in v] for v in vectors]


def model_name(embedder: Any) -> str:
    name = getattr(embedder, "name", None)
    return name if isinstance(name, str) and name else type(embedder).__qualname__


def triple_text(fact: Fact) -> str:
    return fact_text(fact.subject, fact.predicate, fact.object)
