"""The context summary: readable, complete when short, bounded when not."""

from __future__ import annotations

from typing import Any

from schemas.results import AgentTerminated
from worker.episodes.summary import build_context_summary


def result(**fields: Any) -> AgentTerminated:
    base: dict[str, Any] = {
        "event_id": "r-1",
        "causation_id": "c-1",
        "command": "terminate",
        "project_id": "p",
        "session_id": "s",
        "occurred_at": "2025-01-01T00:00:00Z",
        "duration_ms": 1,
        "outcome": "partial",
        "items_cleared": 3,
        "consolidate": True,
        "task_description": "Reconcile the invoices",
        "lessons_learned": ["ask for the currency"],
        "importance": 0.5,
    }
    return AgentTerminated.model_validate(base | fields)


SNAPSHOT = {
    "variables": {"total": 12, "vendor": {"name": "ACME"}},
    "task_state": {
        "current_step": 2,
        "total_steps": 4,
        "status": "in_progress",
        "progress_percent": 50,
    },
    "scratchpad": [{"content": f"note {i}", "timestamp": "t"} for i in range(9)],
    "checkpoints": ["cp-1"],
}


def test_the_summary_names_task_outcome_state_steps_variables_and_lessons() -> None:
    text = build_context_summary(result(), SNAPSHOT, 4_000)
    assert "Task: Reconcile the invoices" in text
    assert "Outcome: partial" in text
    assert "step 2/4, status in_progress, progress 50%" in text
    assert "note 8" in text
    assert "note 3" not in text  # only the last few steps
    assert '- vendor = {"name":"ACME"}' in text
    assert "- ask for the currency" in text


def test_a_task_state_stored_with_the_old_progress_name_still_shows_its_progress() -> None:
    old = {**SNAPSHOT, "task_state": {"current_step": 1, "status": "in_progress", "progress": 25}}
    assert "step 1, status in_progress, progress 25%" in build_context_summary(result(), old, 4_000)


def test_the_summary_never_exceeds_its_bound() -> None:
    huge = {**SNAPSHOT, "variables": {f"v{i}": "x" * 5_000 for i in range(500)}}
    text = build_context_summary(result(task_description="y" * 2_000), huge, 300)
    assert len(text) <= 300
    assert text.startswith("Task: yyy")


def test_a_termination_without_snapshot_still_has_a_summary() -> None:
    assert build_context_summary(result(), None, 4_000).startswith("Task: Reconcile")
