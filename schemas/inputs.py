"""The input rule every door applies (HTTP, MCP, Python, CLI, streams), defined once.

Bad input is refused before anything is touched, with an error naming the field:
``InvalidInputError`` (a ``ValueError``, with ``field``) in Python; the argument models' types
(``IdText``, ``text_rule``, ``When``) give HTTP and MCP their 422 naming the field. The rules:

- **ids** (project, user, session, turn, fact, block name): ``schemas.ids``' pattern, 1-128 of
  ``[A-Za-z0-9._:-]``: no glob (``*``, ``?``, ``[``, ``%``), no path (``/``, ``..``), no
  look-alike (fullwidth) letters; and not ``.`` or ``..`` alone (``NOT_IDS``: a path step, which
  a browser drops from the inspector's link ``/ui/users/..``, so that user could not be reached);
- **text**: a ``str``, with no NUL character and no lone surrogate (neither can be stored as
  UTF-8 text in Postgres), at most a field's byte size in UTF-8 (``schemas.limits``);
- **times**: RFC 3339 text (``2026-11-20T08:00:00Z``; without an offset it is read as UTC),
  never a number or numeric text taken as Unix time (``-1``, ``"5"``), naming a real instant in
  0001-01-01..9999-12-31 UTC, whatever its offset (``0001-01-01T00:00:00+14:00`` is before
  year 1 in UTC: refused), but not the range's two edge instants, ``0001-01-01T00:00:00Z``
  and ``9999-12-31T23:59:59.999999Z`` (in any offset): the Postgres driver sends those as
  ``-infinity`` and ``infinity``, so the times taken are ``EARLIEST``..``LATEST``;
- **numbers**: finite (no NaN or Infinity), within the field's range; ``ttl_seconds`` in
  (0, ``MAX_TTL_SECONDS``]; ``limit`` an integer from 1.
"""

from __future__ import annotations

import math
import operator
import re
from datetime import UTC, datetime
from typing import Annotated, Any, overload

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

from schemas.ids import ID_PATTERN, NOT_IDS, path_step_problem
from schemas.limits import MAX_ID_CHARS, MAX_RESULTS, MAX_TTL_SECONDS

__all__ = [
    "EARLIEST",
    "LATEST",
    "NOT_IDS",
    "IdText",
    "InvalidInputError",
    "When",
    "check_id",
    "check_limit",
    "check_text",
    "check_ttl",
    "check_when",
    "id_problem",
    "json_text_problem",
    "parse_when",
    "stored_when",
    "text_problem",
    "text_rule",
    "when_problem",
]

_ID_RE = re.compile(ID_PATTERN)


class InvalidInputError(ValueError):
    """An argument refused by the input rule; ``field`` names it, the message says why."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def id_problem(value: Any) -> str | None:
    """Why ``value`` is not an id, or None."""
    if not isinstance(value, str):
        return f"must be an id (text), not {type(value).__name__}"
    if _ID_RE.fullmatch(value) is None:
        return (
            f"must be 1-{MAX_ID_CHARS} characters of letters, digits, '.', '_', ':' or '-' "
            f"(ASCII); got {_shown(value)}"
        )
    return path_step_problem(value)


def check_id(value: Any, field: str) -> str:
    if (problem := id_problem(value)) is not None:
        raise InvalidInputError(field, problem)
    return str(value)


def text_problem(value: Any, max_bytes: int, *, empty: bool = True) -> str | None:
    """Why ``value`` may not be stored as text of at most ``max_bytes`` UTF-8 bytes, or None."""
    if not isinstance(value, str):
        return f"must be text, not {type(value).__name__}"
    if not empty and not value:
        return "must not be empty"
    if "\x00" in value:
        return "contains a NUL character (\\x00), which text cannot hold"
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        return (
            f"contains a lone surrogate ({value[exc.start]!r} at {exc.start}), which is not "
            "Unicode text"
        )
    if size > max_bytes:
        return f"is {size} bytes (UTF-8); the most is {max_bytes}"
    return None


def _unstorable(text: str) -> str | None:
    """Why ``text`` cannot be stored as text (a NUL, a lone surrogate), or None; no size."""
    if "\x00" in text:
        return "contains a NUL character (\\x00), which text cannot hold"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (
            f"contains a lone surrogate ({text[exc.start]!r} at {exc.start}), which is not "
            "Unicode text"
        )
    return None


def json_text_problem(value: Any, where: str) -> tuple[str, str] | None:
    """The first text in a JSON value (any depth, keys and values) that cannot be stored as
    text: ``(where['key'][2], problem)``, or None. The text rule for values that are any JSON:
    working-memory values, a command's ``metadata`` and ``initial_state``."""
    stack: list[tuple[str, Any]] = [(where, value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if (problem := _unstorable(item)) is not None:
                return path, problem
        elif isinstance(item, dict):
            pairs = list(item.items())
            for key, sub in reversed(pairs):
                if isinstance(key, str) and (problem := _unstorable(key)) is not None:
                    return f"{path} (a key, {key!r:.40})", problem
                stack.append((f"{path}[{key!r:.40}]", sub))
        elif isinstance(item, list | tuple):
            stack.extend((f"{path}[{i}]", sub) for i, sub in reversed(list(enumerate(item))))
    return None


def check_text(value: Any, field: str, max_bytes: int, *, empty: bool = True) -> str:
    if (problem := text_problem(value, max_bytes, empty=empty)) is not None:
        raise InvalidInputError(field, problem)
    return str(value)


EARLIEST = datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
"""The first instant a time field takes: ``0001-01-01T00:00:00Z`` itself is ``-infinity``."""
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999998, tzinfo=UTC)
"""The last instant a time field takes: ``9999-12-31T23:59:59.999999Z`` is ``infinity``."""
_INFINITE = (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))


