"""Evidence recall on LoCoMo's long conversations, fed through ``worker.Memory`` as a user would.

    python bench/recall_locomo.py --data PATH/TO/locomo10.json [--split tuning|heldout|all] \\
        [--pgvector-url URL] [--redis-url URL]

The data is ``data/locomo10.json`` of the public repository snap-research/LoCoMo (not in this
repository: give its path). ``--split tuning`` (the default) takes conv-26, conv-30, conv-41,
conv-42 and conv-43, the conversations recall is tuned on; ``--split heldout`` the five held
back for judging (conv-44, conv-47, conv-48, conv-49, conv-50), to be run by whoever judges.

Each conversation is one user (its ``sample_id``); each of its sessions one ``session_id``; each
turn one ``Memory.remember(Episode(input="Speaker: text", output="", occurred_at=<the session's
date>))``, with `` [shares an image: <caption>]`` appended when the turn shares an image. Then
every turn is embedded (``memworker reindex``'s code: what the indexer does) and each question
of categories 1-4 is asked, ``recall_scored(question, user_id=<conversation>, limit=10)``.

R@k: the share of a question's evidence turns (its ``evidence`` dia_ids) found in the top k,
averaged over the questions, per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop)
and over all. Rankings, same run, same turns: ``recall_scored`` (default), its words half alone
(``alpha=0``), its vector half alone (``alpha=1``), BM25 (bm25s, English stemming, k1 1.5,
b 0.75, over the same turn texts, one index per conversation) and brute-force cosine with the
same embedder over the plain turn texts. Latency: each default ``recall_scored`` call, timed.

Servers: an embedded Valkey and an embedded PostgreSQL with pgvector, started for the run in a
temporary directory and removed after it, unless ``--redis-url`` / ``--pgvector-url`` are given
(then a database of its own is created and dropped on that server).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from harness import fresh_database, invocation, markdown_table, percentile
from recall_common import pgvector_server

from worker.episodes.embedding import LocalEmbedder
from worker.episodes.vectorising import reindex
from worker.ops.embedded import EmbeddedRedis
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

PROJECT = "locomo"
SPLITS = {
    "tuning": ("conv-26", "conv-30", "conv-41", "conv-42", "conv-43"),
    "heldout": ("conv-44", "conv-47", "conv-48", "conv-49", "conv-50"),
}
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
KS = (1, 5, 10)
LIMIT = 10


@dataclass
class Turn:
    dia_id: str
    session: int
    text: str
    occurred_at: datetime


@dataclass
class Question:
    text: str
    category: int
    evidence: set[str]


@dataclass
class Conversation:
    sample_id: str
    turns: list[Turn] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def session_date(value: str) -> datetime:
    """LoCoMo's ``"1:56 pm on 8 May, 2023"``."""
    return datetime.strptime(value.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def turn_text(turn: dict[str, Any]) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    caption = turn.get("blip_caption") or turn.get("img_caption")
    if caption:
        text += f" [shares an image: {caption}]"
    return text


def load(path: Path, split: str) -> list[Conversation]:
    wanted = None if split == "all" else set(SPLITS[split])
    conversations = []
    for sample in json.loads(path.read_text()):
        if wanted is not None and sample["sample_id"] not in wanted:
            continue
        conv = Conversation(sample["sample_id"])
        c = sample["conversation"]
        sessions = sorted(
            int(k.split("_")[1]) for k in c if re.fullmatch(r"session_\d+", k) and c[k]
        )
        for n in sessions:
            at = session_date(c[f"session_{n}_date_time"])
            conv.turns.extend(Turn(t["dia_id"], n, turn_text(t), at) for t in c[f"session_{n}"])
        known = {t.dia_id for t in conv.turns}
        for qa in sample["qa"]:
            if qa.get("category") not in CATEGORIES:
                continue
            evidence = {
                e for raw in qa.get("evidence", []) for e in re.split(r"[;,\s]+", raw) if e in known
            }
            if evidence:
                conv.questions.append(Question(str(qa["question"]), int(qa["category"]), evidence))
        conversations.append(conv)
    return conversations


def turn_id(conv: Conversation, dia_id: str) -> str:
    return f"{conv.sample_id}.{dia_id}"


def recall_at(found: Sequence[str], evidence: set[str], k: int) -> float:
    return len(evidence & set(found[:k])) / len(evidence)


class Scores:
    """R@k per ranking and category."""

    def __init__(self) -> None:
        self.hits: dict[str, dict[int, list[list[float]]]] = defaultdict(lambda: defaultdict(list))
        self.by_conversation: dict[tuple[str, str], list[list[float]]] = defaultdict(list)

    def add(
        self, ranking: str, question: Question, found: Sequence[str], conversation: str = ""
    ) -> None:
        hits = [recall_at(found, question.evidence, k) for k in KS]
        self.hits[ranking][question.category].append(hits)
        self.by_conversation[ranking, conversation].append(hits)

    def spread(self, ranking: str, conversation: str) -> list[str]:
        """R@k of one conversation's questions: how far the mean is from each part of it."""
        return [
            f"{m:.3f}" for m in np.mean(np.array(self.by_conversation[ranking, conversation]), 0)
        ]

    def row(self, ranking: str, category: int | None) -> list[str]:
        by = self.hits[ranking]
        rows = [r for c, rs in by.items() if category in (None, c) for r in rs]
        means = np.mean(np.array(rows), axis=0) if rows else [float("nan")] * len(KS)
        return [f"{m:.3f}" for m in means]


class Bm25Baseline:
    """bm25s over one conversation's turn texts (English stemmer, stop words)."""

    def __init__(self, texts: list[str]) -> None:
        import bm25s
        import Stemmer

        self.bm25s = bm25s
        self.stemmer = Stemmer.Stemmer("english")
        self.index = bm25s.BM25()
        corpus = bm25s.tokenize(texts, stopwords="en", stemmer=self.stemmer, show_progress=False)
        self.index.index(corpus, show_progress=False)
        self.size = len(texts)

    def top(self, query: str, k: int) -> list[int]:
        tokens = self.bm25s.tokenize(
            [query], stopwords="en", stemmer=self.stemmer, show_progress=False
        )
        if not tokens.ids[0]:
            return []
        docs, _scores = self.index.retrieve(tokens, k=min(k, self.size), show_progress=False)
        return [int(i) for i in docs[0]]


@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    scratch = Path(tempfile.mkdtemp(prefix="memworker-bench-valkey-"))
    server = EmbeddedRedis(scratch / "data")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


async def ingest(memory: Memory, conv: Conversation) -> None:
    for turn in conv.turns:
        await memory.remember(
            Episode(
                id=turn_id(conv, turn.dia_id),
                session_id=f"{conv.sample_id}.s{turn.session}",
                user_id=conv.sample_id,
                input=turn.text,
                output="",
                occurred_at=turn.occurred_at,
            )
        )


async def run(args: argparse.Namespace) -> str:
    conversations = load(Path(args.data), args.split)
    if not conversations:
        raise SystemExit(f"no conversation of split {args.split!r} in {args.data}")
    embedder = LocalEmbedder()
    embedder.load()
    scores = Scores()
    latencies: list[float] = []
    timings: dict[str, float] = {}
    with redis_server(args.redis_url) as redis_url, pgvector_server(args.pgvector_url) as pg:
        async with fresh_database(pg) as url:
            settings = Settings(redis_url=redis_url, database_url=url, stream_prefix="locomo")
            async with Memory(PROJECT, settings=settings, embedder=embedder) as memory:
                started = time.perf_counter()
                for conv in conversations:
                    await ingest(memory, conv)
                timings["remember"] = time.perf_counter() - started
                started = time.perf_counter()
                await reindex(memory.engine, embedder, project_id=PROJECT)
                timings["embed"] = time.perf_counter() - started
                for conv in conversations:
                    ours = {turn_id(conv, t.dia_id): t.dia_id for t in conv.turns}
                    for q in conv.questions:  # warm-up: the query path, caches, the model
                        await memory.recall_scored(q.text, user_id=conv.sample_id, limit=LIMIT)
                        break
                    for name, alpha in (("default", None), ("words", 0.0), ("vector", 1.0)):
                        for q in conv.questions:
                            started = time.perf_counter()
                            if alpha is None:
                                matches = await memory.recall_scored(
                                    q.text, user_id=conv.sample_id, limit=LIMIT
                                )
                                latencies.append(time.perf_counter() - started)
                            else:
                                matches = await memory.recall_scored(
                                    q.text, user_id=conv.sample_id, limit=LIMIT, alpha=alpha
                                )
                            found = [ours.get(m.episode.id, "") for m in matches]
                            scores.add(name, q, found, conv.sample_id)
                    texts = [t.text for t in conv.turns]
                    bm25 = Bm25Baseline(texts)
                    turn_vectors = np.array(await embedder.embed(texts))
                    query_vectors = np.array(await embedder.embed([q.text for q in conv.questions]))
                    for q, qv in zip(conv.questions, query_vectors, strict=True):
                        scores.add(
                            "bm25", q, [conv.turns[i].dia_id for i in bm25.top(q.text, LIMIT)]
                        )
                        order = np.argsort(-(turn_vectors @ qv), kind="stable")[:LIMIT]
                        scores.add("cosine", q, [conv.turns[int(i)].dia_id for i in order])
    names = {
        "default": "`recall_scored` (default)",
        "words": "its words half alone (`alpha=0`)",
        "vector": "its vector half alone (`alpha=1`)",
        "bm25": "BM25 (bm25s, stemmed)",
        "cosine": "brute-force cosine, same embedder",
    }
    turns = sum(len(c.turns) for c in conversations)
    questions = sum(len(c.questions) for c in conversations)
    lines = [
        f"`{invocation()}`",
        "",
        f"split {args.split}: {len(conversations)} conversations, {turns} turns,"
        f" {questions} questions of categories 1-4; remember {timings['remember']:.1f} s,"
        f" embedding every turn {timings['embed']:.1f} s",
        "",
    ]
    header = ["ranking, same run, same turns", "R@1", "R@5", "R@10"]
    for category in (None, *CATEGORIES):
        title = (
            "all categories"
            if category is None
            else f"category {category} ({CATEGORIES[category]})"
        )
        count = sum(1 for c in conversations for q in c.questions if category in (None, q.category))
        lines.append(f"**{title}**, {count} questions")
        lines.append("")
        lines.append(
            markdown_table(header, [[names[n], *scores.row(n, category)] for n in names], "lrrr")
        )
        lines.append("")
    lines.append("**per conversation**, `recall_scored` (default) R@1 / R@5 / R@10")
    lines.append("")
    lines.append(
        markdown_table(
            ["conversation", "questions", "R@1", "R@5", "R@10"],
            [
                [c.sample_id, str(len(c.questions)), *scores.spread("default", c.sample_id)]
                for c in conversations
            ],
            "lrrrr",
        )
    )
    lines.append("")
    lines.append(
        f"`recall_scored` latency (default, limit {LIMIT}, {len(latencies)} calls):"
        f" p50 {percentile(latencies, 50) * 1000:.1f} ms,"
        f" p99 {percentile(latencies, 99) * 1000:.1f} ms"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="LoCoMo's locomo10.json")
    parser.add_argument("--split", choices=(*SPLITS, "all"), default="tuning")
    parser.add_argument("--redis-url", help="default: an embedded Valkey for the run")
    parser.add_argument("--pgvector-url", help="default: an embedded PostgreSQL for the run")
    args = parser.parse_args()
    print(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
