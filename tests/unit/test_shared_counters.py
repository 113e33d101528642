"""No ``obj.x += await …`` in worker/: the read of ``obj.x`` happens before the await, so an
addition another task makes meanwhile is lost (two consolidator writers lost ~half of
``memworker_episodes_recorded_total`` so). Await first, then add. A local name is safe: no
other task sees it."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "worker"


def _awaits(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Await) for n in ast.walk(node))


def test_no_augmented_assignment_to_shared_state_awaits_in_its_value() -> None:
    found = []
    for path in sorted(WORKER.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.AugAssign)
                and isinstance(node.target, ast.Attribute | ast.Subscript)
                and _awaits(node.value)
            ):
                found.append(f"{path.relative_to(WORKER.parent)}:{node.lineno}")
    assert not found, f"await first, then add (another task's update is lost): {found}"