@overload
def stored_when(value: datetime) -> datetime: ...
@overload
def stored_when(value: None) -> None: ...
def stored_when(value: datetime | None) -> datetime | None:
    """A time read back from Postgres, aware: ``infinity``/``-infinity`` (which asyncpg reads
    as a naive ``datetime.max``/``min``; an older version stored them from the edge instants
    the rule now refuses) are ``LATEST``/``EARLIEST``, so they compare with every other time
    and the models' rule takes them back."""
    if value is None or value.tzinfo is not None:
        return value
    if value == datetime.max:
        return LATEST
    if value == datetime.min:
        return EARLIEST
    return value.replace(tzinfo=UTC)


def when_problem(value: Any) -> str | None:
    """Why ``value`` is not a storable instant, or None (a naive one is read as UTC): outside
    0001..9999 in UTC, or one of that range's two edges, which asyncpg sends to Postgres as
    ``-infinity``/``infinity`` (read back with no zone, they broke every comparison)."""
    if not isinstance(value, datetime):
        return f"must be a time (RFC 3339), not {type(value).__name__}"
    naive = value.tzinfo is None or value.utcoffset() is None
    try:
        utc = value.replace(tzinfo=UTC) if naive else value.astimezone(UTC)
    except OverflowError:
        return f"{value.isoformat()} is outside 0001-01-01..9999-12-31 in UTC"
    if utc in _INFINITE:
        edge = "-infinity" if utc == _INFINITE[0] else "infinity"
        return (
            f"{value.isoformat()} is stored by Postgres as {edge}; a time must be from "
            f"{EARLIEST.isoformat()} to {LATEST.isoformat()} in UTC"
        )
    return None


_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})?"
)
RFC3339_EXAMPLE = "2026-11-20T08:00:00Z"


def parse_when(value: Any) -> datetime:
    """The instant RFC 3339 text names (a ``datetime`` passes as it is, for Python callers);
    ``ValueError`` saying why not: a number, numeric text (``"5"``: not a Unix time here), a
    date alone, an impossible date (``2026-02-30``), or a time outside ``EARLIEST``..``LATEST``
    in UTC (0001..9999 but its two edge instants, which Postgres would store as infinity)."""
    if isinstance(value, datetime):
        when = value
    elif not isinstance(value, str):
        raise ValueError(f"must be RFC 3339 text ({RFC3339_EXAMPLE}), not {type(value).__name__}")
    elif (match := _RFC3339.fullmatch(value)) is None:
        raise ValueError(f"must be an RFC 3339 time ({RFC3339_EXAMPLE}); got {_shown(value)}")
    else:
        text = value
        if match[1] is not None and len(match[1]) > 6:  # nanoseconds: kept to microseconds
            text = text[: match.start(1) + 6] + text[match.end(1) :]
        if match[2] in ("Z", "z"):
            text = text[:-1] + "+00:00"
        try:
            when = datetime.fromisoformat(text.replace("t", "T"))
        except ValueError:
            raise ValueError(f"{_shown(value)} is not a real date and time") from None
    if (problem := when_problem(when)) is not None:
        raise ValueError(problem)
    return when


def check_when(value: Any, field: str) -> datetime:
    if (problem := when_problem(value)) is not None:
        raise InvalidInputError(field, problem)
    when: datetime = value
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when


def check_limit(value: Any, field: str = "limit", maximum: int = MAX_RESULTS) -> int:
    """An integer from 1 to ``maximum`` (``True`` is not a number here)."""
    try:
        number = operator.index(value)  # int, numpy's integers; not 2.0, not "2"
    except TypeError:
        number = None
    if isinstance(value, bool) or number is None:
        raise InvalidInputError(field, f"must be an integer, not {type(value).__name__}")
    if not 1 <= number <= maximum:
        raise InvalidInputError(field, f"must be from 1 to {maximum}; got {number}")
    return number


def check_ttl(seconds: Any, field: str = "ttl_seconds") -> float:
    """Finite seconds in (0, ``MAX_TTL_SECONDS``]."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidInputError(field, f"must be a number of seconds, not {type(seconds).__name__}")
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_TTL_SECONDS:
        raise InvalidInputError(
            field, f"must be more than 0 and at most {MAX_TTL_SECONDS} seconds; got {seconds!r}"
        )
    return float(seconds)


def _text_validator(max_bytes: int, empty: bool) -> AfterValidator:
    def check(value: str) -> str:
        if (problem := text_problem(value, max_bytes, empty=empty)) is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(check)


def _id(value: str) -> str:
    if (problem := id_problem(value)) is not None:
        raise ValueError(problem)
    return value


IdText = Annotated[
    str,
    AfterValidator(_id),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": ID_PATTERN,
            "minLength": 1,
            "maxLength": MAX_ID_CHARS,
            "not": {"enum": list(NOT_IDS)},
        }
    ),
]
"""An id argument (the argument models' type; its JSON Schema carries the pattern)."""

When = Annotated[datetime, BeforeValidator(parse_when)]
"""A time argument: RFC 3339 text (or a ``datetime`` from Python) naming a real instant in
``EARLIEST``..``LATEST`` UTC (0001..9999 but its two edges); never a number read as Unix time
(``parse_when``)."""


def text_rule(max_bytes: int, *, empty: bool = True) -> AfterValidator:
    """A text argument's check, for ``Annotated[str, text_rule(n)]``: no NUL, no lone
    surrogate, at most ``max_bytes`` UTF-8."""
    return _text_validator(max_bytes, empty)
