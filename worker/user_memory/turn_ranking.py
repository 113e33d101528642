"""How ``recall_scored`` ranks a user's turns: BM25 over the words, the cosine of the meaning, a
turn's neighbours in its session, and the speaker a query names (pure functions, no server).

Measured on LoCoMo's tuning conversations (``bench/recall_locomo.py``, BENCHMARKS.md):

- **Words** are scored by BM25 (Robertson et al.) over the turns matching any word of the query
  (the lexemes and their counts Postgres' ``search_vector`` holds; a turn's length is its
  number of distinct lexemes): ``k1`` 0.6 and ``b`` 0.3, a lighter length penalty than the
  usual 1.2-1.5 / 0.75 (turns are short, and a long one is not less about its words). A turn
  is also scored **with its neighbours** (the turns before and after it in its session, their
  counts summed; ``WINDOW_WEIGHT``): a question's answer is often the reply to the turn that
  shares its words.
- **Meaning** is the cosine of the query's vector and the turn's, scaled over the turns
  considered so the closest counts 1 and the relevance floor (or a farther turn) 0 (the
  cosines of one model crowd a narrow band: raw, they would swamp or vanish beside the
  words). The floor, not the farthest turn considered, is the zero: with a few turns
  considered (a two-turn session) min-max made a hair's difference all or nothing.
- The halves are summed, each scaled to its best turn, the words weighted ``1 - alpha`` and
  the meaning ``alpha × VECTOR_WEIGHT`` (``alpha``: LoomFlow's, 0 words only, 1 meaning
  only), the meaning less when its best cosine is weak (``CONFIDENT_COSINE``). A weighted sum
  of scaled scores beat reciprocal rank fusion, which let the weak half push the strong
  half's first places down.
- **Context**: a turn gains a share (``NEIGHBOUR_SHARE``) of its best neighbour's score.
- **Speaker**: a turn said by someone the query names (``"Caroline: ..."`` and a question
  about Caroline) is scaled up by ``1 + SPEAKER_BOOST``.
- **Echo** (pseudo-relevance feedback, Rocchio's): the first ranking's best ``ECHO_TURNS``
  turns stand for what the query is about; a turn's cosine with the query's vector plus the
  mean of theirs (read for the context sessions' turns, of a turn's whole vector, not a long
  output's chunks: ``Turn.echo``) is a second meaning half, scaled from the relevance floor
  as the first (min-max over a few turns made it all or nothing), weighted ``alpha ×
  ECHO_WEIGHT``: the query's own vector is a question's, theirs are turns'.
- **When**: a query that names a month (``"in June"``, capitalised, in full) or a year
  (``"2023"``) scales up by ``1 + TIME_BOOST`` the turns that occurred then (``occurred_at``,
  UTC: in one of the months named, and in one of the years named; a month alone matches it
  in any year). The words cannot find it: a turn rarely says its own date.

The constants were chosen on those five conversations only (each lever's gain: BENCHMARKS.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

K1 = 0.6
B = 0.3
WINDOW_WEIGHT = 1.5
"""Of a turn's BM25 with its neighbours, beside its own (each scaled to its best)."""
NEIGHBOUR_SHARE = 0.4
"""Of the best neighbour's score a turn gains."""
SPEAKER_BOOST = 0.5
CONFIDENT_COSINE = 0.8
"""The meaning half counts fully only when its best cosine reaches this; below, in proportion
(a query whose nearest turn is at 0.35 is one the model is unsure of)."""
VECTOR_WEIGHT = 0.6
"""Of the meaning half beside the words half at ``alpha`` 0.5."""
ECHO_TURNS = 3
"""How many of the first ranking's best turns the echo's mean is of (module doc)."""
ECHO_WEIGHT = 0.6
"""Of the echo half (module doc). Replayed over the candidates of a LoCoMo tuning run
(BENCHMARKS.md): 3 turns, weight 0.3 / 0.6: R@10 .784 / .785 against .778 without; 5 or 10
turns were no better; with ``TIME_BOOST``, .803."""
TIME_BOOST = 1.0
"""Of a turn that occurred in the month or year the query names (module doc). Replayed over
the candidates of a LoCoMo tuning run (BENCHMARKS.md): 0.2 / 0.5 / 1.0 / 1.5 gave R@10 .786 /
.791 / .793 / .797 against .778 without; at 1.5 open-domain R@1 fell."""
SECOND_WEIGHT = 0.8
"""Of a second model's meaning half (``Turn.second``, min-max scaled over the turns
considered), beside the first's, when a second model's cosines are there. Replayed over the
candidates of a LoCoMo tuning run with multilingual-e5-small's cosines (BENCHMARKS.md):
0.4 / 0.6 / 0.8 / 1.2 gave R@5 .725 / .725 / .728 / .727; at 1.2 temporal R@1 fell below the
words half. ``recall_scored`` does not fill ``Turn.second`` yet: no second model is wired."""

