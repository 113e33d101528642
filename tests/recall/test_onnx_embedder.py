"""The local embedder's ONNX Runtime path against sentence-transformers + torch, on the real
weights: same vectors (cosine > 0.99), recall on the labeled set at least as good, the file
built offline from the installed weights, and the fallback to torch when it cannot run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.recall_set import load_recall_set
from worker.episodes.embedding import EmbeddingError, LocalEmbedder, TorchEmbedder
from worker.episodes.onnx_model import OnnxEmbedder, OnnxModelError, ensure_built, onnx_path


@pytest.fixture(scope="module")
def torch_embedder() -> LocalEmbedder:
    embedder = LocalEmbedder(runtime="torch")
    embedder.load()
    return embedder


@pytest.fixture(scope="module")
def onnx_embedder() -> LocalEmbedder:
    embedder = LocalEmbedder(runtime="onnx")
    embedder.load()
    return embedder


def labeled_texts() -> tuple[list[str], list[str], list[int]]:
    episodes, queries = load_recall_set()
    keys = [e.key for e in episodes]
    docs = ["\n".join([e.task, *e.lessons]) for e in episodes]
    return docs, [q.query for q in queries], [keys.index(q.expect) for q in queries]


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def hits_at(embedder: LocalEmbedder, k: int) -> int:
    docs, queries, expected = labeled_texts()
    doc_vectors = embedder.embed_sync(docs)
    found = 0
    for vector, want in zip(embedder.embed_sync(queries), expected, strict=True):
        ranked = sorted(range(len(docs)), key=lambda i: -dot(vector, doc_vectors[i]))
        found += want in ranked[:k]
    return found


def test_onnx_vectors_are_torchs_within_cosine_0_99(
    torch_embedder: LocalEmbedder, onnx_embedder: LocalEmbedder
) -> None:
    assert isinstance(onnx_embedder.backend, OnnxEmbedder)
    assert isinstance(torch_embedder.backend, TorchEmbedder)
    assert onnx_embedder.name == torch_embedder.name  # so vectors of either are compared
    docs, queries, _ = labeled_texts()
    summary = "Outcome: failure\nTask state: step 4/6, status in_progress, progress 66%"
    texts = [*docs, *queries, *(f"{d}\n{summary}" for d in docs), " ".join(docs)]  # 1 long
    for mine, theirs in zip(
        onnx_embedder.embed_sync(texts), torch_embedder.embed_sync(texts), strict=True
    ):
        assert len(mine) == 384
        assert abs(dot(mine, mine) - 1.0) < 1e-5
        assert dot(mine, theirs) > 0.99
    for query, theirs in zip(queries, torch_embedder.embed_sync(queries), strict=True):
        [alone] = onnx_embedder.embed_sync([query])  # as recall embeds a query
        assert dot(alone, theirs) > 0.99


def test_the_labeled_set_is_recalled_at_least_as_well_as_with_torch(
    torch_embedder: LocalEmbedder, onnx_embedder: LocalEmbedder
) -> None:
    for k in (1, 3):
        assert hits_at(onnx_embedder, k) >= hits_at(torch_embedder, k), k
    assert hits_at(onnx_embedder, 3) == len(labeled_texts()[1])


def test_texts_of_any_length_come_back_in_their_order(onnx_embedder: LocalEmbedder) -> None:
    """In their order, whatever batches their lengths put them in. Int8 activations are scaled
    per batch, so a text's vector moves a little with its batch-mates (cosine > 0.985: 0.9888
    with onnxruntime 1.32's quantizer for the longest text here, > 0.99 with earlier ones; 0.98
    for a one-letter text). Each text is still nearest to itself."""
    docs, queries, _ = labeled_texts()
    texts = [" ".join(docs) * 2, *docs[:5], "Fix the login bug", " ".join(queries[:6])]
    together = onnx_embedder.embed_sync(texts)
    for i, text in enumerate(texts):
        [alone] = onnx_embedder.embed_sync([text])
        similarity = [dot(alone, vector) for vector in together]
        assert similarity[i] > 0.985
        assert max(range(len(texts)), key=similarity.__getitem__) == i
    assert onnx_embedder.embed_sync([]) == []


def test_the_file_is_built_offline_from_the_installed_weights_once(tmp_path: Path) -> None:
    started = time.perf_counter()
    path = ensure_built(tmp_path)
    assert time.perf_counter() - started < 30
    assert path == onnx_path(tmp_path)
    assert 10e6 < path.stat().st_size < 40e6  # int8 weights: about a third of the float file
    built = path.stat().st_mtime_ns
    assert ensure_built(tmp_path) == path and path.stat().st_mtime_ns == built
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no build leftovers
    fresh = OnnxEmbedder(model_dir=tmp_path)
    [vector] = fresh.embed_sync(["users cannot sign in"])
    assert len(vector) == 384


def test_without_onnxruntime_the_local_embedder_falls_back_to_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    fallback = LocalEmbedder(model_dir=tmp_path)
    [vector] = fallback.embed_sync(["users cannot sign in"])
    assert isinstance(fallback.backend, TorchEmbedder)
    assert len(vector) == 384
    assert "embedding with torch" in caplog.text
    with pytest.raises(EmbeddingError, match="ONNX runtime cannot embed"):
        LocalEmbedder(runtime="onnx", model_dir=tmp_path).load()


def test_a_damaged_file_is_named_and_auto_falls_back(tmp_path: Path) -> None:
    onnx_path(tmp_path).write_bytes(b"not an onnx model")
    with pytest.raises(OnnxModelError, match="does not load"):
        OnnxEmbedder(model_dir=tmp_path).load()
    assert isinstance(LocalEmbedder(model_dir=tmp_path).backend, TorchEmbedder)
