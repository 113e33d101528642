"""What `make cluster-test` drives and checks against the cluster stack, from the host.

    python deploy/cluster_check.py load

A steady load of lifecycle sessions (spawn, pause, resume, terminate, with seq) over the 12
shards, and user-memory remembers and recalls through the HTTP API alongside, while it
SIGKILLs one Redis master's container (its replica is promoted), then a worker container, then
a consolidator, then restarts Postgres. It behaves as docs/contract.md ("Failover") tells an
orchestrator to: each command's result is awaited, and a command without one in time is
republished with the same event id. The verdict: every command answered exactly once, every
session's results in seq order and none rejected, every session's episode in Postgres once,
every acknowledged remember present once, nothing dead-lettered; the figures: seconds without
progress after the master died, retries, commands per second before / during / after.

Redis is reached at the cluster nodes' own addresses (the compose network's bridge is the
host's), as the ACL user `publisher`; Postgres and the API through their published ports.
Exit status 0 when every check passed, else 1 with one line per failed check.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import resource
import sys
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import httpx
from redis.asyncio.cluster import RedisCluster

from worker.connections import client_for
from worker.keys import StreamKeys, shard_of, tag
from worker.lifecycle.client import LifecycleClient, NotReplicatedError
from worker.settings import Settings

PREFIX = "agents"
SHARDS = int(os.environ.get("MEMWORKER_SHARDS", "12"))
CONCURRENCY = int(os.environ.get("CLUSTER_TEST_SESSIONS", "120"))
"""Sessions alive at once, each waiting for every command's result before its next one."""
ANSWER_TIMEOUT = 10.0
"""Seconds to wait for a result before republishing the command with the same event id."""
SCHEDULE = [
    (20, "kill-master"),
    (50, "kill-worker"),
    (70, "kill-consolidator"),
    (90, "restart-postgres"),
]
LOAD_SECONDS = 120
CPU_WINDOW = (4.0, 18.0)
"""Seconds of the load (before any fault) over which where the CPU goes is measured."""


def env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def say(message: str) -> None:
    print(f"  {message}", flush=True)


async def run(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:5])}: {err.decode().strip()[-300:]}")
    return out.decode()


async def container_ip(service: str) -> str:
    cid = (await run("docker", "compose", "ps", "-q", service)).split()[0]
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    return (await run("docker", "inspect", "-f", fmt, cid)).strip()


