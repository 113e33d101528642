"""What `make stack-test` checks against the running compose stack, from the host.

    python deploy/stack_check.py roundtrip     spawn + terminate, the results, the episode in
                                               Postgres, the episode recalled by meaning
    python deploy/stack_check.py kill-worker   traffic while one worker container is SIGKILLed:
                                               every command gets exactly one result, every
                                               session its episode

Commands go in through the published Redis port as the orchestrators' ACL user `publisher`
(LifecycleClient, as `memworker publish` does); Postgres is read through its published port as
the runtime role; recall runs inside the indexer's container (`memworker recall`, the model in
the image). Ports and passwords are docker-compose.yml's defaults unless the environment says
otherwise (MEMWORKER_REDIS_PORT, MEMWORKER_POSTGRES_PORT, ...). Exit status 0 when every check
passed, else 1 with one line saying what failed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from redis.asyncio import Redis

from worker.keys import StreamKeys
from worker.lifecycle.client import LifecycleClient
from worker.settings import Settings

PREFIX = "agents"


def env(name: str, default: str) -> str:
    return os.environ.get(name) or default


REDIS_URL = (
    f"redis://publisher:{env('REDIS_PUBLISHER_PASSWORD', 'dev-publisher-change-me')}"
    f"@127.0.0.1:{env('MEMWORKER_REDIS_PORT', '16379')}/0"
)
POSTGRES_DSN = (
    f"postgresql://memworker_runtime:{env('MEMWORKER_RUNTIME_PASSWORD', 'dev-runtime-change-me')}"
    f"@127.0.0.1:{env('MEMWORKER_POSTGRES_PORT', '15432')}/memworker"
)


class CheckFailedError(Exception):
    """One of the checks failed: the message says which and what was seen."""


def say(message: str) -> None:
    print(f"  {message}", flush=True)


def client() -> LifecycleClient:
    return LifecycleClient(settings=Settings(redis_url=REDIS_URL, stream_prefix=PREFIX))


async def wait_for(what: str, probe: Any, timeout: float) -> Any:
    """``await probe()`` until it returns something truthy, else fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise CheckFailedError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.5)


async def run(*args: str) -> str:
    """Run a command (``docker …``); its output, or fail with its error."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    if proc.returncode != 0:
        raise CheckFailedError(f"{' '.join(args[:4])}: {err.decode().strip()[-500:]}")
    return out.decode()


# -- roundtrip ---------------------------------------------------------------------------------

TASK = "repair the continuous deployment job"
LESSON = "pin the base image digest so deploys are reproducible"
QUERY = "make software releases repeatable"
"""Shares no word with the episode's text: only its meaning can find it."""


async def roundtrip() -> None:
    project, session = f"stack-{uuid.uuid4().hex[:8]}", "s-roundtrip"
    async with client() as lifecycle:
        spawned = await lifecycle.wait(
            await lifecycle.spawn(project, session, "agent-1", {"goal": TASK}), timeout=30
        )
        if spawned.type != "agent.spawned":
            raise CheckFailedError(f"spawn answered {spawned.type}: {spawned}")
        say(f"spawn     → {spawned.type} ({spawned.event_id})")
        ended = await lifecycle.wait(
            await lifecycle.terminate(
                project,
                session,
                "agent-1",
                outcome="success",
                task_description=TASK,
                lessons_learned=[LESSON],
            ),
            timeout=30,
        )
        if ended.type != "agent.terminated":
            raise CheckFailedError(f"terminate answered {ended.type}: {ended}")
        say(f"terminate → {ended.type} ({ended.event_id})")

    conn = await asyncpg.connect(POSTGRES_DSN)
    try:

        async def episode() -> Any:
            return await conn.fetchrow(
                "SELECT id, outcome, lessons_learned FROM episodes"
                " WHERE project_id = $1 AND session_id = $2",
                project,
                session,
            )

        row = await wait_for("the episode in Postgres", episode, 60)
        say(f"episode   {row['id']} in Postgres (outcome {row['outcome']})")
    finally:
        await conn.close()

    async def recalled() -> dict[str, Any] | None:
        out = await run(
            "docker", "compose", "exec", "-T", "indexer", "memworker", "recall", QUERY,
            "-p", project, "--json",
        )  # fmt: skip
        hits = [h for h in json.loads(out) if h["session_id"] == session]
        # found through its vector: a similarity and a rank among the vector hits
        found = [h for h in hits if h["similarity"] is not None and h["vector_rank"] is not None]
        return found[0] if found else None

    hit = await wait_for("the episode recalled by meaning", recalled, 60)
    say(
        f"recall    {QUERY!r} → the episode, similarity {hit['similarity']:.3f}"
        f" (vector rank {hit['vector_rank']}, word rank {hit['text_rank']})"
    )