_SPEAKER = re.compile(r"^\s*([A-Z][\w'.-]*(?: [A-Z][\w'.-]*){0,2}):\s")
_WORD = re.compile(r"[A-Za-z][\w'-]*")
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_WHEN = re.compile(r"(?<![\w-])(?:(" + "|".join(_MONTHS) + r")|((?:19|20)\d\d))(?![\w-])")


def lexeme_counts(tsvector: str, wanted: set[str]) -> dict[str, int]:
    """Of a ``tsvector``'s text (``'word':1,5B 'other':3``): how often each ``wanted`` lexeme
    occurs (its positions; one without positions counts one)."""
    counts: dict[str, int] = {}
    for lexeme in wanted:
        quoted = "'" + lexeme.replace("'", "''") + "'"
        at = tsvector.find(quoted)
        while at > 0 and tsvector[at - 1] != " ":  # inside another lexeme: look further
            at = tsvector.find(quoted, at + 1)
        if at < 0:
            continue
        end = at + len(quoted)
        if tsvector.startswith(":", end):
            stop = tsvector.find(" ", end)
            counts[lexeme] = tsvector.count(",", end, len(tsvector) if stop < 0 else stop) + 1
        else:
            counts[lexeme] = 1
    return counts


def tsvector_counts(tsvector: str | None) -> dict[str, int]:
    """Every lexeme of a ``tsvector``'s text (Postgres' output: ``'word':1,5B 'it''s':3``, a
    quote and a backslash doubled) and its count of positions (one without positions counts
    one), in the text's order: ``unnest``'s, so a BM25 sums its terms in the same order."""
    counts: dict[str, int] = {}
    if not tsvector:
        return counts
    at, end = 0, len(tsvector)
    while at < end:
        close = tsvector.find("'", at + 1)
        while tsvector.startswith("'", close + 1):  # a doubled quote, inside the lexeme
            close = tsvector.find("'", close + 2)
        lexeme = tsvector[at + 1 : close]
        if "'" in lexeme or "\\" in lexeme:
            lexeme = lexeme.replace("''", "'").replace("\\\\", "\\")
        if tsvector.startswith(":", close + 1):
            stop = tsvector.find(" ", close + 2)
            stop = end if stop < 0 else stop
            counts[lexeme] = tsvector.count(",", close + 2, stop) + 1
        else:
            counts[lexeme], stop = 1, close + 1
        at = stop + 1
    return counts


@dataclass(slots=True)
class Turn:
    """One turn considered: where it sits, its words' counts and its cosine (slots: a recall
    makes hundreds, and no ``__dict__`` each is less for the garbage collector to walk)."""

    id: str
    session: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    length: int = 0
    cosine: float | None = None
    speaker: str | None = None
    before: str | None = None
    after: str | None = None
    second: float | None = None
    """The cosine of a second model's vectors (``SECOND_WEIGHT``), when one is configured."""
    at: datetime | None = None
    """When it occurred (``occurred_at``): for a query that names a month or a year."""
    echo: float | None = None
    """Its cosine with the query's vector plus the echo's turns' mean (``ECHO_WEIGHT``)."""


def speaker_of(text: str | None) -> str | None:
    """The ``Name:`` a turn's input starts with (one to three capitalised words), lowercased."""
    if not text or ":" not in text:  # no colon, no name (the pattern's cost spared)
        return None
    match = _SPEAKER.match(text)
    return match.group(1).lower() if match else None


def named(query: str) -> set[str]:
    """The query's words, lowercased (a speaker is named when all its words are there)."""
    return {w.lower().removesuffix("'s") for w in _WORD.findall(query)}


def named_times(query: str) -> tuple[set[int], set[int]]:
    """The months (1-12) and the years a query names: a capitalised month's full name not
    opening the query (``"May I ..."``), a year 1900-2099 standing alone."""
    months: set[int] = set()
    years: set[int] = set()
    for match in _WHEN.finditer(query):
        if match.group(1):
            if query[: match.start()].strip():
                months.add(_MONTHS.index(match.group(1)) + 1)
        else:
            years.add(int(match.group(2)))
    return months, years


def in_time(at: datetime | None, months: set[int], years: set[int]) -> bool:
    """Whether ``at`` is in one of ``months`` and one of ``years`` (either may be empty: any;
    both empty: no time named, False)."""
    if at is None or not (months or years):
        return False
    return (not months or at.month in months) and (not years or at.year in years)


def bm25(
    counts: Mapping[str, int],
    length: float,
    idf: Mapping[str, float],
    average: float,
) -> float:
    score = 0.0
    norm = K1 * (1 - B + B * length / (average or 1.0))
    saturation, weight = K1 + 1, idf.get
    for lexeme, tf in counts.items():
        score += weight(lexeme, 0.0) * tf * saturation / (tf + norm)
    return score


def idf_of(turns: Iterable[Turn], lexemes: Iterable[str], total: int) -> dict[str, float]:
    """BM25's ``idf`` of each lexeme over ``total`` turns, its document frequency counted
    among ``turns`` (every turn holding a lexeme of the query is one of them)."""
    frequency = dict.fromkeys(lexemes, 0)
    for turn in turns:
        for lexeme in turn.counts:
            frequency[lexeme] = frequency.get(lexeme, 0) + 1
    total = max(total, max(frequency.values(), default=0))
    return {t: math.log(1 + (total - n + 0.5) / (n + 0.5)) for t, n in frequency.items()}


