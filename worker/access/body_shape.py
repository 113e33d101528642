"""How much structure a request body may hold, judged on its bytes before any JSON parser reads
it (``Guard``, both HTTP servers).

A parsed body costs far more than its bytes: ``[[],[],…]`` or ``[{},{},…]`` within the 2 MB
body limit became ~700,000 Python lists or dicts (tens of MB) before any argument model saw
them. Every array and object is one ``[`` or ``{`` outside a string, every further value one
``,``: counting them bounds what parsing can build. The count over the raw bytes is an upper
bound (a string's brackets and commas count too), so a body under the limits is passed at
the cost of three byte counts; only one over them is counted again with its strings left out
(the strings found one at a time, what they hold taken off), so text full of commas or
brackets is never refused for them. A string is a value: more strings than the values allowed
is over the limit whatever they hold (and bounds that scan)."""

from __future__ import annotations

import re

MAX_JSON_CONTAINERS = 20_000
"""Arrays and objects a request body may hold (``remember_many`` of 1,000 turns needs ~1,000
to a few thousand; a working-memory value of 1 MB, any JSON, a list of 20,000 objects)."""
MAX_JSON_VALUES = 20_000
"""Values a request body may hold: its arrays' elements and objects' members, counted by the
commas (and the arrays and objects) outside strings. An argument model refusing a body answers
with a problem per member it does not know (~1 KB each while it is built: 99,000 unknown keys
took 100 MB), so this bound is low: ~5 per turn of a 1,000-turn ``remember_many``."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _counts(body: bytes | bytearray, start: int = 0, end: int | None = None) -> tuple[int, int]:
    containers = body.count(b"[", start, end) + body.count(b"{", start, end)
    return containers, containers + body.count(b",", start, end)


def shape_problem(body: bytes | bytearray, what: str = "request body") -> str | None:
    """The one line a body (``what``: how the line names it; an MCP stdio line is a
    ``message``) holding more structure than the limits is refused with, or None."""
    containers, values = _counts(body)
    if containers <= MAX_JSON_CONTAINERS and values <= MAX_JSON_VALUES:
        return None
    # one match at a time: no memory per string
    for strings, found in enumerate(_STRING.finditer(body), 1):
        if strings > MAX_JSON_VALUES:  # each string is a value: over whatever they hold
            values = strings
            break
        start, end = found.span()
        if end - start > 2:
            inside, inside_values = _counts(body, start, end)
            containers, values = containers - inside, values - inside_values
    if containers > MAX_JSON_CONTAINERS:
        return (
            f"{what} holds {containers:,} JSON arrays and objects, over the limit of "
            f"{MAX_JSON_CONTAINERS:,}: send fewer (split a batch, flatten a value)"
        )
    if values > MAX_JSON_VALUES:
        return (
            f"{what} holds more than {MAX_JSON_VALUES:,} JSON values ({values:,}), over "
            "the limit: send fewer (split a batch, join small values)"
        )
    return None
