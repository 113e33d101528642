"""Instructions Redis executes per lifecycle command (valgrind callgrind): an earlier commit of
the worker and this checkout, on the same server binary. Unlike ``INFO cpu``, the count does
not move with what else the machine runs, so a small change to the apply code shows.

    .venv/bin/python bench/redis_instructions.py [--before 0102ab1] [--sessions 500] \\
        [--server-binary PATH]

For each version a ``redis-server`` runs under ``valgrind --tool=callgrind`` (about 50×
slower: keep ``--sessions`` small), and a client of that version (its own ``CommandApplier``,
the earlier one from a temporary git worktree on ``PYTHONPATH``) applies ``--sessions``
spawns (4 small variables), then pauses, resumes and terminates, in pipelined batches of 200
as the worker sends them. Counters are zeroed before each command type and dumped after it
(``callgrind_control``): instructions ÷ commands, everything the server did for them
(reading the requests, the apply call, replies); repeated runs agree to ~1 %. For this
checkout the same keys and arguments are also sent to a function that only returns 1: what
calling at all costs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import earlier_checkout, invocation, markdown_table
from memory_footprint import free_port, server_binary

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("spawn", "pause", "resume", "terminate")

RUNNER = r"""
import asyncio, glob, json, os, subprocess, sys, time, orjson
from redis.asyncio import Redis
from worker.lifecycle.apply import CommandApplier
from worker.settings import Settings

port, pid, out, sessions, floor = sys.argv[1:6]
sessions, floor = int(sessions), floor == "1"


def control(flag):
    subprocess.run(["callgrind_control", flag, pid], check=True, capture_output=True)


def dumped():
    # The newest dump's total: callgrind writes one file per dump.
    for _ in range(100):
        files = sorted(glob.glob(out + ".*"), key=os.path.getmtime)
        if files:
            for line in open(files[-1]):
                if line.startswith(("summary:", "totals:")):
                    return int(line.split()[1])
        time.sleep(0.1)
    raise RuntimeError("no callgrind dump")


async def counted(run):
    control("-z")
    await run()
    before = len(glob.glob(out + ".*"))
    control("-d")
    while len(glob.glob(out + ".*")) == before:
        time.sleep(0.05)
    time.sleep(0.2)
    return dumped()


async def main():
    url = f"redis://127.0.0.1:{port}/0"
    redis = Redis.from_url(url)
    applier = CommandApplier(redis, Settings(redis_url=url, stream_prefix="agents"))
    warm = {"type": "spawn", "event_id": "warm", "project_id": "p", "session_id": "warm",
            "agent_instance_id": "a"}
    await applier.apply(0, [("1-0", {b"data": orjson.dumps(warm)})])
    if floor:
        await redis.function_load(
            "#!lua name=returns_1\nredis.register_function('returns_1', function() return 1 end)")
    report = {}
    for seq, kind in enumerate(("spawn", "pause", "resume", "terminate"), start=1):
        entries = []
        for n in range(sessions):
            body = {"type": kind, "event_id": f"s{n}-{seq}", "project_id": "bench",
                    "session_id": f"s{n}", "agent_instance_id": "a", "seq": seq}
            if kind == "spawn":
                body["initial_state"] = {f"k{i}": {"v": i, "note": "x" * 20} for i in range(4)}
            entries.append((f"{seq}-{n + 1}", {b"data": orjson.dumps(body)}))
        row = {}
        if floor:
            calls = [["FCALL", "returns_1", *c[2:]] for c in applier.plan(0, entries).commands]

            async def call_only():
                for k in range(0, len(calls), 200):
                    pipe = redis.pipeline(transaction=False)
                    for c in calls[k:k + 200]:
                        pipe.execute_command(*c)
                    await pipe.execute()

            row["floor"] = await counted(call_only) / sessions
            row["arguments"] = sum(len(c) - 3 for c in calls) / sessions

        async def apply():
            for k in range(0, sessions, 200):
                outcomes = await applier.apply(0, entries[k:k + 200])
                assert all(o.status == "applied" for o in outcomes), outcomes[:2]

        row["total"] = await counted(apply) / sessions
        report[kind] = row
    await applier.close()
    await redis.aclose()
    print(json.dumps(report))

asyncio.run(main())
"""


def measure(binary: str, tree: Path, sessions: int, floor: bool) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "callgrind.out")
        server = subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}.%p",
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                tmp,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 60
            while (
                subprocess.run(
                    ["redis-cli", "-p", str(port), "ping"], capture_output=True, check=False
                ).stdout.strip()
                != b"PONG"
            ):
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("redis-server under valgrind did not start")
                time.sleep(0.2)
            runner = [sys.executable, "-c", RUNNER, str(port), str(server.pid), out]
            done = subprocess.run(
                [*runner, str(sessions), "1" if floor else "0"],
                env=dict(os.environ, PYTHONPATH=str(tree)),
                cwd=tree,
                capture_output=True,
                text=True,
                check=False,
                timeout=3600,
            )
            if done.returncode != 0:
                raise RuntimeError(f"runner failed in {tree}: {done.stderr[-2000:]}")
            result: dict[str, Any] = __import__("json").loads(done.stdout.splitlines()[-1])
            return result
        finally:
            server.terminate()
            server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", default="0102ab1", help="the earlier commit")
    parser.add_argument("--sessions", type=int, default=500)
    parser.add_argument("--server-binary", default=None)
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "redis-cli"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (Debian: valgrind, redis-tools)")
    binary = server_binary(args.server_binary)
    with earlier_checkout(args.before) as tree:
        before = measure(binary, tree, args.sessions, floor=False)
    after = measure(binary, ROOT, args.sessions, floor=True)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
    print(f"Command: `{invocation()}`")
    print()
    print(
        f"{version.stdout.split(' sha=')[0]} under valgrind callgrind · {args.sessions:,} sessions "
        f"per command type · before = commit {args.before}, after = this checkout · "
        "instructions the server executed ÷ commands (repeatable to ~1 %, whatever else runs)"
    )
    print()
    rows = []
    for kind in PHASES:
        b, a = before[kind]["total"], after[kind]
        rows.append(
            [
                kind,
                f"{b / 1000:,.1f}k",
                f"{a['total'] / 1000:,.1f}k",
                f"{a['total'] / b:.3f}×",
                f"{a['arguments']:.1f}",
                f"{a['floor'] / 1000:,.1f}k",
            ]
        )
    b_avg = sum(before[k]["total"] for k in PHASES) / len(PHASES)
    a_avg = sum(after[k]["total"] for k in PHASES) / len(PHASES)
    f_avg = sum(after[k]["floor"] for k in PHASES) / len(PHASES)
    rows.append(
        [
            "**average of the four**",
            f"**{b_avg / 1000:,.1f}k**",
            f"**{a_avg / 1000:,.1f}k**",
            f"**{a_avg / b_avg:.3f}×**",
            "",
            f"{f_avg / 1000:,.1f}k",
        ]
    )
    header = [
        "command",
        "instructions before",
        "after",
        "ratio",
        "keys + arguments",
        "after: a function returning 1, same keys and arguments",
    ]
    print(markdown_table(header, rows, "lrrrrr"))


if __name__ == "__main__":
    main()
