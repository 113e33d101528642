"""The ``context_summary`` of an episode: what a person (or a model) reads first.

It is built from the ``agent.terminated`` result alone, so a replay writes the same text. Every
part is bounded on its own (long variables cannot crowd out the lessons) and the whole is cut
at ``max_chars``. Sections come in order of use to a reader: the task and its outcome, the
lessons, where the task stood, the last steps, then the variables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from schemas.results import AgentTerminated
from worker.db.models import STEPS_HEADING, TASK_STATE_HEADING, VARIABLES_HEADING

RECENT_STEPS = 5
MAX_VARIABLES = 10
ITEM_CHARS = 240
ELLIPSIS = "…"
# Section headings: defined beside the full-text index that cuts the summary at them
# (``worker.db.models``). Every line but a heading starts with a known prefix or ``- `` and
# items never hold a newline (``clip``), so a heading cannot be faked.


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut to ``limit`` characters, an ellipsis marking the cut."""
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + ELLIPSIS
    return text.replace("\n", " ") if "\n" in text else text


def _as_text(value: Any) -> str:
    if type(value) is str or isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _percent(value: Any) -> str:
    """WorkingMemory keeps progress as 0-100."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}%"
    return _as_text(value)


TIMESTAMPS = frozenset({"started_at", "updated_at", "created_at"})
_DESCRIBED = frozenset(
    {"current_step", "total_steps", "status", "progress_percent", "progress", "description"}
)
_LEFT_OUT = _DESCRIBED | TIMESTAMPS
_EMPTY: tuple[Any, ...] = (None, {}, [], "")


def _is_mapping(value: Any) -> bool:
    return type(value) is dict or isinstance(value, Mapping)


def describe_task_state(state: Mapping[str, Any]) -> str:
    """``step 3/5, status running, progress 60%`` then the other fields (timestamps left out)."""
    parts: list[str] = []
    step, total = state.get("current_step"), state.get("total_steps")
    if step is not None and (step or total):
        parts.append(f"step {_as_text(step)}" + (f"/{_as_text(total)}" if total else ""))
    if (status := state.get("status")) is not None:
        parts.append(f"status {_as_text(status)}")
    progress = state.get("progress_percent", state.get("progress"))  # `progress`: earlier versions
    if progress is not None:
        parts.append(f"progress {_percent(progress)}")
    if description := state.get("description"):
        parts.append(f"doing {clip(_as_text(description), 160)}")
    for key, value in state.items():
        if key not in _LEFT_OUT and value not in _EMPTY:
            parts.append(f"{key} {clip(_as_text(value), 160)}")
    return ", ".join(parts)


def _bullets(items: Sequence[str], limit: int = ITEM_CHARS) -> list[str]:
    return [f"- {clip(item, limit)}" for item in items]


def build_context_summary(
    result: AgentTerminated, snapshot: Mapping[str, Any] | None, max_chars: int
) -> str:
    """A readable summary of a finished session, at most ``max_chars`` characters.

    ``snapshot`` is the result's raw ``snapshot`` object (shape-checked by the caller): reading
    it raw spares validating every variable value as JSON a second time.
    """
    return summarise(
        result.task_description, result.outcome, result.lessons_learned, snapshot, max_chars
    )


def summarise(
    task_description: str | None,
    outcome: str,
    lessons_learned: Sequence[str],
    snapshot: Mapping[str, Any] | None,
    max_chars: int,
) -> str:
    """``build_context_summary`` from the fields it reads, for callers that hold no model."""
    lines: list[str] = []
    if task_description:
        lines.append(f"Task: {clip(task_description, 600)}")
    lines.append(f"Outcome: {outcome}")
    if lessons_learned:
        lines.append("Lessons:")
        lines += _bullets(lessons_learned)
    if snapshot:
        task_state = snapshot.get("task_state")
        if task_state and _is_mapping(task_state):
            lines.append(f"{TASK_STATE_HEADING}: {clip(describe_task_state(task_state), 400)}")
        scratchpad = snapshot.get("scratchpad") or []
        if scratchpad:
            recent = scratchpad[-RECENT_STEPS:]
            skipped = len(scratchpad) - len(recent)
            lines.append(STEPS_HEADING + (f" (of {len(scratchpad)}):" if skipped else ":"))
            lines += _bullets([_as_text(e.get("content") if _is_mapping(e) else e) for e in recent])
        variables = snapshot.get("variables") or {}
        if variables:
            names = sorted(variables)
            shown = names[:MAX_VARIABLES]
            lines.append(f"{VARIABLES_HEADING} ({len(names)}):")
            lines += [
                f"- {clip(name, 60)} = {clip(_as_text(variables[name]), 120)}" for name in shown
            ]
            if len(names) > len(shown):
                lines.append(f"- … and {len(names) - len(shown)} more")
        checkpoints = snapshot.get("checkpoints") or []
        if checkpoints:
            lines.append(f"Checkpoints: {len(checkpoints)}")
    text = "\n".join(lines)
    if len(text) <= max_chars:
        return text
    return text[: max_chars - 1] + ELLIPSIS
