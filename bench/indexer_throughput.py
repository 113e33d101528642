"""Indexer episodes/s per embedding runtime, the raw embed rate, the model's compute floor on
this machine, and consolidation episodes/s before and after the indexer runs.

    python bench/indexer_throughput.py --redis-url redis://127.0.0.1:6379/0 \\
        [--pgvector-url URL] --episodes 3000 --rounds 2 [--runtimes onnx torch]

- **raw embed**: ``LocalEmbedder(runtime=…).embed_sync`` on 512 episode texts (those the indexer
  embeds for ``bench/consolidation_throughput.py``'s results), best and median of 5, nothing
  else running; also the texts as they were embedded before #25 (the summary's head with its
  ``Task:`` and ``Lessons:`` lines, so the task and lessons twice).
- **indexer**: episodes/s of ``Indexer.run_once`` draining a round's announcements end to end
  (read the announcements, read the episodes from Postgres, embed, upsert the vectors), on a
  fresh database with pgvector (the embedded pgserver unless ``--pgvector-url``), per runtime.
- **floor**: the multiply-adds one episode costs in this model (6 layers, hidden 384, feed
  forward 1,536, at the padded token count the embedder runs) over the rate ONNX Runtime reaches
  on one large matrix product of the model's shape on this machine (int8 for the quantised
  products, float for the three kept in float). No implementation of the model that does every
  product can beat it; the ratio says how close the embedder comes.
- **consolidation before/after**: the Consolidator drains ``--episodes`` prefilled results
  alone, then again while ``memworker index`` (a subprocess, default runtime) embeds what it
  announces; rounds alternate so both see the same (noisy, shared) machine.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from consolidation_throughput import prefill, terminated_result
from harness import DEFAULT_REDIS_URL, cleanup, fresh_database, markdown_table
from recall_common import pgvector_server
from redis.asyncio import Redis
from sqlalchemy import text

from worker.consolidation.consolidator import Consolidator
from worker.consolidation.results import ParsedResult, episode_row, parse_result
from worker.consumers.loop import StreamEntry
from worker.db.engine import create_database_engine
from worker.episodes.embedding import SUMMARY_CHARS, LocalEmbedder, Runtime, episode_text
from worker.episodes.indexer import Indexer
from worker.episodes.onnx_model import FLOAT_NODES, batches
from worker.keys import StreamKeys
from worker.settings import Settings

LAYERS, HIDDEN, FFN = 6, 384, 1_536


class TimedEmbedder(LocalEmbedder):
    """``LocalEmbedder`` counting the seconds spent embedding (the indexer's share of them)."""

    seconds = 0.0

    def embed_sync(self, texts: Sequence[str]) -> list[list[float]]:
        started = time.perf_counter()
        try:
            return super().embed_sync(texts)
        finally:
            self.seconds += time.perf_counter() - started


def bench_texts(count: int, *, repeated: bool = False) -> list[str]:
    """What the indexer embeds for the prefilled results (``repeated``: the former recipe)."""
    settings = Settings()
    out = []
    for i in range(count):
        payload = orjson.loads(orjson.dumps(terminated_result(i)))
        parsed = ParsedResult(StreamEntry("s", "0-1", {}), payload, parse_result(payload))
        row = episode_row(parsed, settings.context_summary_max_chars)
        task, lessons, summary = (
            row["task_description"],
            row["lessons_learned"],
            row["context_summary"],
        )
        if repeated:
            out.append("\n".join([task, *lessons, summary[:SUMMARY_CHARS]]))
        else:
            out.append(episode_text(task, lessons, summary))
    return out


def raw_rates(embedder: LocalEmbedder, texts: list[str], repeats: int = 5) -> list[float]:
    embedder.embed_sync(texts[:64])  # warm
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        embedder.embed_sync(texts)
        rates.append(len(texts) / (time.perf_counter() - started))
    return rates


def padded_lengths(texts: list[str]) -> list[int]:
    """Tokens per text as the ONNX embedder runs them (padded to its batch's longest)."""
    from tokenizers import Tokenizer

    from worker.episodes.onnx_model import MAX_TOKENS, weights_dir

    tokenizer = Tokenizer.from_file(str(weights_dir() / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.no_padding()
    lengths = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    out = [0] * len(texts)
    for rows in batches(lengths):
        for i in rows:
            out[i] = max(lengths[j] for j in rows)
    return out


def gemm_rate(m: int, quantised: bool, repeats: int = 20) -> float:
    """Multiply-adds/s of ONNX Runtime on [m, 384] x [384, 1536] (the feed-forward shape)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from worker.episodes.onnx_model import session

    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((HIDDEN, FFN)).astype(np.float32) * 0.05, "w"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, FFN])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.onnx"
        onnx.save(model, str(path))
        if quantised:
            logging.getLogger().setLevel(logging.ERROR)  # "consider pre-processing": no need
            quantize_dynamic(str(path), str(Path(tmp) / "q.onnx"), weight_type=QuantType.QInt8)
            path = Path(tmp) / "q.onnx"
        run = session(path)
    x = np.random.default_rng(1).standard_normal((m, HIDDEN)).astype(np.float32)
    run.run(None, {"x": x})
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run.run(None, {"x": x})
        best = min(best, time.perf_counter() - started)
    return m * HIDDEN * FFN / best


def floor(texts: list[str]) -> dict[str, Any]:
    """Multiply-adds per episode, and the episodes/s they allow at the measured GEMM rates."""
    lengths = padded_lengths(texts)
    tokens = statistics.fmean(lengths)
    per_layer = 4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN  # q, k, v, out; two feed-forward
    float_macs = len(FLOAT_NODES) * HIDDEN * FFN * tokens
    int8_macs = LAYERS * per_layer * tokens - float_macs
    attention = LAYERS * 2 * HIDDEN * statistics.fmean(n * n for n in lengths)  # QK^T and AV
    int8_rate, float_rate = gemm_rate(2_880, True), gemm_rate(2_880, False)
    seconds = int8_macs / int8_rate + (float_macs + attention) / float_rate
    return {
        "tokens": tokens,
        "gmacs": (int8_macs + float_macs + attention) / 1e9,
        "int8": int8_rate / 1e9,
        "float": float_rate / 1e9,
        "episodes_s": 1 / seconds,
    }


async def vectors(url: str) -> int:
    engine = create_database_engine(url, pool=False)
    try:
        async with engine.connect() as conn:
            return int(
                (await conn.execute(text("SELECT count(*) FROM episode_embeddings"))).scalar_one()
            )
    finally:
        await engine.dispose()


async def one_round(
    args: argparse.Namespace, redis: Redis, server: str, embedder: TimedEmbedder | None
) -> tuple[float, float | None]:
    """Consolidation episodes/s, then the indexer's (``embedder``) or, without one, with
    ``memworker index`` running alongside the consolidation."""
    async with fresh_database(server) as url:
        prefix = "bench" + uuid.uuid4().hex[:8]
        settings = Settings(redis_url=args.redis_url, database_url=url, stream_prefix=prefix)
        engine = create_database_engine(url)
        indexer_process = None
        try:
            await prefill(redis, StreamKeys(prefix, 0).results, args.episodes)
            if embedder is None:
                env = dict(
                    os.environ,
                    REDIS_URL=args.redis_url,
                    DATABASE_URL=url,
                    MEMWORKER_STREAM_PREFIX=prefix,
                    MEMWORKER_LOG_LEVEL="WARNING",
                )
                indexer_process = subprocess.Popen(
                    [sys.executable, "-m", "worker.cli", "index"], env=env
                )
                await asyncio.sleep(8)  # the model is loaded before the clock starts
            started = time.perf_counter()
            done = await Consolidator(settings, redis, engine).run_once()
            consolidation = done / (time.perf_counter() - started)
            if embedder is None:
                return consolidation, None
            indexer = Indexer(settings, redis, engine, embedder)
            started = time.perf_counter()
            await indexer.run_once()
            indexed = await vectors(url)
            assert indexed == args.episodes, (indexed, args.episodes)
            return consolidation, indexed / (time.perf_counter() - started)
        finally:
            if indexer_process is not None:
                indexer_process.terminate()
                indexer_process.wait()
            await engine.dispose()
            await cleanup(redis, prefix)


def cell(rates: list[float]) -> str:
    spread = f" ({min(rates):,.0f}–{max(rates):,.0f})" if len(rates) > 1 else ""
    return f"**{statistics.median(rates):,.0f}**{spread}"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--database-url", help="ignored: needs pgvector (--pgvector-url)")
    parser.add_argument("--pgvector-url")
    parser.add_argument("--episodes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runtimes", nargs="+", default=["onnx", "torch"])
    args = parser.parse_args()
    runtimes: list[Runtime] = args.runtimes
    # as the indexer builds its own (embedder_from_settings(..., batches=True))
    embedders = {runtime: TimedEmbedder(runtime=runtime, spinning=False) for runtime in runtimes}
    for embedder in embedders.values():
        embedder.load()
    texts, repeated = bench_texts(512), bench_texts(512, repeated=True)
    raw = {r: (raw_rates(e, texts), raw_rates(e, repeated)) for r, e in embedders.items()}
    bound = floor(texts) if "onnx" in embedders else None

    redis = Redis.from_url(args.redis_url)
    before: list[float] = []
    after: list[float] = []
    indexer: dict[str, list[float]] = {r: [] for r in runtimes}
    embedding = {r: 0.0 for r in runtimes}  # seconds inside the indexer's rounds
    try:
        with pgvector_server(args.pgvector_url) as server:
            for _ in range(args.rounds):
                for runtime, embedder in embedders.items():
                    spent = embedder.seconds
                    consolidation, indexed = await one_round(args, redis, server, embedder)
                    embedding[runtime] += embedder.seconds - spent
                    before.append(consolidation)
                    assert indexed is not None
                    indexer[runtime].append(indexed)
                consolidation, _ = await one_round(args, redis, server, None)
                after.append(consolidation)
    finally:
        await redis.aclose()

    print(f"{args.episodes:,} episodes a run, {args.rounds} rounds; median (min–max).")
    print()
    rows = []
    for runtime in runtimes:
        label = "ONNX Runtime, int8" if runtime == "onnx" else "sentence-transformers + torch"
        mine, former = raw[runtime]
        total = sum(args.episodes / rate for rate in indexer[runtime])
        inside = args.episodes * args.rounds / embedding[runtime]
        rows.append(
            [
                f"`{runtime}`: {label}",
                cell(indexer[runtime]),
                f"{embedding[runtime] / total:.0%} ({inside:,.0f}/s)",
                f"{max(mine):,.0f} / {statistics.median(mine):,.0f}",
                f"{max(former):,.0f} / {statistics.median(former):,.0f}",
            ]
        )
    header = [
        "local all-MiniLM-L6-v2 runtime",
        "indexer, end to end (episodes/s)",
        "of its time embedding, overlapping the writes (episodes/s there)",
        "raw embed, best / median (episodes/s)",
        "raw embed, former text (task and lessons twice)",
    ]
    print(markdown_table(header, rows, "lrrrr"))
    if bound is not None:
        best = max(raw["onnx"][0])
        print()
        print(
            f"Floor (`onnx`): {bound['tokens']:.1f} tokens per episode as run (padded),"
            f" {bound['gmacs']:.2f} G multiply-adds each; ONNX Runtime reaches"
            f" {bound['int8']:,.0f} G int8 and {bound['float']:,.0f} G float multiply-adds/s"
            f" on a [2,880 × 384] × [384 × 1,536] product here: at most"
            f" **{bound['episodes_s']:,.0f} episodes/s**. Raw embed best {best:,.0f}/s ="
            f" **{best / bound['episodes_s']:.2f}** of the floor."
        )
    print()
    rows = [
        ["consolidation, indexer not running (before)", cell(before)],
        ["consolidation, `memworker index` running alongside (after)", cell(after)],
    ]
    print(markdown_table(["run", "episodes/s"], rows, "lr"))
    ratio = statistics.median(after) / statistics.median(before)
    print()
    print(f"Consolidation after / before: {ratio:.2f}.")


if __name__ == "__main__":
    asyncio.run(main())
