"""A command's first answer costs what it imports (bench/cli_startup.py times it): ``memworker
publish … --wait`` and the stdio MCP server's ``initialize`` import no package they do not use.
Asserted on the process's ``sys.modules`` when it exits, never on a wall clock."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from tests.helpers import running_worker, worker_env
from worker.settings import Settings

# The command runs as `memworker` does; what it had imported is written when it exits.
RUN_AND_LIST_MODULES = """
import atexit, json, sys
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
sys.argv = ["memworker", *sys.argv[2:]]
from worker.cli import main
main()
"""

# What neither start needs: the database, the servers' web stacks, embeddings, the stream
# framework, pretty logging and the metrics endpoint.
NOT_AT_START = (
    "sqlalchemy",
    "asyncpg",
    "faststream",
    "fastapi",
    "numpy",
    "onnxruntime",
    "structlog",
    "rich",
    "prometheus_client",
)
# publish also leaves out the MCP SDK, the other commands' modules and the command models
# (the worker validates commands, publish only writes them).
NOT_IN_PUBLISH = (
    *NOT_AT_START,
    "mcp",
    "mcp_types",
    "starlette",
    "uvicorn",
    "httpx",
    "worker.cli.memory",
    "worker.cli.user_memory",
    "worker.cli.operations",
    "worker.cli.access",
    "worker.user_memory",
    "schemas.commands",
)
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}


def imported(
    settings: Settings, tmp_path: Path, *args: str, stdin: str = ""
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    listing = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MODULES, str(listing), *args],
        env=worker_env(settings),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, set(json.loads(listing.read_text()))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` (packages or modules) ``modules`` holds."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


async def test_publish_wait_imports_only_what_publishing_needs(
    settings: Settings, tmp_path: Path
) -> None:
    spawn = ("publish", "spawn", "-p", "demo", "-s", "s1", "--state", "{}", "--wait")
    async with running_worker(settings):
        done, modules = await asyncio.to_thread(imported, settings, tmp_path, *spawn)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["type"] == "agent.spawned"
    assert "worker.lifecycle.client" in modules  # the listing is of the real run
    assert loaded(modules, NOT_IN_PUBLISH) == []


def test_the_stdio_mcp_server_answers_initialize_without_the_heavy_packages(
    settings: Settings, tmp_path: Path
) -> None:
    done, modules = imported(
        settings, tmp_path, "mcp", "-p", "demo", stdin=json.dumps(INITIALIZE) + "\n"
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["id"] == 1 and answer["result"]["serverInfo"]["name"] == "memworker"
    assert "worker.access.mcp_server" in modules
    assert loaded(modules, (*NOT_AT_START, "worker.access.tools", "worker.user_memory")) == []


def test_the_stdio_mcp_server_typed_at_a_prompt_says_what_it_waits_for(
    settings: Settings,
) -> None:
    """Run by hand on a terminal, it says it waits for a client, on stderr (stdout is the
    protocol's), and Ctrl-D ends it; a client's pipe gets no such line (the test above)."""
    main, other = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "mcp", "-p", "demo"],
            env=worker_env(settings),
            stdin=other,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(other)
        os.write(main, b"\x04")  # Ctrl-D: end of input, read once the server reads
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(main)
    said = err.decode()
    assert "waiting for a client" in said and "docs/guides/agents.md" in said
    assert out == b"" and proc.returncode == 0