def _scaled(values: Mapping[str, float]) -> dict[str, float]:
    best = max(values.values(), default=0.0)
    return {k: v / best for k, v in values.items()} if best > 0 else {}


def _from_floor(values: Mapping[str, float], floor: float) -> dict[str, float]:
    if not values:
        return {}
    lo, hi = min(floor, *values.values()), max(values.values())
    if hi <= lo:
        return dict.fromkeys(values, 1.0)
    return {k: (v - lo) / (hi - lo) for k, v in values.items()}


def rank(
    turns: Mapping[str, Turn],
    query: str,
    *,
    alpha: float,
    total: int,
    lexemes: Sequence[str],
    floor: float = 0.0,
) -> tuple[dict[str, float], dict[str, float]]:
    """Each turn's score (module doc; a turn neither half found, nor a neighbour of one, is
    left out) and each words match's own BM25; ``floor``: the relevance floor of the cosines."""
    idf = idf_of((t for t in turns.values() if t.counts), lexemes, total)
    lengths = [t.length for t in turns.values() if t.length]
    average = sum(lengths) / len(lengths) if lengths else 1.0
    own: dict[str, float] = {}
    window: dict[str, float] = {}
    wide = 3 * average
    # ``bm25`` inlined, its arithmetic in the same order (every score bitwise the same): a
    # recall scores thousands of turns twice, and the calls were a third of the ranking's time
    idf_for, saturation = idf.get, K1 + 1
    by_own, by_wide = average or 1.0, wide or 1.0
    find = turns.get
    for key, turn in turns.items():
        counts, length = turn.counts, turn.length
        if counts:
            norm, score = K1 * (1 - B + B * length / by_own), 0.0
            for lexeme, tf in counts.items():
                score += idf_for(lexeme, 0.0) * tf * saturation / (tf + norm)
            own[key] = score
        summed = counts
        for side in (turn.before, turn.after):
            neighbour = find(side) if side else None
            if neighbour is not None:
                if summed is counts:  # a copy only when a neighbour adds to it
                    summed = dict(counts)
                for lexeme, n in neighbour.counts.items():
                    summed[lexeme] = summed.get(lexeme, 0) + n
                length += neighbour.length
        if summed:
            norm, score = K1 * (1 - B + B * length / by_wide), 0.0
            for lexeme, tf in summed.items():
                score += idf_for(lexeme, 0.0) * tf * saturation / (tf + norm)
            window[key] = score
    words = _scaled(own)
    for key, value in _scaled(window).items():
        words[key] = words.get(key, 0.0) + WINDOW_WEIGHT * value
    words = _scaled(words)
    cosines = {k: t.cosine for k, t in turns.items() if t.cosine is not None}
    meaning = _from_floor(cosines, floor)
    word_weight, vector_weight = 1.0 - alpha, alpha * VECTOR_WEIGHT
    if cosines and CONFIDENT_COSINE > 0:
        vector_weight *= min(1.0, max(cosines.values()) / CONFIDENT_COSINE)
    seconds = {k: t.second for k, t in turns.items() if t.second is not None}
    second = _from_floor(seconds, min(seconds.values(), default=0.0))
    second_weight = alpha * SECOND_WEIGHT
    echo = _from_floor({k: t.echo for k, t in turns.items() if t.echo is not None}, floor)
    fused: dict[str, float] = {}
    halves = (
        (word_weight, words),
        (vector_weight, meaning),
        (second_weight, second),
        (alpha * ECHO_WEIGHT, echo),
    )
    for weight, half in halves:
        if weight > 0:
            for key, value in half.items():
                fused[key] = fused.get(key, 0.0) + weight * value
    scored: dict[str, float] = {}
    names = named(query)
    months, years = named_times(query)
    timed = bool(months or years)  # else ``in_time`` is False for every turn
    spoken: dict[str, bool] = {}  # whether the query names a speaker, by speaker
    score_of = fused.get
    for key, turn in turns.items():
        before, after = turn.before, turn.after
        nearest = 0.0  # the best neighbour's (``max`` of theirs: the first of equals)
        if before:
            nearest = score_of(before, 0.0)
            if after:
                other = score_of(after, 0.0)
                if other > nearest:
                    nearest = other
        elif after:
            nearest = score_of(after, 0.0)
        score = score_of(key, 0.0) + NEIGHBOUR_SHARE * nearest
        if score <= 0:
            continue
        speaker = turn.speaker
        if speaker:
            named_here = spoken.get(speaker)
            if named_here is None:
                named_here = spoken[speaker] = set(speaker.split()) <= names
            if named_here:
                score *= 1 + SPEAKER_BOOST
        if timed and in_time(turn.at, months, years):
            score *= 1 + TIME_BOOST
        scored[key] = score
    return scored, own
