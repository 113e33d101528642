"""What makes recall find the right turn of a long conversation (``worker.user_memory.recall``,
``turn_ranking``): the turn a question's words point at is often the reply after it; a query
about nothing stored gets LoomFlow's fallback, not the nearest unrelated turns; and a long
output is searchable by meaning to its end, not only its head."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from worker.db.vectors import CHUNK_TABLE
from worker.episodes.embedding import LocalEmbedder
from worker.episodes.indexer import Indexer
from worker.settings import Settings
from worker.user_memory.memory import Memory
from worker.user_memory.models import Episode

EXCERPT = Path(__file__).resolve().parent.parent / "data" / "conversation_excerpt.json"


async def remember_excerpt(memory: Memory, user: str) -> list[list[Episode]]:
    data = json.loads(EXCERPT.read_text())
    sessions = []
    for n, session in enumerate(data["sessions"]):
        at = datetime.fromisoformat(session["date"])
        turns = [
            Episode(
                id=f"{user}.s{n}.t{i}",
                session_id=f"{user}.s{n}",
                user_id=user,
                input=line,
                output="",
                occurred_at=at,
            )
            for i, line in enumerate(session["turns"])
        ]
        for turn in turns:
            await memory.remember(turn)
        sessions.append(turns)
    return sessions


async def test_the_reply_to_the_turn_a_question_names_is_found_first(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    async with Memory(
        "chat", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        sessions = await remember_excerpt(memory, "u1")
        await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
        for q in json.loads(EXCERPT.read_text())["questions"]:
            answer = sessions[q["session"]][q["turn"]]
            found = await memory.recall_scored(q["question"], user_id="u1", limit=q["within"])
            assert answer.id in [m.episode.id for m in found], q["question"]


async def test_a_query_about_nothing_stored_gets_the_recent_turns_with_score_zero(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    async with Memory(
        "chat", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        await remember_excerpt(memory, "u1")
        await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
        nothing = await memory.recall_scored("quantum chromodynamics lattice", user_id="u1")
        assert nothing and all(m.score == 0.0 and m.vector_score is None for m in nothing)
        newest = max(m.episode.occurred_at for m in nothing)
        assert newest == datetime.fromisoformat("2024-03-16T18:30:00+00:00")
        # the floor is a setting: with it off, the nearest vectors count again
        settings = vector_settings.model_copy(update={"recall_min_similarity": -1.0})
        async with Memory(
            "chat", settings=settings, embedder=embedder, engine=vector_engine, redis=redis
        ) as loose:
            near = await loose.recall_scored("quantum chromodynamics lattice", user_id="u1")
            assert near and all(m.score > 0 and m.vector_score is not None for m in near)


FILLER = "We talked about the weather and the traffic on the long drive home. " * 45
WEDDING = "My sister is getting married in a lighthouse by the sea next June."


async def test_a_long_outputs_end_is_found_by_meaning_and_forgotten_with_the_turn(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    turns = [
        Episode(
            session_id="s1", user_id="ann", input="How was your weekend?", output=FILLER + WEDDING
        ),
        Episode(
            session_id="s1",
            user_id="ann",
            input="Any plans for dinner?",
            output="Pasta with mushrooms.",
        ),
        Episode(
            session_id="s1",
            user_id="ann",
            input="How is work going?",
            output="The quarterly report is late.",
        ),
    ]
    assert len(FILLER) > 3000
    async with Memory(
        "long", settings=vector_settings, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        for turn in turns:
            await memory.remember(turn)
        await Indexer(vector_settings, redis, vector_engine, embedder).run_once()
        [best] = await memory.recall_scored(
            "Where will the wedding ceremony take place?", user_id="ann", limit=1, alpha=1.0
        )
        assert best.episode.id == turns[0].id
        assert best.vector_score is not None and best.vector_score >= 0.3
        await memory.forget(user_id="ann")
        async with vector_engine.connect() as conn:
            left = await conn.execute(text(f"SELECT count(*) FROM {CHUNK_TABLE}"))
            assert left.scalar_one() == 0


TWO_TURNS = [
    ("Ann: My dog Rex needs his vaccine shots next week.", "Noted."),
    ("Ann: I also want to plan a trip to Lisbon in May.", "Noted."),
]


async def test_in_a_two_turn_session_the_turn_a_query_names_comes_before_its_neighbour(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    """A neighbour lends a turn context, never its place: with only two turns in a session (and
    in the partition), each half's scale must not turn a small difference into all or nothing."""
    inline = vector_settings.model_copy(update={"remember_embedding": "inline"})
    async with Memory(
        "two", settings=inline, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        vet, trip = (
            Episode(session_id="s1", user_id="ann", input=i, output=o) for i, o in TWO_TURNS
        )
        await memory.remember(vet)
        await memory.remember(trip)
        asked = {
            "puppy immunisation appointment": vet,
            "When are Rex's vaccine shots?": vet,
            "holiday in Portugal": trip,
            "Where does Ann want to travel in May?": trip,
            "Lisbon trip": trip,
        }
        for query, named in asked.items():
            for alpha in (0.0, 0.5, 1.0):
                found = await memory.recall_scored(query, user_id="ann", limit=2, alpha=alpha)
                print(
                    query,
                    alpha,
                    [
                        (
                            m.episode.input[:12],
                            round(m.score, 3),
                            m.vector_score and round(m.vector_score, 3),
                            m.bm25_score,
                        )
                        for m in found
                    ],
                )
                if found and found[0].score > 0:
                    assert found[0].episode.id == named.id, (query, alpha)


HIKES = {  # the June turn says "hike" once, the others twice: by the words alone it is last
    datetime(2023, 4, 2, 15, tzinfo=UTC): "Ann: I went on a hike with my sister, a long hike!",
    datetime(2023, 6, 4, 15, tzinfo=UTC): "Ann: I went on a hike with my dad this morning.",
    datetime(2023, 8, 6, 15, tzinfo=UTC): "Ann: I went on a hike with my cousin, a great hike!",
}


async def test_a_question_naming_a_month_finds_the_turn_from_that_month_first(
    vector_engine: AsyncEngine, redis: Redis, vector_settings: Settings, embedder: LocalEmbedder
) -> None:
    """A turn rarely says its own date: "in June" is read as when the turn occurred."""
    inline = vector_settings.model_copy(update={"remember_embedding": "inline"})
    async with Memory(
        "months", settings=inline, embedder=embedder, engine=vector_engine, redis=redis
    ) as memory:
        ids = {}
        for n, (at, said) in enumerate(HIKES.items()):
            ann = Episode(session_id=f"s{n}", user_id="ann", input=said, output="", occurred_at=at)
            ids[at.month] = await memory.remember(ann)
        for alpha in (0.0, 0.5):
            for month, name in ((6, "June"), (8, "August 2023")):
                query = f"Who did Ann go on a hike with in {name}?"
                found = await memory.recall_scored(query, user_id="ann", limit=3, alpha=alpha)
                assert found[0].episode.id == ids[month], (query, alpha)
