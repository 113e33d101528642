"""The id rule shared by every event: 1–128 characters of ``[A-Za-z0-9._:-]``; an id a write
names (``WriteId``), not ``.`` or ``..`` alone either."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, StringConstraints, WithJsonSchema

ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"

Id = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=128)]

NOT_IDS = (".", "..")
"""The pattern's two strings no write may name as an id: a URL's path steps (``/ui/users/..``
is ``/ui/``), so what is stored under them could not be reached by a link. Readers and forget
selectors still take them: data an older version stored under them stays erasable."""


def path_step_problem(value: str) -> str | None:
    """Why ``value`` (an id by the pattern) may not be written as one, or None."""
    if value in NOT_IDS:
        return f"must not be {value!r} alone: it is a path step, which a link drops"
    return None


def _not_a_path_step(value: str) -> str:
    if (problem := path_step_problem(value)) is not None:
        raise ValueError(problem)
    return value


WriteId = Annotated[
    Id,
    AfterValidator(_not_a_path_step),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": ID_PATTERN,
            "minLength": 1,
            "maxLength": 128,
            "not": {"enum": list(NOT_IDS)},
        }
    ),
]
"""An id a write names (a command's ``project_id``, ``session_id``, a spawn's ``user_id``):
``Id``, and not ``.`` or ``..`` alone (``NOT_IDS``)."""
