"""The package's layout as docs/architecture.md draws it: rooms, which room may import which,
no import circle, no module over 500 lines, and a docstring on every room."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import worker

ROOT = Path(worker.__file__).parent
KERNEL = "kernel"
PUBLIC = "public"
ROOMS = (
    "consumers",
    "memory",
    "db",
    "ops",
    "erasure",
    "lifecycle",
    "episodes",
    "user_memory",
    "consolidation",
    "agents",
    "access",
    "inspector",
)
MAY_IMPORT: dict[str, set[str]] = {
    KERNEL: set(),
    "consumers": {KERNEL},
    "memory": {KERNEL},
    "db": {KERNEL},
    "ops": {KERNEL, "db"},
    "erasure": {KERNEL, "db"},
    "lifecycle": {KERNEL, "consumers", "ops", "erasure"},
    "episodes": {KERNEL, "consumers", "db", "erasure"},
    "user_memory": {KERNEL, "consumers", "db", "episodes", "erasure"},
    "consolidation": {
        KERNEL,
        "consumers",
        "db",
        "episodes",
        "user_memory",
        "lifecycle",
        "erasure",
    },
    "agents": {KERNEL, "consumers", "db", "memory", "lifecycle"},
    "access": {KERNEL, "user_memory", "memory", "episodes", "db", "erasure"},
    "inspector": {KERNEL, "access", "user_memory", "consumers", "db", "erasure", "ops"},
    "cli": {KERNEL, *ROOMS},
    PUBLIC: {KERNEL, *ROOMS},
}
"""The floors of docs/architecture.md ("Which room may import which")."""
PUBLIC_MODULES = {"worker", "worker.client"}
"""The public face: ``from worker import AgentLifecycleManager``, ``worker.client``."""


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        if "migrations" in path.relative_to(ROOT).parts:
            continue
        name = ".".join(("worker", *path.relative_to(ROOT).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def room_of(module: str) -> str:
    if module in PUBLIC_MODULES:
        return PUBLIC
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in (*ROOMS, "cli")):
        return parts[1]
    return KERNEL


def imports(path: Path, known: set[str]) -> set[str]:
    """The worker modules ``path`` imports (at any depth: a deferred import counts too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("worker")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not node.module.startswith("worker"):
                continue
            for alias in node.names:  # ``from worker import metrics`` imports a module
                submodule = f"{node.module}.{alias.name}"
                out.add(submodule if submodule in known else node.module)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) for name, path in found.items()}


def test_every_room_imports_only_the_rooms_below_it() -> None:
    wrong = []
    for module, imported in graph().items():
        source = room_of(module)
        for target in imported:
            other = room_of(target)
            if other != source and other not in MAY_IMPORT[source]:
                wrong.append(f"{module} ({source}) imports {target} ({other})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_module_imports_itself_back_through_others() -> None:
    edges = graph()
    state: dict[str, int] = defaultdict(int)  # 0 new, 1 on the path, 2 done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if nxt not in edges:
                continue
            if state[nxt] == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif state[nxt] == 0:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if state[node] == 0:
            visit(node, [node])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_no_module_is_over_500_lines() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, long


def test_every_room_says_what_it_holds_and_owns() -> None:
    for room in (*ROOMS, "cli"):
        doc = ast.get_docstring(ast.parse((ROOT / room / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) >= 2, (
            f"worker/{room}/__init__.py: no two-line docstring"
        )
    undocumented = [
        name
        for name, path in modules().items()
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not undocumented, undocumented
