"""Redis's glob dialect (``KEYS``/``SCAN``/``HSCAN MATCH``) in Python, for the in-memory backend.

``fnmatch`` differs from Redis: it negates with ``[!...]`` rather than ``[^...]`` and has no
backslash escape, so a pattern would match differently in tests than against Redis.
"""

from __future__ import annotations

import re
from functools import lru_cache


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex matching exactly the names Redis's ``stringmatchlen`` would."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            i += 1
            negate = i < n and pattern[i] == "^"
            if negate:
                i += 1
            items: list[str] = []
            while i < n and pattern[i] != "]":
                if pattern[i] == "\\" and i + 1 < n:
                    i += 1
                    items.append(re.escape(pattern[i]))
                elif i + 2 < n and pattern[i + 1] == "-":
                    low, high = sorted((pattern[i], pattern[i + 2]))
                    items.append(f"{re.escape(low)}-{re.escape(high)}")
                    i += 2
                else:
                    items.append(re.escape(pattern[i]))
                i += 1
            if items:
                out.append("[" + ("^" if negate else "") + "".join(items) + "]")
            else:  # Redis: "[]" matches nothing, "[^]" any one character
                out.append("." if negate else "(?!)")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def glob_match(pattern: str, name: str) -> bool:
    return compile_glob(pattern).fullmatch(name) is not None