class Load:
    def __init__(self, redis_url: str) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.settings = Settings(
            redis_url=redis_url, redis_cluster=True, shards=SHARDS, stream_prefix=PREFIX
        )
        # a publish to a node that died without a reset fails within seconds and is retried
        publisher: Any = client_for(self.settings, socket_timeout=5, socket_connect_timeout=2)
        self.client = LifecycleClient(publisher, self.settings)
        # a read of a node that died without a reset fails after 5 s, not never
        self.reader: Any = RedisCluster.from_url(redis_url, socket_timeout=5)
        self.futures: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.sent: list[str] = []
        self.sessions: list[str] = []
        self.done_at: list[float] = []  # monotonic time of each answered command
        self.done_on: list[int] = []  # the shard of each
        self.dead_shards: set[int] = set()  # the killed master's
        self.publish_retries = 0
        self.at_risk = 0
        self.errors = Counter[str]()
        self.republished = 0
        self.remembered: list[str] = []
        self.remember_retries = 0
        self.recalls = Counter[str]()
        self.stop = asyncio.Event()  # no new session, no new remember
        self.quit = asyncio.Event()  # the result followers stop
        self.t0 = time.monotonic()
        self.events: list[tuple[float, str]] = []

    # -- results -------------------------------------------------------------------------------
    async def follow(self, shard: int) -> None:
        stream = StreamKeys(PREFIX, shard).results
        last = "$"
        try:
            entries = await self.reader.xrevrange(stream, count=1)
            last = entries[0][0].decode() if entries else "0-0"
        except Exception:
            last = "0-0"
        while not self.quit.is_set():
            try:
                reply = await self.reader.xread({stream: last}, count=1000, block=1000)
            except Exception:
                await asyncio.sleep(0.2)
                continue
            for _s, entries in reply or []:
                for entry_id, fields in entries:
                    last = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                    data = json.loads(fields[b"data"])
                    future = self.futures.get(data.get("causation_id", ""))
                    if future is not None and not future.done():
                        future.set_result(data)

    # -- lifecycle sessions --------------------------------------------------------------------
    async def command(self, body: dict[str, Any], shard: int) -> None:
        event_id = body["event_id"]
        self.sent.append(event_id)
        future = self.futures[event_id] = asyncio.get_running_loop().create_future()
        first = True
        while True:
            while True:
                try:
                    await self.client.publish(body, replicas=1, replicas_timeout=0.5)
                    break
                except NotReplicatedError:
                    self.at_risk += 1  # published; its master has no replica now
                    break
                except Exception as exc:  # a failover: unreachable, CLUSTERDOWN, MOVED, …
                    self.errors[type(exc).__name__ + ": " + str(exc)[:80]] += 1
                    self.publish_retries += 1
                    await asyncio.sleep(0.2)
            if not first:
                self.republished += 1
            first = False
            try:
                await asyncio.wait_for(asyncio.shield(future), ANSWER_TIMEOUT)
                break
            except TimeoutError:
                continue  # republish with the same event id (docs/contract.md, Failover)
        self.done_at.append(time.monotonic())
        self.done_on.append(shard)
        del self.futures[event_id]

    async def session_loop(self, worker: int) -> None:
        """Sessions one after another, all on shard ``worker % SHARDS``: a steady load on every
        shard (a loop whose sessions went anywhere would end up waiting on the dead master's
        shards, and load the others no more)."""
        n, shard = 0, worker % SHARDS
        while not self.stop.is_set():
            session = f"s-{worker}-{n}"
            n += 1
            if shard_of(f"cl-{self.run_id}", session, SHARDS) != shard:
                continue
            self.sessions.append(session)
            base = {"project_id": f"cl-{self.run_id}", "session_id": session,
                    "agent_instance_id": "a"}  # fmt: skip
            for kind in ("spawn", "pause", "resume", "terminate"):
                body: dict[str, Any] = {
                    **base,
                    "type": kind,
                    "event_id": f"{self.run_id}-{session}-{kind}",
                }
                if kind == "spawn":
                    body["initial_state"] = {"n": n}
                if kind == "terminate":
                    body["lessons_learned"] = [f"lesson {session}"]
                await self.command(body, shard)

    # -- user memory ---------------------------------------------------------------------------
    async def remember_loop(self, http: httpx.AsyncClient, worker: int) -> None:
        n = 0
        while not self.stop.is_set():
            turn = f"{self.run_id}-t-{worker}-{n}"
            n += 1
            body = {"session_id": f"chat-{worker}", "id": turn, "user_id": f"u{worker}",
                    "input": f"question {n} of {worker}", "output": f"answer {n}"}  # fmt: skip
            while not self.stop.is_set():
                try:
                    reply = await http.post("/v1/remember", json=body, timeout=10)
                    if reply.status_code == 200:
                        self.remembered.append(turn)
                        break
                except httpx.HTTPError:
                    pass
                self.remember_retries += 1
                await asyncio.sleep(0.5)
            if n % 5 == 0:
                try:
                    reply = await http.post(
                        "/v1/recall", json={"query": "answer", "user_id": f"u{worker}"}, timeout=10
                    )
                    self.recalls[str(reply.status_code)] += 1
                except httpx.HTTPError as exc:
                    self.recalls[type(exc).__name__] += 1
            await asyncio.sleep(0.05)

    # -- the faults ----------------------------------------------------------------------------
    async def faults(self) -> None:
        for at, what in SCHEDULE:
            await asyncio.sleep(max(0.0, self.t0 + at - time.monotonic()))
            if what == "kill-master":
                victim = await self.master_to_kill()
                await run("docker", "kill", "--signal", "KILL", victim)
                say(f"t={self.now():.0f}s SIGKILL Redis master container {victim}")
            elif what in ("kill-worker", "kill-consolidator"):
                service = what.split("-", 1)[1]
                cid = (await run("docker", "compose", "ps", "-q", service)).split()[0]
                await run("docker", "kill", "--signal", "KILL", cid)
                say(f"t={self.now():.0f}s SIGKILL {service} container {cid[:12]}")
            else:
                await run("docker", "compose", "restart", "--timeout", "10", "postgres")
                say(f"t={self.now():.0f}s restarted postgres")
            self.events.append((self.now(), what))

    async def master_to_kill(self) -> str:
        """A master other than `redis` (the nodes' seed in every REDIS_URL): its container."""
        await self.reader.initialize()
        masters = {str(node.host) for node in self.reader.get_primaries()}
        for service in ("redis-2", "redis-3", "redis-4", "redis-5", "redis-6"):
            if (ip := await container_ip(service)) in masters:
                self.dead_shards = {
                    shard
                    for shard in range(SHARDS)
                    if str(self.reader.get_node_from_key(tag(shard)).host) == ip
                }
                return (await run("docker", "compose", "ps", "-q", service)).split()[0][:12]
        raise RuntimeError(f"no master other than the seed among {masters}")

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- where the CPU goes ----------------------------------------------------------------------
    async def cpu_profile(self) -> None:
        """Over ``CPU_WINDOW``: the machine's busy share (/proc/stat), this driver's own CPU
        (getrusage) and each service's containers (``docker stats``, one ~2 s sample in the
        middle), against the commands answered in the window."""
        start, end = CPU_WINDOW
        await asyncio.sleep(max(0.0, self.t0 + start - time.monotonic()))
        (busy0, total0), own0 = machine_cpu(), own_cpu()
        await asyncio.sleep(max(0.0, self.t0 + (start + end) / 2 - 1 - time.monotonic()))
        try:
            services = await service_cpu()
        except Exception as exc:  # a figure, not a check
            say(f"cpu       docker stats failed: {exc}")
            services = {}
        await asyncio.sleep(max(0.0, self.t0 + end - time.monotonic()))
        (busy1, total1), own1 = machine_cpu(), own_cpu()
        cores = os.cpu_count() or 1
        seconds = end - start
        answered = sum(1 for t in self.done_at if start <= t - self.t0 < end)
        rate = answered / seconds
        machine = (busy1 - busy0) / max(total1 - total0, 1) * cores
        driver = (own1 - own0) / seconds
        say(f"cpu       t={start:g}..{end:g}s: {rate:.0f} commands/s; machine busy "
            f"{machine:.2f} of {cores} cores; this driver {driver:.2f} cores")  # fmt: skip
        ranked = sorted(services.items(), key=lambda item: -item[1])
        shares = " ".join(f"{name} {pct / 100:.2f}" for name, pct in ranked)
        say(f"cpu       containers (cores, docker stats): {shares}")
        if rate:
            say(f"cpu       per command: {machine / rate * 1000:.2f} ms of the machine's CPU, "
                f"{driver / rate * 1000:.2f} ms of it this driver's")  # fmt: skip


