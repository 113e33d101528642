"""What every bench script shares: default server URLs, the command line that produced a table,
percentiles, markdown tables, ``memworker`` subprocesses, a throw-away database, key cleanup.

Not a bench itself; ``bench/report.py`` runs the scripts that import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from worker.db.migrate import migrate
from worker.settings import asyncpg_url

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
BENCH_DIR = Path(__file__).resolve().parent
BASELINES = BENCH_DIR / "baselines.py"
KINDS = ("spawn", "pause", "resume", "terminate")
_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@/\s]+@")


def hide_passwords(line: str) -> str:
    """``scheme://user:secret@host`` → ``scheme://user:***@host``."""
    return _PASSWORD.sub(r"\1***@", line)


def invocation() -> str:
    """The command line that is running, as someone would type it from the project root."""
    python = Path(sys.executable)
    with contextlib.suppress(ValueError):
        python = python.relative_to(Path.cwd())
    words = [str(python), *sys.argv]
    return hide_passwords(" ".join(shlex.quote(w) for w in words))


def cancel_on_sigterm() -> None:
    """Cancel the running task on SIGTERM, so a bench stopped by ``report.py`` (or anyone)
    still runs its ``finally`` blocks: stops its services, deletes its keys, drops its
    database. Call it first thing in the bench's main coroutine."""
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


def unique_prefix(name: str) -> str:
    return f"bench-{name}-{uuid.uuid4().hex[:8]}"


def percentile(samples: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0–100) of ``samples``: the sample at rank ``q% × (n − 1)``, rounded
    (no interpolation); NaN when there are none."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str) -> str:
    """``align`` holds one letter per column: ``l`` (text) or ``r`` (figures)."""
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *[[str(cell) for cell in row] for row in rows]]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def ratio(value: float, baseline: float) -> str:
    if baseline == 0 or value != value or baseline != baseline:  # NaN guard
        return "n/a"
    share = value / baseline
    return f"{share:.2f}×" if share >= 0.1 else f"{share:.2g}×"


def command(
    kind: str, session: int, seq: int, project: str = "bench", **extra: Any
) -> dict[str, Any]:
    """A lifecycle command of the kind the benches send (spawn loads 10 variables; terminate
    asks for an episode)."""
    body: dict[str, Any] = {
        "type": kind,
        "event_id": f"s{session}-{seq}",
        "project_id": project,
        "session_id": f"s{session}",
        "agent_instance_id": f"agent-{session}",
        "seq": seq,
        **extra,
    }
    if kind == "spawn":
        body["initial_state"] = {f"k{i}": {"v": i, "note": "x" * 20} for i in range(10)}
    elif kind == "terminate":
        body["task_description"] = f"bench session {session}"
        body["lessons_learned"] = ["measure before optimising"]
    return body


async def cleanup(redis: Redis, prefix: str) -> None:
    """Delete every key under ``prefix``."""
    keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=5000)]
    for i in range(0, len(keys), 5000):
        await redis.unlink(*keys[i : i + 5000])


async def ensure_group(redis: Redis, stream: str, group: str, start: str = "0") -> None:
    try:
        await redis.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def consumers(redis: Redis, stream: str, group: str) -> int:
    try:
        rows: Any = await redis.xinfo_consumers(stream, group)
    except ResponseError:  # no stream or no group yet
        return 0
    return len(rows)


async def wait_for_consumers(
    redis: Redis,
    streams: Sequence[str],
    group: str,
    count: int,
    procs: Sequence[subprocess.Popen[bytes]],
    timeout: float = 60.0,
) -> None:
    """Until every stream has ``count`` consumers in ``group`` (the services are reading)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = [await consumers(redis, s, group) for s in streams]
        if all(n >= count for n in seen):
            return
        for proc in procs:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}: {err[-2000:]}")
        if time.monotonic() > deadline:
            states = [(p.pid, p.poll()) for p in procs]
            raise TimeoutError(
                f"{group} consumers on {streams}: {seen}, wanted {count}; processes {states}"
            )
        await asyncio.sleep(0.05)


def service_env(
    redis_url: str, prefix: str, database_url: str | None = None, **extra: str
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "REDIS_URL": redis_url,
            "MEMWORKER_STREAM_PREFIX": prefix,
            "MEMWORKER_LOG_JSON": "true",
            "MEMWORKER_LOG_LEVEL": "WARNING",
            **extra,
        }
    )
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return env


def memworker_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "worker.cli", *args]


def baseline_command(*args: str) -> list[str]:
    return [sys.executable, str(BASELINES), *args]


@contextlib.contextmanager
def services(
    commands: Sequence[Sequence[str]], env: dict[str, str]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Run ``commands`` as subprocesses for the block; SIGTERM them after (SIGKILL if stuck)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in commands:
            procs.append(
                subprocess.Popen(
                    list(cmd), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
            )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()


def rss_kb(pid: int) -> int:
    """Resident set size of a process (``VmRSS``), in kB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (``memworker run --workers N`` runs N of them)."""
    out: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid …; comm may hold spaces, so split after its ')'.
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                out.append(int(stat.parent.name))
    return out


@contextlib.asynccontextmanager
async def fresh_database(database_url: str) -> AsyncIterator[str]:
    """A new, migrated database on the server of ``database_url``; dropped afterwards."""
    admin_url = asyncpg_url(database_url)
    name = "memworker_bench_" + uuid.uuid4().hex[:8]
    admin = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        try:
            await migrate(url)
            yield url
        finally:
            async with admin.connect() as conn:
                await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


def stream_ms(entry_id: bytes | str) -> int:
    """The millisecond timestamp in a stream entry id."""
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.split("-", 1)[0])


@contextlib.contextmanager
def earlier_checkout(commit: str) -> Iterator[Path]:
    """A temporary git worktree of this repository at ``commit`` (removed afterwards), for
    running an earlier version of the worker beside this checkout in one run."""
    import tempfile

    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="memworker-before-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(root), "worktree", "add", "--detach", str(tree), commit],
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "-C", str(root), "worktree", "remove", "--force", str(tree)],
                check=False,
                capture_output=True,
            )
