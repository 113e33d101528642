"""The id rule shared by every event: 1–128 characters of ``[A-Za-z0-9._:-]``."""

from __future__ import annotations

from typing import Annotated

from pydantic import StringConstraints

ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"

Id = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=128)]