def machine_cpu() -> tuple[float, float]:
    """The machine's (busy, total) CPU time so far, in clock ticks (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]
    return float(sum(ticks) - idle), float(sum(ticks))


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def service_cpu() -> dict[str, float]:
    """Per compose service (the six Redis nodes as one), its containers' CPU, in percent of
    one core."""
    out = await run("docker", "stats", "--no-stream", "--format", "{{.Name}} {{.CPUPerc}}")
    project = os.environ.get("COMPOSE_PROJECT_NAME", "memworker-cluster-test")
    shares: dict[str, float] = defaultdict(float)
    for line in out.splitlines():
        name, pct = line.split()
        service = name.removeprefix(project + "-").rsplit("-", 1)[0]
        shares["redis" if service.startswith("redis") else service] += float(pct.rstrip("%"))
    return shares


async def load() -> int:
    seed = await container_ip("redis")
    password = env("REDIS_PUBLISHER_PASSWORD", "dev-publisher-change-me")
    state = Load(f"redis://publisher:{password}@{seed}:6379/0")
    api = f"http://127.0.0.1:{env('MEMWORKER_API_PORT', '8080')}"
    token = env("MEMWORKER_API_TOKEN", "dev-api-token-change-me")
    http = httpx.AsyncClient(base_url=api, headers={"Authorization": f"Bearer {token}"})
    followers = [asyncio.create_task(state.follow(s)) for s in range(SHARDS)]
    await asyncio.sleep(1.0)
    state.t0 = time.monotonic()
    work = [asyncio.create_task(state.session_loop(w)) for w in range(CONCURRENCY)]
    work += [asyncio.create_task(state.remember_loop(http, w)) for w in range(4)]
    faults = asyncio.create_task(state.faults())
    profile = asyncio.create_task(state.cpu_profile())
    await asyncio.sleep(LOAD_SECONDS)
    await faults
    await profile
    state.stop.set()
    say(f"t={state.now():.0f}s load stopped; finishing the sessions in flight")
    _done, left = await asyncio.wait(work, timeout=300)
    state.quit.set()
    await asyncio.gather(*followers)
    await http.aclose()
    failures = [f"{len(left)} session loops unfinished after 300 s"] if left else []
    figures(state)  # first: a failing check below must not hide them
    try:
        failures += await verdict(state)
    except Exception as exc:  # a check that could not run is a failed check
        failures.append(f"the verdict could not be finished: {type(exc).__name__}: {exc}")
    await state.client.close()
    await state.reader.aclose()
    for line in failures:
        print(f"cluster check failed: {line}", flush=True)
    return 1 if failures else 0


async def verdict(state: Load) -> list[str]:
    failures: list[str] = []
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for shard in range(SHARDS):
        entries = await state.reader.xrange(StreamKeys(PREFIX, shard).results)
        for _id, fields in entries:
            data = json.loads(fields[b"data"])
            if str(data.get("project_id")) == f"cl-{state.run_id}":
                results[data["session_id"]].append(data)
    counts = Counter(r["causation_id"] for rs in results.values() for r in rs)
    missing = set(state.sent) - set(counts)
    twice = {k: n for k, n in counts.items() if n != 1}
    if missing:
        failures.append(f"{len(missing)} commands without a result, e.g. {sorted(missing)[:3]}")
    if twice:
        failures.append(f"{len(twice)} commands answered more than once: {list(twice)[:3]}")
    disorder = [
        s for s, rs in results.items() if [r["seq"] for r in rs] != sorted(r["seq"] for r in rs)
    ]
    rejected = [r for rs in results.values() for r in rs if r["type"] == "command.rejected"]
    if disorder:
        failures.append(f"{len(disorder)} sessions' results out of seq order: {disorder[:3]}")
    if rejected:
        failures.append(
            f"{len(rejected)} commands rejected, e.g. {rejected[0].get('reason')}: "
            f"{rejected[0].get('detail')}"
        )
    say(f"commands  {len(state.sent)} sent, {len(counts)} answered, none twice: {not twice}")
    # the DLQ as `operator` (the publisher may not read it)
    operator_password = env("REDIS_OPERATOR_PASSWORD", "dev-operator-change-me")
    seed = state.settings.redis_url.rsplit("@", 1)[1]
    operator: Any = RedisCluster.from_url(f"redis://operator:{operator_password}@{seed}")
    try:
        for shard in range(SHARDS):
            dead = await operator.xlen(StreamKeys(PREFIX, shard).dlq)
            if dead:
                failures.append(f"{dead} dead letters on shard {shard}")
    finally:
        await operator.aclose()
    dsn = (
        "postgresql://memworker_runtime:"
        f"{env('MEMWORKER_RUNTIME_PASSWORD', 'dev-runtime-change-me')}"
        f"@127.0.0.1:{env('MEMWORKER_POSTGRES_PORT', '15432')}/memworker"
    )
    conn = await asyncpg.connect(dsn)
    try:
        finished = {
            s for s, rs in results.items() if any(r["type"] == "agent.terminated" for r in rs)
        }
        deadline = time.monotonic() + 120
        while True:
            rows = await conn.fetch(
                "SELECT session_id, count(*) AS n FROM episodes WHERE project_id = $1 GROUP BY 1",
                f"cl-{state.run_id}",
            )
            episodes = {r["session_id"]: r["n"] for r in rows}
            if set(episodes) >= finished or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        if finished - set(episodes):
            failures.append(f"{len(finished - set(episodes))} finished sessions without an episode")
        if any(n != 1 for n in episodes.values()):
            failures.append("a session has more than one episode")
        say(f"episodes  {len(episodes)} for {len(finished)} finished sessions, one each")
        rows = await conn.fetch(
            "SELECT turn_id, count(*) AS n FROM episodes WHERE turn_id LIKE $1 GROUP BY 1",
            f"{state.run_id}-t-%",
        )
        turns = {r["turn_id"]: r["n"] for r in rows}
        lost = set(state.remembered) - set(turns)
        if lost:
            failures.append(f"{len(lost)} acknowledged remembers missing, e.g. {sorted(lost)[:3]}")
        if any(n != 1 for n in turns.values()):
            failures.append("a remembered turn is stored more than once")
        say(
            f"remembers {len(state.remembered)} acknowledged, {len(turns)} stored, "
            f"none lost: {not lost}"
        )
    finally:
        await conn.close()
    return failures


def figures(state: Load) -> None:
    times = sorted(t - state.t0 for t in state.done_at)
    kill = next((t for t, what in state.events if what == "kill-master"), None)
    say(f"at risk   {state.at_risk} publishes no replica confirmed within 0.5 s (WAIT)")
    say(f"retries   {state.publish_retries} publishes retried, {state.republished} commands "
        f"republished after {ANSWER_TIMEOUT:g} s without a result, {state.remember_retries} "
        f"remembers retried; recalls {dict(state.recalls)}")  # fmt: skip
    if kill is not None:
        live = sorted(set(range(SHARDS)) - state.dead_shards)
        for name, shards in (("live", live), ("dead", sorted(state.dead_shards))):
            after = sorted(
                t - state.t0
                for t, s in zip(state.done_at, state.done_on, strict=True)
                if s in shards and t - state.t0 >= kill
            )
            gaps = [b - a for a, b in zip([kill, *after], after, strict=False)]
            say(
                f"stall     {max(gaps, default=0):.1f} s without an answered command after the "
                f"master died, on the {name} masters' shards {shards}"
            )

    def rate(a: float, b: float) -> str:
        n = sum(1 for t in times if a <= t < b)
        return f"{n / max(b - a, 1e-9):.0f}/s"

    marks = [0.0] + [t for t, _ in state.events] + [LOAD_SECONDS]
    names = ["before"] + [f"after {w}" for _, w in state.events]
    for (a, b), name in zip(itertools.pairwise(marks), names, strict=False):
        say(f"rate      {name:<26} t={a:5.0f}..{b:5.0f}s {rate(a, b)} commands answered")
    curve = Counter(int(t // 5) * 5 for t in times)
    say("curve     " + " ".join(f"{k}:{curve[k] // 5}" for k in sorted(curve)))


def main() -> None:
    if sys.argv[1:] != ["load"]:
        sys.exit(f"usage: {sys.argv[0]} load")
    sys.exit(asyncio.run(load()))


if __name__ == "__main__":
    main()