# -- kill-worker -------------------------------------------------------------------------------

SESSIONS = 150


async def kill_worker() -> None:
    """Spawn and terminate SESSIONS sessions; SIGKILL one worker container once a third of
    the results are in, while commands are still being published."""
    project = f"stack-kill-{uuid.uuid4().hex[:8]}"
    sent: list[str] = []
    results_stream = StreamKeys(PREFIX, 0).results  # MEMWORKER_SHARDS is 1 in the stack
    reader = Redis.from_url(REDIS_URL)
    killed = asyncio.Event()

    async def results_count() -> int:
        return int(await reader.xlen(results_stream))

    async with client() as lifecycle:
        baseline = await results_count()

        async def publish_all() -> None:
            for i in range(SESSIONS):
                session = f"s-{i:04d}"
                sent.append(await lifecycle.spawn(project, session, "agent-1", {"n": i}))
                sent.append(
                    await lifecycle.terminate(
                        project, session, "agent-1", outcome="success", lessons_learned=[f"l{i}"]
                    )
                )
                if not killed.is_set():
                    await asyncio.sleep(0.02)  # spread the traffic over the kill

        async def kill_when_a_third_is_in() -> None:
            await wait_for(
                "a third of the results",
                lambda: _at_least(results_count, baseline + (2 * SESSIONS) // 3),
                120,
            )
            victim = (await run("docker", "compose", "ps", "-q", "worker")).split()[0]
            await run("docker", "kill", "--signal", "KILL", victim)
            killed.set()
            say(f"SIGKILL   worker container {victim[:12]} after {len(sent)} commands published")
            print(f"KILLED {victim}", flush=True)

        await asyncio.gather(publish_all(), kill_when_a_third_is_in())
        say(f"published {len(sent)} commands ({SESSIONS} sessions)")

    wanted = set(sent)

    async def every_result() -> Counter[str] | None:
        seen: Counter[str] = Counter()
        entries: Any = await reader.xrange(results_stream)
        for _id, fields in entries:
            data = json.loads(fields[b"data"])
            if data.get("causation_id") in wanted:
                seen[data["causation_id"]] += 1
        return seen if set(seen) == wanted else None

    started = time.monotonic()
    try:
        seen = await wait_for("a result for every command", every_result, 180)
    except CheckFailedError:
        partial = await _partial(reader, results_stream, wanted)
        raise CheckFailedError(
            f"{len(wanted) - partial} of {len(wanted)} commands have no result after 180 s"
        ) from None
    finally:
        await reader.aclose()
    twice = {k: n for k, n in seen.items() if n != 1}
    if twice:
        raise CheckFailedError(f"{len(twice)} commands have more than one result: {twice}")
    say(
        f"results   exactly one for each of the {len(wanted)} commands"
        f" ({time.monotonic() - started:.0f} s after the last publish)"
    )

    conn = await asyncpg.connect(POSTGRES_DSN)
    try:

        async def episodes() -> bool:
            n = await conn.fetchval("SELECT count(*) FROM episodes WHERE project_id = $1", project)
            return int(n) == SESSIONS

        await wait_for(f"{SESSIONS} episodes in Postgres", episodes, 120)
        say(f"episodes  {SESSIONS} in Postgres, one per session")
    finally:
        await conn.close()


async def _at_least(count: Any, n: int) -> bool:
    return bool(await count() >= n)


async def _partial(reader: Redis, stream: str, wanted: set[str]) -> int:
    entries: Any = await reader.xrange(stream)
    return len({json.loads(f[b"data"]).get("causation_id") for _i, f in entries} & wanted)


def main() -> None:
    checks = {"roundtrip": roundtrip, "kill-worker": kill_worker}
    if len(sys.argv) != 2 or sys.argv[1] not in checks:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(checks)}")
    try:
        asyncio.run(checks[sys.argv[1]]())
    except CheckFailedError as exc:
        sys.exit(f"stack check failed: {exc}")


if __name__ == "__main__":
    main()
