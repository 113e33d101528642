"""How a user's turns are ranked (``worker.user_memory.turn_ranking``) and how a long output is
split for embedding (``worker.episodes.embedding.output_chunks``), without a server."""

from __future__ import annotations

from datetime import UTC, datetime

from worker.episodes.embedding import CHUNK_CHARS, MAX_CHUNKS, SUMMARY_CHARS, output_chunks
from worker.user_memory.turn_ranking import Turn, lexeme_counts, named_times, rank, speaker_of


def test_lexeme_counts_reads_positions_and_skips_a_lexeme_inside_another() -> None:
    vector = "'carolin':1A,5,9 'go':3A 'o''brien':2 'xgroup':7 'group':8"
    counts = lexeme_counts(vector, {"carolin", "o'brien", "group", "absent"})
    assert counts == {"carolin": 3, "o'brien": 1, "group": 1}


def test_a_rare_word_outranks_a_common_one() -> None:
    turns = {f"c{i}": Turn(f"c{i}", counts={"walk": 1}, length=6) for i in range(20)}
    turns["rare"] = Turn("rare", counts={"greyhound": 1}, length=6)
    scores, bm25 = rank(turns, "walk greyhound", alpha=0.0, total=40, lexemes=["walk", "greyhound"])
    assert max(scores, key=scores.__getitem__) == "rare"
    assert bm25["rare"] > bm25["c0"] > 0


def test_the_reply_after_a_matching_turn_gains_from_it_and_the_named_speaker_counts() -> None:
    turns = {
        "ask": Turn(
            "ask", session="s", counts={"adopt": 1}, length=8, speaker="maya", after="reply"
        ),
        "reply": Turn("reply", session="s", length=8, speaker="jonas", before="ask"),
        "far": Turn("far", session="t", length=8, speaker="maya"),
    }
    scores, _ = rank(turns, "What did Jonas adopt?", alpha=0.0, total=3, lexemes=["adopt"])
    assert scores["reply"] > 0 and "far" not in scores  # context, and nothing for an unrelated turn
    alone = dict(turns, reply=Turn("reply", session="s", length=8, speaker="maya", before="ask"))
    unnamed, _ = rank(alone, "What did Jonas adopt?", alpha=0.0, total=3, lexemes=["adopt"])
    assert scores["reply"] > unnamed["reply"]  # Jonas said it and the question names him


def test_speaker_of_reads_a_leading_name() -> None:
    assert speaker_of("Caroline: hi there") == "caroline"
    assert speaker_of("Mary Ann: hello") == "mary ann"
    assert speaker_of("note: lower case is not a speaker") is None
    assert speaker_of(None) is None


def test_a_long_output_is_split_to_its_end_and_a_short_one_not_at_all() -> None:
    assert output_chunks("short answer") == []
    assert output_chunks("x" * SUMMARY_CHARS) == []
    text = "".join(f"{i:05d} " for i in range(600))  # 3,600 characters, every piece unique
    chunks = output_chunks(text)
    assert all(len(c) <= CHUNK_CHARS for c in chunks)
    assert chunks[0] == text[:CHUNK_CHARS] and text.endswith(chunks[-1])
    assert all(any(f"{i:05d}" in c for c in chunks) for i in range(600))  # none is lost
    assert len(output_chunks("y" * (CHUNK_CHARS * MAX_CHUNKS * 2))) == MAX_CHUNKS


def test_in_a_two_turn_session_a_neighbour_closer_by_a_hair_does_not_outrank_the_match() -> None:
    """The reply's vector reads the turn before it, so its cosine can sit a hair above the
    turn the query's words name; with two turns considered, each half's scale must keep that
    hair a hair (min-max made it all or nothing and the reply came first)."""
    turns = {
        "named": Turn(
            "named", session="s", counts={"vaccin": 1}, length=6, cosine=0.55, after="reply"
        ),
        "reply": Turn("reply", session="s", length=5, cosine=0.60, before="named"),
    }
    for alpha in (0.25, 0.5, 0.75):
        scores, _ = rank(turns, "Rex's vaccine?", alpha=alpha, total=2, lexemes=["vaccin"])
        assert scores["named"] > scores["reply"] > 0, alpha


def test_a_second_models_cosines_lift_the_turn_it_finds_closer_and_absent_change_nothing() -> None:
    """Two turns the words and the first model cannot tell apart: the second model's cosine
    decides; without second cosines the ranking is the one before it."""
    turns = {
        "a": Turn("a", counts={"trip": 1}, length=6, cosine=0.5),
        "b": Turn("b", counts={"trip": 1}, length=6, cosine=0.5),
    }
    plain, _ = rank(turns, "the trip", alpha=0.5, total=10, lexemes=["trip"], floor=0.2)
    assert plain["a"] == plain["b"]
    turns["a"].second, turns["b"].second = 0.78, 0.86
    scores, _ = rank(turns, "the trip", alpha=0.5, total=10, lexemes=["trip"], floor=0.2)
    assert scores["b"] > scores["a"] == plain["a"]
    words, _ = rank(turns, "the trip", alpha=0.0, total=10, lexemes=["trip"], floor=0.2)
    assert words["a"] == words["b"]  # alpha 0: words only, the second model too is left out


def test_a_query_naming_a_month_or_a_year_reads_them_and_nothing_else() -> None:
    none: set[int] = set()
    assert named_times("When did Ann go camping in June?") == ({6}, none)
    assert named_times("Where was John between August 11 and August 15 2023?") == ({8}, {2023})
    assert named_times("May I ask what Tim did in May, 2022?") == ({5}, {2022})  # not the first
    assert named_times("What did Ann say about 20231 or the june fair?") == (none, none)


def test_a_turn_from_the_month_the_query_names_outranks_a_closer_match_from_another() -> None:
    june, april = datetime(2023, 6, 3, tzinfo=UTC), datetime(2023, 4, 3, tzinfo=UTC)
    turns = {
        "april": Turn("april", counts={"hike": 2, "ann": 1}, length=8, at=april),
        "june": Turn("june", counts={"hike": 1, "ann": 1}, length=8, at=june),
        "undated": Turn("undated", counts={"hike": 2, "ann": 1}, length=8),
    }

    def ranked(query: str) -> dict[str, float]:
        return rank(turns, query, alpha=0.0, total=30, lexemes=["hike", "ann"])[0]

    plain = ranked("Who did Ann hike with?")
    assert plain["april"] > plain["june"]
    dated = ranked("Who did Ann hike with in June?")
    assert max(dated, key=dated.__getitem__) == "june"
    assert ranked("Who did Ann hike with in June 2022?") == plain  # no turn occurred then


def test_the_echo_of_the_best_turns_lifts_a_turn_like_them() -> None:
    """Two turns alike for the words and the query's vector: the one nearer the first ranking's
    best turns (``Turn.echo``) comes first, and only when the meaning counts."""
    turns = {
        "near": Turn("near", counts={"adopt": 1}, length=8, cosine=0.5, echo=0.9),
        "far": Turn("far", counts={"adopt": 1}, length=8, cosine=0.5, echo=0.5),
        "closest": Turn("closest", length=8, cosine=0.8),
    }

    def ranked(alpha: float) -> dict[str, float]:
        return rank(turns, "What did Maya adopt?", alpha=alpha, total=30, lexemes=["adopt"])[0]

    assert ranked(0.5)["near"] > ranked(0.5)["far"]
    assert ranked(0.0)["near"] == ranked(0.0)["far"]
