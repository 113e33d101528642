"""What the README and the documentation site say about things it is easy to confuse."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The README and every page of the site (docs/), as one text.
README = "\n\n".join(
    p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
)


def test_loomflows_in_memory_store_is_never_mapped_to_working_memory_in_memory() -> None:
    # A table row or sentence offering WorkingMemory.in_memory as LoomFlow's store: they are
    # different things (a process-local backend for tests vs LoomFlow's Memory).
    for paragraph in re.split(r"\n\s*\n|\n\|", README):
        if "LoomFlow's in-memory store" in paragraph and "WorkingMemory.in_memory" in paragraph:
            assert "is not" in paragraph or "not `WorkingMemory.in_memory" in paragraph, paragraph
    rows = [line for line in README.splitlines() if line.startswith("|")]
    assert not [r for r in rows if "LoomFlow" in r and "in_memory" in r], "a row maps them"
    intro = README[README.index("## Coming from syndarix") :].split("\n\n")[1]
    assert "in-memory store" not in intro, intro
