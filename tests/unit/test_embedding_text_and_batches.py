"""What an episode is embedded as, and how the ONNX embedder cuts texts into batches."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.episodes.embedding import SUMMARY_CHARS, episode_text
from worker.episodes.onnx_model import batches


def test_the_summary_lines_that_repeat_the_task_and_lessons_are_not_embedded_twice() -> None:
    summary = (
        "Task: Fix the login bug\nOutcome: success\nLessons:\n- check token expiry\n"
        "Task state: step 4/6, status done"
    )
    text = episode_text("Fix the login bug", ["check token expiry"], summary)
    assert text == (
        "Fix the login bug\ncheck token expiry\nOutcome: success\nTask state: step 4/6, status done"
    )


def test_only_the_head_of_the_summary_is_read_and_other_lines_are_kept() -> None:
    summary = "Outcome: failure\n- a lesson it does not have\n" + "x" * 1_000
    text = episode_text("Task", [], summary)
    assert text.startswith("Task\nOutcome: failure\n- a lesson it does not have\nxx")
    assert len(text) == len("Task\n") + SUMMARY_CHARS
    assert episode_text(None, [1, "kept"], None) == "kept"  # non-text lessons are skipped


@given(st.lists(st.integers(min_value=1, max_value=300), max_size=400))
def test_batches_hold_every_text_once_within_the_token_budget(lengths: list[int]) -> None:
    cut = batches(lengths, budget=1_024, most=32)
    flat = [i for batch in cut for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    for batch in cut:
        widest = max(lengths[i] for i in batch)
        assert len(batch) <= 32
        assert len(batch) == 1 or len(batch) * widest <= 1_024
    assert [lengths[i] for i in flat] == sorted(lengths)  # by length: little padding
