"""First answers of the command line, process start included: ``memworker publish … --wait``
(target ≤ 0.5 s on a quiet machine) and the MCP stdio server's ``initialize`` (target ≤ 1 s).

Runs a lifecycle worker in this process on ``--redis-url`` (a key prefix of its own, deleted
after), then, ``--runs`` times each: ``memworker publish spawn … --wait`` as a new process
(wall time to its exit), ``memworker mcp`` as a new process (wall time from its start to the
``initialize`` answer on its stdout), and ``python -c pass`` (the interpreter alone, the floor).
Prints each median wall time and the median CPU time (user + sys) of the process, the load
average before and after, and which heavy packages each command imported. On a shared machine
compare the ratios of one run, not figures of runs at other times: ``--baseline DIR`` (another
checkout, e.g. a ``git worktree`` of an older commit) runs each command from it too,
alternating, and the ratios are printed. CPU time is what a quiet machine's wall time comes
close to (a loaded one stretches wall time far more than CPU time). The commands run with
bytecode caches (in a temporary ``PYTHONPYCACHEPREFIX``, warmed by one run first), as after a
user's first run, whatever ``PYTHONDONTWRITEBYTECODE`` says.

    .venv/bin/python bench/cli_startup.py --redis-url redis://127.0.0.1:6379/0 [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from redis.asyncio import Redis

from worker.lifecycle.worker import LifecycleWorker
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PUBLISH = [sys.executable, "-m", "worker.cli", "publish", "spawn", "-p", "demo", "--state", "{}"]
HEAVY = (
    "sqlalchemy", "asyncpg", "faststream", "mcp", "fastapi", "starlette", "uvicorn", "numpy",
    "onnxruntime", "structlog", "rich", "prometheus_client",
)  # fmt: skip
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "bench", "version": "0"},
    },
}


def _cwd(env: dict[str, str]) -> str:
    """The checkout a command runs from (``-m`` puts the working directory first on the path)."""
    return env.get("PYTHONPATH") or str(ROOT)


def _cpu_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


async def _wall(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *command, env=env, cwd=_cwd(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _out, err = await proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{command}: exit {proc.returncode}: {err.decode()[-2000:]}")
    return time.perf_counter() - started


LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


async def _initialize(env: dict[str, str]) -> tuple[float, float]:
    """Wall time from the server's start to its ``initialize`` answer, and to its
    ``tools/list`` answer (what a client does next)."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "worker.cli", "mcp", "-p", "demo", env=env, cwd=_cwd(env),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(INITIALIZE).encode() + b"\n")
    await proc.stdin.drain()
    answer = json.loads(await proc.stdout.readline())
    took = time.perf_counter() - started
    assert answer.get("id") == 1 and "result" in answer, answer
    for message in (INITIALIZED, LIST_TOOLS):
        proc.stdin.write(json.dumps(message).encode() + b"\n")
    await proc.stdin.drain()
    tools = json.loads(await proc.stdout.readline())
    listed = time.perf_counter() - started
    assert tools.get("id") == 2 and tools["result"]["tools"], tools
    proc.stdin.close()
    await proc.wait()
    return took, listed


def _median(took: list[float]) -> str:
    return f"median {statistics.median(took):.2f} s, min {min(took):.2f} s, max {max(took):.2f} s"


def _imported(args: list[str], env: dict[str, str], stdin: str = "") -> list[str]:
    report = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "worker.cli", *args],
        env=env, cwd=_cwd(env), input=stdin, capture_output=True, text=True, check=False,
    ).stderr  # fmt: skip
    names = {line.split("|")[-1].strip().split(".")[0] for line in report.splitlines()}
    return [h for h in HEAVY if h in names]


async def measure(redis_url: str, runs: int, baseline: str | None) -> None:
    prefix = "clistart" + uuid.uuid4().hex[:8]
    settings = Settings(redis_url=redis_url, stream_prefix=prefix)
    caches = tempfile.mkdtemp(prefix="memworker-pycache-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env |= {"REDIS_URL": redis_url, "MEMWORKER_STREAM_PREFIX": prefix}
    env |= {"MEMWORKER_LOG_LEVEL": "WARNING", "PYTHONPYCACHEPREFIX": caches}
    checkouts = {"this checkout": {**env, "PYTHONPATH": str(ROOT)}}
    if baseline is not None:
        checkouts["baseline"] = {**env, "PYTHONPATH": baseline}
    redis = Redis.from_url(redis_url)
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    running = asyncio.create_task(worker.run(stop))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        while not worker.ready:
            await asyncio.sleep(0.05)
        for label, where in checkouts.items():  # compile once: what a user's later runs skip
            await _wall([*PUBLISH, "-s", f"warm-{label[:4]}", "--wait"], where)
            await _initialize(where)
        walls: dict[str, list[float]] = {}
        cpus: dict[str, list[float]] = {}
        for n in range(runs):
            walls.setdefault("python -c pass", []).append(
                await _wall([sys.executable, "-c", "pass"], env)
            )
            for label, where in checkouts.items():
                cpu = _cpu_of_children()
                walls.setdefault(f"publish spawn --wait ({label})", []).append(
                    await _wall([*PUBLISH, "-s", f"s{n}-{label[:4]}", "--wait"], where)
                )
                cpus.setdefault(f"publish spawn --wait ({label})", []).append(
                    _cpu_of_children() - cpu
                )
                cpu = _cpu_of_children()
                initialized, listed = await _initialize(where)
                walls.setdefault(f"mcp: initialize answered ({label})", []).append(initialized)
                walls.setdefault(f"mcp: tools/list answered ({label})", []).append(listed)
                cpus.setdefault(f"mcp: process to its exit ({label})", []).append(
                    _cpu_of_children() - cpu
                )
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for name, took in walls.items():
            print(f"wall {name}: {_median(took)}")
        for name, took in cpus.items():
            print(f"cpu (user+sys) {name}: {_median(took)}")
        if baseline is not None:
            for kind, figures in (("wall", walls), ("cpu", cpus)):
                for name in figures:
                    if name.endswith("(this checkout)"):
                        base = name.replace("(this checkout)", "(baseline)")
                        ratio = statistics.median(figures[name]) / statistics.median(figures[base])
                        print(f"{kind} ratio this/baseline, {name[: -len(' (this checkout)')]}: "
                              f"{ratio:.2f}")  # fmt: skip
        spawn = ["publish", "spawn", "-p", "demo", "-s", "imports", "--wait"]
        for label, where in checkouts.items():
            print(f"publish imported ({label}): {_imported(spawn, where) or 'none of the heavy'}")
            print(f"mcp imported ({label}): {_imported(['mcp', '-p', 'demo'], where)}")
    finally:
        stop.set()
        await running
        async for key in redis.scan_iter(match=f"{prefix}:*"):
            await redis.delete(key)
        await redis.aclose()
        shutil.rmtree(caches, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", type=Path, help="Another checkout to compare with.")
    args = parser.parse_args()
    baseline = None if args.baseline is None else str(args.baseline.resolve())
    asyncio.run(measure(args.redis_url, args.runs, baseline))


if __name__ == "__main__":
    main()
