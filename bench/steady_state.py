"""Steady state: Redis bytes a session leaves, Redis CPU per command, and what one GB of Redis
sustains at default settings — for an earlier commit of the worker and this checkout, in the
same run.

    .venv/bin/python bench/steady_state.py [--before 0102ab1] [--sessions 10000] [--rounds 2] \\
        [--server-binary PATH]

Each version runs in a subprocess (the earlier one from a temporary git worktree on
``PYTHONPATH``) against its own private ``redis-server`` on a free port, so nothing else runs
on that server and its ``INFO cpu`` is this bench's alone. With default settings it drives
``--sessions`` sessions through four phases, one command type each — spawn (4 small
variables), pause, resume, terminate (the defaults: consolidate, cleanup) — through the real
``LifecycleWorker``: the phase's commands are published first, then a worker is started and
stopped once every result is in. The sessions go through in ``--waves`` waves, so finished
sessions accumulate while a wave is live, as in a steady state (Redis's key tables are then
sized by what stays, not by one big wave's live keys). Per phase it reads:

- **Redis µs per command**: ``INFO cpu`` (``used_cpu_sys`` + ``used_cpu_user``) delta ÷
  commands, everything the server did (reads, scripts, replies, the network); and
  ``INFO commandstats`` ``cmdstat_fcall`` (``cmdstat_evalsha`` for a version that applied by
  script) ``usec`` delta ÷ commands, the apply calls alone (one call per command before
  a call applied a batch of up to 64).
- **worker commands/s**: results ÷ the time between the phase's first and last result
  (stream ids), so the worker's start-up is left out.
- **bytes per stream entry**: ``MEMORY USAGE`` of the lifecycle and results streams ÷ entries;
  the streams are then deleted (as retention would trim them).

Bytes per live session (after the spawn phase) and per finished session (after terminate) are
``INFO memory`` ``used_memory`` deltas (clients' buffers left out) ÷ sessions, cross-checked with
``MEMORY USAGE`` of every key left, ÷ sessions.

**Sustained commands/s per GB** = 1e9 ÷ Σ (bytes held per command × seconds held), with each
version's own default windows: the lifecycle and results entries of a command are held for
``MEMWORKER_RETENTION_SECONDS`` (+ one trim interval, the worst case), a finished session's
bytes ÷ its 4 commands for the longest of the dedupe and tombstone windows. A live session's
own bytes are left out (they depend on how long agents run, not on the rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import earlier_checkout, invocation, markdown_table
from memory_footprint import private_server, server_binary

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("spawn", "pause", "resume", "terminate")

RUNNER = r"""
import asyncio, json, sys, uuid, orjson
from redis.asyncio import Redis
from worker.keys import StreamKeys
try:  # this checkout, or an earlier one (--before) from before the packages
    from worker.consumers.groups import ensure_group
    from worker.lifecycle.worker import LifecycleWorker
except ImportError:
    from worker.lifecycle import LifecycleWorker, ensure_group
from worker.logs import configure_logging
from worker.settings import Settings

PHASES = ("spawn", "pause", "resume", "terminate")


async def used_memory(redis):
    await redis.connection_pool.disconnect()
    last = -1
    for _ in range(50):
        await asyncio.sleep(0.1)
        info = await redis.info("memory")
        reading = int(info["used_memory"]) - int(info["mem_clients_normal"])
        if reading == last:
            break
        last = reading
    return last


def ms_of(entry_id):
    return int(entry_id.decode().partition("-")[0])


