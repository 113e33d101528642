"""Run every bench and write BENCHMARKS.md (what ``make bench`` does).

    .venv/bin/python bench/report.py [--redis-url URL] [--database-url URL] [--out BENCHMARKS.md]
        [--only latency scaling …] [--quick]

Each bench runs as a subprocess from the project root; its markdown (its stdout) goes into
BENCHMARKS.md under a heading, with the exact command that produced it and how long it took,
after a header describing the machine (CPUs, CPU model, RAM, Python, Redis/Valkey and Postgres
versions, load average) and the date. ``--quick`` passes small sizes to every bench (a smoke
run: the figures are not worth keeping). A bench that fails is reported with the end of its
standard error, the others still run, and the exit status is 1.

A block between ``<!-- hand-written -->`` and ``<!-- /hand-written -->`` in an existing
BENCHMARKS.md (notes, before/after tables of an optimisation) is carried over as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import BENCH_DIR, DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, hide_passwords, percentile
from redis.asyncio import Redis
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from worker.settings import asyncpg_url

ROOT = BENCH_DIR.parent
HAND_WRITTEN = re.compile(r"<!-- hand-written -->.*?<!-- /hand-written -->", re.DOTALL)
EMPTY_HAND_WRITTEN = """<!-- hand-written -->
<!-- Notes kept across regenerations (before/after of an optimisation, …) go here. -->
<!-- /hand-written -->"""


@dataclass
class Bench:
    script: str
    title: str
    about: str
    database: bool = False
    quick: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


BENCHES = [
    Bench(
        "latency.py",
        "End-to-end latency at a steady 1,000 commands/s",
        "Command → result and result → episode row, open-loop load, services as subprocesses.",
        database=True,
        quick=["--seconds", "4", "--warmup", "1"],
    ),
    Bench(
        "lifecycle_throughput.py",
        "Lifecycle worker throughput (one process)",
        "Commands/s draining a prefilled stream, worker in the bench's process.",
        quick=["--sessions", "1000"],
    ),
    Bench(
        "forget.py",
        "Forgetting a project of 10,000 finished sessions",
        "`forget_everywhere` (what `memworker forget` runs) beside a project of the same size.",
        database=True,
        quick=["--sessions", "1000"],
    ),
    Bench(
        "worker_versions.py",
        "Before and after the worker's optimisations (one process)",
        "The first batched worker (commit 4583134) and this checkout, alternating rounds.",
        quick=["--sessions", "1000", "--rounds", "1"],
    ),
    Bench(
        "scaling.py",
        "Throughput with 1, 2 and 4 worker processes, on 1 and 4 shards",
        "`memworker run --workers N` subprocesses on a backlog released at once.",
        quick=["--sessions", "2000"],
    ),
    Bench(
        "consolidation_throughput.py",
        "Consolidation throughput",
        "Episodes/s from a prefilled results stream into Postgres, and the CPU each episode costs.",
        database=True,
        quick=["--episodes", "2000", "--naive-episodes", "300", "--rounds", "1"],
    ),
    Bench(
        "working_memory.py",
        "Working memory: one call at a time",
        "Sequential get/set latency and server-side checkpoints.",
        quick=["--ops", "2000", "--checkpoint-runs", "5"],
    ),
    Bench(
        "agents.py",
        "Working memory under 100 concurrent agents",
        "Ops/s and latency of get/set from 100 asyncio agents, one session each.",
        quick=["--seconds", "2", "--rounds", "1"],
    ),
    Bench(
        "memory_footprint.py",
        "Memory: Redis bytes per idle session, worker RSS at full load",
        "A private Redis for the bytes; `VmRSS` of the worker draining a backlog.",
        quick=["--sessions", "300", "--rss-sessions", "1000"],
    ),
    Bench(
        "recall_quality.py",
        "Recall quality on the labeled set, and the local embedder's speed",
        "recall@k of full-text only, vector only and hybrid recall; embeddings/s on this machine.",
    ),
    Bench(
        "recall_latency.py",
        "Recall latency at 10,000 and 100,000 episodes in one project",
        "`EpisodeStore.recall` p50/p99, query embedding included (pgvector in embedded pgserver).",
        args=["--breakdown"],
        quick=["--sizes", "2000", "--queries", "30"],
    ),
    Bench(
        "user_memory.py",
        "User memory: blocks, remember, recall, facts, and the change feed's Redis cost",
        "`worker.Memory` calls one at a time against its own migrated database; the feed's "
        "bytes per event and Redis CPU per XADD.",
        database=True,
        quick=[
            "--users",
            "100",
            "--ops",
            "500",
            "--remembers",
            "200",
            "--episodes",
            "1000",
            "--facts",
            "1000",
            "--queries",
            "50",
        ],
    ),
    Bench(
        "remember_breakdown.py",
        "`remember` with and without an indexer, part by part",
        "`Memory.remember` storing and announcing a turn (an indexer embeds it) against embedding "
        "it first (no indexer runs), same run, on an embedded PostgreSQL with pgvector.",
        quick=["--remembers", "50"],
    ),
    Bench(
        "indexer_throughput.py",
        "Indexer episodes/s; consolidation before/after the indexer runs",
        "Same run, rounds alternating: consolidation alone, then with `memworker index` beside it.",
        quick=["--episodes", "500", "--rounds", "1"],
    ),
    Bench(
        "steady_state.py",
        "Steady state: bytes per session, Redis CPU per command, commands/s per GB",
        "An earlier commit and this checkout, each on a private Redis, default settings.",
        quick=["--sessions", "1000", "--rounds", "1"],
    ),
    Bench(
        "redis_instructions.py",
        "Redis instructions per command (callgrind)",
        "An earlier commit and this checkout on one `redis-server` binary under valgrind: "
        "a count that does not move with the machine's load.",
        quick=["--sessions", "100"],
    ),
    Bench(
        "capacity_figures.py",
        "Capacity: bytes per session, per record and per entry; what one GB sustains",
        "`memworker stats` on a known workload, the capacity gauges' cost, time until full.",
        quick=["--finished", "200", "--live", "50", "--refreshes", "50", "--fill-mb", "5"],
    ),
]


def shown(words: list[str]) -> str:
    python = Path(words[0])
    if python.is_relative_to(ROOT):
        python = python.relative_to(ROOT)
    line = " ".join(shlex.quote(w) for w in [str(python), *words[1:]])
    return hide_passwords(line)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{rev or 'no commit'}{' with uncommitted changes' if dirty else ''}"


async def server_versions(redis_url: str, database_url: str) -> tuple[str, str]:
    try:
        redis = Redis.from_url(redis_url)
        info: Any = await redis.info("server")
        await redis.aclose()
        name = str(info.get("server_name") or "redis")
        redis_version = f"{name} {info.get('valkey_version') or info['redis_version']}"
    except Exception as exc:
        redis_version = f"unreachable ({exc})"
    try:
        engine = create_async_engine(asyncpg_url(database_url))
        async with engine.connect() as conn:
            pg = (await conn.execute(text("SHOW server_version"))).scalar_one()
        await engine.dispose()
        postgres_version = f"PostgreSQL {pg}"
    except Exception as exc:
        postgres_version = f"unreachable ({exc})"
    return redis_version, postgres_version


def wakeup_round_trip(rounds: int = 20_000) -> str:
    """p50/p99/p99.9/max of a one-byte ping-pong between two processes over pipes: how long
    this machine takes to wake a process that waits (what every hand-off between the worker,
    Redis and Postgres pays). A quiet 2-core machine answers in tens of µs at p99; a virtual
    machine whose CPUs are taken away by its host, in milliseconds: latency figures here can be
    no better than this."""
    ping_r, ping_w = os.pipe()
    pong_r, pong_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the echo
        try:
            for _ in range(rounds):
                os.read(ping_r, 1)
                os.write(pong_w, b"x")
        finally:
            os._exit(0)
    samples: list[float] = []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            os.write(ping_w, b"x")
            os.read(pong_r, 1)
            samples.append(time.perf_counter() - started)
    finally:
        os.waitpid(pid, 0)
        for fd in (ping_r, ping_w, pong_r, pong_w):
            os.close(fd)
    at = {q: f"{percentile(samples, q) * 1e6:,.0f} µs" for q in (50, 99, 99.9, 100)}
    return (
        f"p50 {at[50]}, p99 {at[99]}, p99.9 {at[99.9]}, max {at[100]}"
        f" ({rounds:,} pipe ping-pongs between two processes)"
    )


def machine(redis_url: str, database_url: str) -> str:
    redis_version, postgres_version = asyncio.run(server_versions(redis_url, database_url))
    safe_db = make_url(asyncpg_url(database_url)).render_as_string(hide_password=True)
    rows = [
        ("CPUs", f"{os.cpu_count()} × {cpu_model()}"),
        ("RAM", ram()),
        ("OS", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("Redis", f"{redis_version} at `{redis_url}`"),
        ("Postgres", f"{postgres_version} at `{safe_db}`"),
        ("memworker", git_revision()),
        ("load average at start", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("wake-up round trip at start", wakeup_round_trip()),
    ]
    return "\n".join(["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]])


def run(bench: Bench, command: list[str], timeout: float) -> tuple[int, str, str, float]:
    started = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the benches clean up on SIGTERM
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        err += f"\n(stopped after the {timeout:.0f} s timeout)"
    return proc.returncode, out, err, time.monotonic() - started


def section(bench: Bench, command: str, code: int, out: str, err: str, seconds: float) -> str:
    lines = [f"## {bench.title}", "", bench.about, "", f"Command: `{command}` ({seconds:.0f} s)"]
    body = [line for line in out.strip().splitlines() if not line.startswith("command: `")]
    while body and not body[0].strip():
        body.pop(0)
    lines += ["", *body]
    if code != 0:
        tail = "\n".join(err.strip().splitlines()[-30:])
        lines += ["", f"**Failed** (exit status {code}):", "", "```", tail, "```"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    parser.add_argument(
        "--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    )
    parser.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    parser.add_argument(
        "--only", nargs="+", metavar="NAME", help="benches to run (script names without .py)"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per bench")
    args = parser.parse_args()

    chosen = [b for b in BENCHES if not args.only or b.script.removesuffix(".py") in args.only]
    started = datetime.now(UTC)
    header = machine(args.redis_url, args.database_url)
    sections = []
    failed = 0
    began = time.monotonic()
    for number, bench in enumerate(chosen, start=1):
        command = [sys.executable, f"bench/{bench.script}", "--redis-url", args.redis_url]
        if bench.database:
            command += ["--database-url", args.database_url]
        command += bench.args + (bench.quick if args.quick else [])
        print(f"[{number}/{len(chosen)}] {shown(command)}", file=sys.stderr, flush=True)
        code, out, err, seconds = run(bench, command, args.timeout)
        print(
            f"        {'ok' if code == 0 else f'FAILED ({code})'} in {seconds:.0f} s",
            file=sys.stderr,
        )
        failed += code != 0
        sections.append(section(bench, shown(command), code, out, err, seconds))

    kept = EMPTY_HAND_WRITTEN
    if args.out.exists():
        found = HAND_WRITTEN.search(args.out.read_text())
        if found:
            kept = found.group(0)
    total = time.monotonic() - began
    quick = " with `--quick` (smoke-run sizes: not figures to keep)" if args.quick else ""
    document = [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`bench/report.py`){quick} on "
        f"{started:%Y-%m-%d %H:%M} UTC in {total / 60:.1f} min; regenerate it rather than edit "
        "it (only the hand-written block below is kept). Every figure is absolute for this "
        "machine and, in its ratio column, relative to a baseline measured in the same run. "
        "Each bench runs alone with the command shown.",
        "",
        "## Machine",
        "",
        header,
        "",
        kept,
        "",
        *[s + "\n" for s in sections],
    ]
    args.out.write_text("\n".join(document).rstrip() + "\n")
    print(f"wrote {args.out} in {total:.0f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
