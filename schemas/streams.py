"""Events on the streams other than commands and results: dead letters and episodes."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class DeadLetter(BaseModel):
    """An entry on ``P:dlq:{i}``; every field is a string on the wire (a stream entry's field)."""

    data: str = Field(description="The original entry's fields, as a JSON object.")
    source_stream: str
    source_id: str
    group: str
    reason: str = Field(description="unparseable, seq_gap, max_deliveries, storage_failed, …")
    error: str
    deliveries: int = Field(ge=0)
    failed_at: datetime


class EpisodeRecorded(BaseModel):
    """Published on ``P:episodes`` when the consolidator writes a new episode."""

    type: Literal["episode.recorded"] = "episode.recorded"
    event_id: str
    episode_id: str
    project_id: str
    session_id: str
    causation_id: str = Field(description="The event_id of the agent.terminated result.")