async def phase(redis, settings, streams, kind, seq, first, count):
    await ensure_group(redis, streams.lifecycle, "lifecycle")
    pipe = redis.pipeline(transaction=False)
    for n in range(first, first + count):
        body = {"type": kind, "event_id": f"s{n}-{seq}", "project_id": "bench",
                "session_id": f"s{n}", "agent_instance_id": "a", "seq": seq}
        if kind == "spawn":
            body["initial_state"] = {f"k{i}": {"v": i, "note": "x" * 20} for i in range(4)}
        pipe.xadd(streams.lifecycle, {"data": orjson.dumps(body)})
        if len(pipe) >= 2000:
            await pipe.execute()
    await pipe.execute()
    cpu0 = await redis.info("cpu")
    cmd0 = await redis.info("commandstats")
    worker = LifecycleWorker(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    while int(await redis.xlen(streams.results)) < count:
        await asyncio.sleep(0.01)
    stop.set()
    await task
    cpu1 = await redis.info("cpu")
    cmd1 = await redis.info("commandstats")
    cpu = sum(float(cpu1[k]) - float(cpu0[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    first_id = (await redis.xrange(streams.results, count=1))[0][0]
    last_id = (await redis.xrevrange(streams.results, count=1))[0][0]
    span = max(ms_of(last_id) - ms_of(first_id), 1) / 1000
    entries = int(await redis.xlen(streams.lifecycle)) + int(await redis.xlen(streams.results))
    stream_bytes = 0
    for name in (streams.lifecycle, streams.results):
        stream_bytes += int(await redis.memory_usage(name, samples=0) or 0)
    await redis.delete(streams.lifecycle, streams.results, streams.dlq)
    calls = {}
    for name, row in cmd1.items():
        done = int(row["calls"]) - int(cmd0.get(name, {"calls": 0})["calls"])
        usec = int(row["usec"]) - int(cmd0.get(name, {"usec": 0})["usec"])
        if done:
            calls[name.removeprefix("cmdstat_")] = [done, usec]
    return {"calls": calls, "count": count, "cpu": cpu, "span": span, "entries": entries,
            "stream_bytes": stream_bytes}


def per_command(runs):
    # One phase's figures over every wave.
    count = sum(r["count"] for r in runs)
    calls = {}
    for r in runs:
        for name, (done, usec) in r["calls"].items():
            calls.setdefault(name, [0, 0])
            calls[name][0] += done
            calls[name][1] += usec
    ev = calls.get("fcall") or calls["evalsha"]  # a function since FCALL, a script before
    return {
        "calls": {name: [done / count, usec / count] for name, (done, usec) in calls.items()},
        "cpu_us": sum(r["cpu"] for r in runs) * 1e6 / count,
        "evalsha_us": ev[1] / count,  # per command: a call applies up to 64 of them now
        "rate": sum(r["count"] - 1 for r in runs) / sum(r["span"] for r in runs),
        "entry_bytes": sum(r["stream_bytes"] for r in runs) / sum(r["entries"] for r in runs),
        "command_bytes": sum(r["stream_bytes"] for r in runs) / count,
    }


async def keys_left(redis, prefix):
    count, usage = 0, 0
    async for key in redis.scan_iter(match=prefix + ":*", count=5000):
        count += 1
        usage += int(await redis.memory_usage(key, samples=0) or 0)
    return count, usage


async def main(url, sessions, waves):
    configure_logging("WARNING")
    redis = Redis.from_url(url)
    prefix = "agents"  # the default, on a private server
    settings = Settings(redis_url=url, stream_prefix=prefix)
    streams = StreamKeys(prefix, 0)
    warm = 200
    for seq, kind in enumerate(PHASES, start=1):
        await phase(redis, settings, streams, kind, seq, 0, warm)
    warm_keys, warm_usage = await keys_left(redis, prefix)
    before = await used_memory(redis)
    out = {}
    runs = {kind: [] for kind in PHASES}
    size = sessions // waves
    for wave in range(waves):
        first = warm + wave * size
        for seq, kind in enumerate(PHASES, start=1):
            runs[kind].append(await phase(redis, settings, streams, kind, seq, first, size))
            if kind == "spawn" and wave == 0:
                out["live_bytes"] = (await used_memory(redis) - before) / size
    for kind in PHASES:
        out[kind] = per_command(runs[kind])
    sessions = size * waves
    out["finished_bytes"] = (await used_memory(redis) - before) / sessions
    n_keys, usage = await keys_left(redis, prefix)
    out["finished_keys"] = (n_keys - warm_keys) / sessions
    out["finished_usage"] = (usage - warm_usage) / sessions
    out["retention"] = settings.retention_seconds + settings.retention_interval_seconds
    out["tombstone"] = max(settings.tombstone_ttl_seconds, settings.dedupe_ttl_seconds)
    out["dedupe"] = settings.dedupe_ttl_seconds
    info = await redis.info("server")
    out["server"] = "redis " + str(info["redis_version"])
    await redis.aclose()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def measure(tree: Path, url: str, sessions: int, waves: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, url, str(sessions), str(waves)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    if done.returncode != 0:
        raise RuntimeError(f"runner failed in {tree}: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def one_round(binary: str, tree: Path, sessions: int, waves: int) -> dict[str, Any]:
    async with private_server(binary) as url:
        return await asyncio.to_thread(measure, tree, url, sessions, waves)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every figure over the rounds."""
    out: dict[str, Any] = {}
    for key, value in rounds[0].items():
        if key == "calls":  # per phase: {command: [calls, µs]} of the last round
            out[key] = rounds[-1][key]
        elif isinstance(value, dict):
            out[key] = {
                k: rounds[-1][key][k] if k == "calls" else median([r[key][k] for r in rounds])
                for k in value
            }
        elif isinstance(value, int | float):
            out[key] = median([float(r[key]) for r in rounds])
        else:
            out[key] = value
    return out


def byte_seconds(run: dict[str, Any]) -> tuple[float, float, float]:
    """Bytes·seconds held per command: stream entries, finished-session bookkeeping, total."""
    streams = sum(run[k]["command_bytes"] for k in PHASES) / len(PHASES) * run["retention"]
    bookkeeping = run["finished_bytes"] / len(PHASES) * run["tombstone"]
    return streams, bookkeeping, streams + bookkeeping


def duration(seconds: float) -> str:
    if seconds >= 86_400:
        return f"{seconds / 86_400:g} d"
    if seconds >= 3_600:
        return f"{seconds / 3_600:g} h"
    return f"{seconds / 60:g} min"


def report(args: argparse.Namespace, before: dict[str, Any], after: dict[str, Any]) -> None:
    print(f"command: `{invocation()}`")
    print()
    print(
        f"{os.cpu_count()} CPUs · private {after['server']} per version and round · "
        f"{args.sessions:,} sessions × 4 commands per version in {args.waves} waves, default "
        "settings, median of "
        f"{args.rounds} rounds · before = commit {args.before}, after = this checkout · "
        "ratios compare the two within this run (the machine is shared: absolute µs are noisy)"
    )
    print()
    rows = []
    for kind in PHASES:
        b, a = before[kind], after[kind]
        rows.append(
            [
                kind,
                f"{b['cpu_us']:.1f}",
                f"{a['cpu_us']:.1f}",
                f"{b['evalsha_us']:.1f}",
                f"{a['evalsha_us']:.1f}",
                f"{b['rate']:,.0f}",
                f"{a['rate']:,.0f}",
                f"{a['rate'] / b['rate']:.2f}×",
            ]
        )
    b_cpu = sum(before[k]["cpu_us"] for k in PHASES) / len(PHASES)
    a_cpu = sum(after[k]["cpu_us"] for k in PHASES) / len(PHASES)
    b_ev = sum(before[k]["evalsha_us"] for k in PHASES) / len(PHASES)
    a_ev = sum(after[k]["evalsha_us"] for k in PHASES) / len(PHASES)
    b_rate = len(PHASES) / sum(1 / before[k]["rate"] for k in PHASES)
    a_rate = len(PHASES) / sum(1 / after[k]["rate"] for k in PHASES)
    rows.append(
        [
            "**average of the four**",
            f"**{b_cpu:.1f}**",
            f"**{a_cpu:.1f}**",
            f"{b_ev:.1f}",
            f"{a_ev:.1f}",
            f"{b_rate:,.0f}",
            f"{a_rate:,.0f}",
            f"**{a_rate / b_rate:.2f}×**",
        ]
    )
    header = [
        "command",
        "Redis CPU µs/cmd before",
        "after",
        "apply calls µs/cmd before",
        "after",
        "worker cmd/s before",
        "after",
        "throughput ratio",
    ]
    print(markdown_table(header, rows, "lrrrrrrr"))
    print()
    b_s, b_k, b_total = byte_seconds(before)
    a_s, a_k, a_total = byte_seconds(after)
    mem_rows = [
        [
            "bytes per live session (spawned, 4 variables; `used_memory` Δ)",
            f"{before['live_bytes']:,.0f} B",
            f"{after['live_bytes']:,.0f} B",
        ],
        [
            "bytes per finished session, streams trimmed (`used_memory` Δ)",
            f"{before['finished_bytes']:,.0f} B",
            f"**{after['finished_bytes']:,.0f} B**",
        ],
        [
            "… `MEMORY USAGE` of the keys it leaves / how many keys",
            f"{before['finished_usage']:,.0f} B / {before['finished_keys']:g}",
            f"{after['finished_usage']:,.0f} B / {after['finished_keys']:g}",
        ],
        [
            "… held for (longest of dedupe and tombstone windows)",
            duration(before["tombstone"]),
            duration(after["tombstone"]),
        ],
        [
            "bytes per stream entry (lifecycle + results, average of the four)",
            f"{sum(before[k]['entry_bytes'] for k in PHASES) / 4:,.0f} B",
            f"{sum(after[k]['entry_bytes'] for k in PHASES) / 4:,.0f} B",
        ],
        [
            "stream bytes per command (its command + its result)",
            f"{sum(before[k]['command_bytes'] for k in PHASES) / 4:,.0f} B",
            f"{sum(after[k]['command_bytes'] for k in PHASES) / 4:,.0f} B",
        ],
        [
            "… held for (retention + one trim interval)",
            duration(before["retention"]),
            duration(after["retention"]),
        ],
        [
            "bytes·s per command: streams + bookkeeping",
            f"{b_s:,.0f} + {b_k:,.0f}",
            f"{a_s:,.0f} + {a_k:,.0f}",
        ],
        [
            "**sustained commands/s per GB of Redis** (1e9 ÷ bytes·s per command)",
            f"**{1e9 / b_total:,.1f}**",
            f"**{1e9 / a_total:,.0f}**",
        ],
    ]
    print(
        markdown_table(["at each version's default settings", "before", "after"], mem_rows, "lrr")
    )
    print()
    breakdown(f"Before ({args.before})", before)
    breakdown("After (this checkout)", after)


def breakdown(label: str, run: dict[str, Any]) -> None:
    """Where a version's Redis time goes: `INFO commandstats` per command type ÷ commands.
    Commands a script calls are counted too (inside its EVALSHA's time)."""
    names = sorted(
        {n for k in PHASES for n in run[k]["calls"]},
        key=lambda n: -sum(run[k]["calls"].get(n, [0, 0])[1] for k in PHASES),
    )
    rows = []
    for name in names:
        cells = []
        for kind in PHASES:
            calls, usec = run[kind]["calls"].get(name, [0.0, 0.0])
            cells.append(f"{calls:.2f} · {usec:.2f}" if calls else "")
        if any(run[k]["calls"].get(name, [0, 0])[1] >= 0.05 for k in PHASES):
            rows.append([f"`{name}`", *cells])
    print(f"{label}: calls per command · µs per command (`INFO commandstats`, wall time of each")
    print("call, so a script's µs include those of the commands it calls):")
    print()
    print(markdown_table(["command", *PHASES], rows, "lrrrr"))
    print()


async def server_cpu(redis: Any) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def script_costs(binary: str, sessions: int) -> list[tuple[str, float]]:
    """Redis CPU per call (``INFO cpu`` Δ ÷ calls) of this checkout's apply function cut short
    at successive points, with the real KEYS/ARGV of ``sessions`` spawns (4 small variables),
    pipelined 500 at a time from one client: what the call itself, binding its keys and
    arguments, the set-up and the work each cost; and the same code run as an ``EVALSHA``
    script (the previous form: every definition re-made on every call)."""
    import orjson
    from redis.asyncio import Redis

    from worker.lifecycle.apply import CommandApplier
    from worker.scripts import function
    from worker.settings import Settings

    apply = function("apply_command.lua")
    source = apply.source

    def cut(marker: str) -> str:
        if source.count(marker) != 1:
            raise SystemExit(f"apply_command.lua changed: no single {marker!r} to cut at")
        return source.replace(marker, "if op then return {'cut', ''} end\n  " + marker)

    returns_1 = (
        f"#!lua name={apply.function}\n"
        f"redis.register_function('{apply.function}', function() return 1 end)"
    )
    as_script = source.split("\n", 1)[1].replace(
        f"redis.register_function{{function_name = '{apply.function}', callback = apply}}",
        "return apply(KEYS, ARGV)",
    )
    cuts = [
        ("FCALL of a function returning 1, with the same KEYS and ARGV", returns_1, "fcall"),
        (
            "+ binding its keys and arguments",
            cut("if op == 'terminate' then\n    -- Also every other field"),
            "fcall",
        ),
        (
            "+ the set-up: one HMGET (state, seq, the record), dedupe check, seq rule",
            cut("if op == 'reject' then"),
            "fcall",
        ),
        ("+ its work: the whole spawn of a new session", source, "fcall"),
        ("the same spawns again (duplicates: HMGET, XACK)", source, "fcall"),
        ("the same code as an EVALSHA script, new sessions (the previous form)", as_script, "eval"),
    ]
    out: list[tuple[str, float]] = []
    async with private_server(binary) as url:
        redis = Redis.from_url(url)
        try:
            settings = Settings(redis_url=url, stream_prefix="costs")
            applier = CommandApplier(redis, settings)

            def spawns(tag: str) -> list[list[Any]]:
                entries = []
                for n in range(sessions):
                    body = {
                        "type": "spawn",
                        "event_id": f"{tag}{n}-1",
                        "project_id": "bench",
                        "session_id": f"{tag}{n}",
                        "agent_instance_id": "a",
                        "seq": 1,
                        "initial_state": {f"k{i}": {"v": i, "note": "x" * 20} for i in range(4)},
                    }
                    entries.append((f"{n + 1}-0", {b"data": orjson.dumps(body)}))
                return [c[2:] for c in applier.plan(0, entries).commands]  # numkeys, keys, argv

            calls = spawns("s")
            # The first pass of a big library runs while Lua's heap (and its GC pace) is still
            # growing: warm it with an unmeasured pass of the set-up cut.
            for n, (label, body_source, kind) in enumerate([cuts[2], *cuts]):
                name = f"costs_{n}"
                if kind == "fcall":
                    await redis.function_load(body_source.replace(apply.function, name))  # type: ignore[misc]
                else:
                    name = await redis.script_load(body_source)
                    calls = spawns("e")  # new sessions, as the full fcall spawn had
                started = await server_cpu(redis)
                pipe = redis.pipeline(transaction=False)
                for call in calls:
                    pipe.execute_command("FCALL" if kind == "fcall" else "EVALSHA", name, *call)
                    if len(pipe) >= 500:
                        await pipe.execute()
                await pipe.execute()
                out.append((label, (await server_cpu(redis) - started) * 1e6 / sessions))
            out.pop(0)
        finally:
            await redis.aclose()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", default="0102ab1", help="the earlier commit")
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--waves", type=int, default=5, help="sessions run in this many waves")
    parser.add_argument("--server-binary", default=None)
    args = parser.parse_args()
    binary = server_binary(args.server_binary)
    befores: list[dict[str, Any]] = []
    afters: list[dict[str, Any]] = []
    with earlier_checkout(args.before) as tree:
        for _ in range(args.rounds):  # alternate, so noise hits both alike
            befores.append(await one_round(binary, tree, args.sessions, args.waves))
            afters.append(await one_round(binary, ROOT, args.sessions, args.waves))
    costs = await script_costs(binary, args.sessions)
    report(args, combine(befores), combine(afters))
    print(
        "Where a spawn's Redis time goes (this checkout, same private server kind, "
        f"{args.sessions:,} calls per row, `INFO cpu` Δ ÷ calls; no worker: one pipelining "
        "client):"
    )
    print()
    rows, last = [], 0.0
    for n, (label, cost) in enumerate(costs):
        added = f"{cost - last:+.1f}" if 0 < n < 4 else ""
        rows.append([label, f"{cost:.1f}", added])
        last = cost
    print(markdown_table(["call", "Redis CPU µs/call", "adds"], rows, "lrr"))


if __name__ == "__main__":
    asyncio.run(main())
