"""Hostile input, property-based: junk entries and commands with ids full of glob and key
syntax, huge and deeply nested state, thousands of keys, one project's ids used against
another's sessions. One ``memworker run`` process per test takes everything hypothesis throws.

For every entry: the worker stays up, and the entry gets exactly one result (applied or
rejected) or one DLQ entry. Nothing crosses projects: results carry the command's own project,
the state of each (project, session) follows the state machine run on that project's commands
alone, and every key the worker created names valid ids only.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis import Redis
from redis.exceptions import ResponseError

from tests.faults.support import log_errors, start_worker, stop_worker
from worker.ids import is_valid_id, is_valid_write_id
from worker.keys import LIFECYCLE_GROUP, StreamKeys
from worker.settings import Settings

pytestmark = pytest.mark.faults

REASONS = {
    "invalid_event",
    "unsupported_version",
    "unknown_session",
    "already_exists",
    "already_terminated",
    "invalid_transition",
    "checkpoint_not_found",
    "limit_exceeded",
    "stale_seq",
}
EXAMPLES = hypothesis_settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=False,
)


@dataclass
class Accounting:
    """What one published entry turned into."""

    entry_id: str
    event_id: str | None
    result: dict[str, Any] | None = None
    dead: dict[str, str] | None = None


@dataclass
class HostileHarness:
    """A worker process and a plain Redis client: publish entries, wait until the worker has
    dealt with every one of them, and say what each became."""

    settings: Settings
    redis: Redis
    proc: subprocess.Popen[bytes]
    log: Path
    results_from: str = "0-0"
    dlq_from: str = "0-0"
    published: int = 0
    seen_keys: set[str] = field(default_factory=set)

    @property
    def streams(self) -> StreamKeys:
        return StreamKeys(self.settings.stream_prefix, 0)

    def send(self, entries: list[dict[bytes, bytes]], timeout: float = 30.0) -> list[Accounting]:
        ids = [
            self.redis.xadd(self.streams.lifecycle, fields).decode()  # type: ignore[arg-type,union-attr]
            for fields in entries
        ]
        self.published += len(ids)
        self._settle(ids[-1], timeout)
        out = [Accounting(i, _event_id(f)) for i, f in zip(ids, entries, strict=True)]
        by_entry = {a.entry_id: a for a in out}
        by_event = {a.event_id: a for a in out if a.event_id is not None}
        rows: Any = self.redis.xrange(self.streams.results, min=f"({self.results_from}")
        for entry_id, fields in rows:
            self.results_from = entry_id.decode()
            result = orjson.loads(fields[b"data"])
            owner = by_event.get(result["causation_id"])
            assert owner is not None, f"a result for a command nobody sent: {result}"
            assert owner.result is None, f"two results for one command: {result}"
            orjson.dumps(result)  # a subscriber can re-encode it (orjson: at most 255 levels)
            owner.result = result
        rows = self.redis.xrange(self.streams.dlq, min=f"({self.dlq_from}")
        for entry_id, fields in rows:
            self.dlq_from = entry_id.decode()
            letter = {k.decode(): v.decode() for k, v in fields.items()}
            owner = by_entry.get(letter["source_id"])
            assert owner is not None, f"a dead letter for an entry nobody sent: {letter}"
            assert owner.dead is None, f"two dead letters for one entry: {letter}"
            owner.dead = letter
        for item in out:
            assert (item.result is None) != (item.dead is None), (
                f"entry {item.entry_id} (event_id {item.event_id!r:.40}) got "
                f"result={item.result is not None}, dead letter={item.dead is not None}"
            )
        return out

    def _settle(self, last_id: str, timeout: float) -> None:
        """Wait until the group has read past ``last_id`` and nothing is pending."""
        deadline = time.monotonic() + timeout
        last = _id(last_id)
        while True:
            assert self.proc.poll() is None, "the worker crashed: " + _tail(self.log)
            groups: Any = self.redis.xinfo_groups(self.streams.lifecycle)
            group = next(g for g in groups if g["name"] == LIFECYCLE_GROUP.encode())
            if _id(group["last-delivered-id"].decode()) >= last and not int(group["pending"]):
                return
            assert time.monotonic() < deadline, f"entries still pending after {timeout}s: " + _tail(
                self.log
            )
            time.sleep(0.01)

    def assert_key_names_are_well_formed(self) -> None:
        """Every key the worker created names valid ids: no glob, no newline, no 129 chars."""
        prefix = re.escape(self.settings.stream_prefix)
        ident = r"[A-Za-z0-9._:-]{1,128}"
        allowed = re.compile(
            rf"^{prefix}:(?:(?:lifecycle|results|dlq):\{{0\}}"
            rf"|\{{0\}}:evt:(?:{ident}|!)/{ident}"
            rf"|\{{0\}}:s:{ident}/{ident}:(?:meta|vars|vexp|task|scratch|cps|cpdata))$"
        )
        for key in self.redis.scan_iter(match=f"{self.settings.stream_prefix}:*", count=1000):
            name = key.decode()
            assert allowed.match(name), f"unexpected key {name!r}"


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _tail(log: Path) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return text[-2000:]


def _event_id(fields: dict[bytes, bytes]) -> str | None:
    """The event_id the worker should find, if any (else the entry is a dead letter)."""
    data = fields.get(b"data")
    if data is None:
        return None
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError:
        # JSON orjson refuses but Python's reader takes, holding a text no store can (a NUL, a
        # lone surrogate), is answered invalid_event naming it; any other is dead-lettered
        try:
            raw = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if not _holds_bad_text(raw):
            return None
    if not isinstance(raw, dict):
        return None
    event_id = raw.get("event_id")
    return event_id if is_valid_id(event_id) else None


def _holds_bad_text(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(_holds_bad_text(k) or _holds_bad_text(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_bad_text(v) for v in value)
    return False


@pytest.fixture
def hostile(settings: Settings, tmp_path: Path) -> Iterator[HostileHarness]:
    tuned = settings.model_copy(
        update={"seq_gap_timeout_seconds": 0.3, "seq_retry_ms": 50, "block_ms": 20}
    )
    redis = Redis.from_url(tuned.redis_url)
    try:
        redis.xgroup_create(
            StreamKeys(tuned.stream_prefix, 0).lifecycle, LIFECYCLE_GROUP, "0", True
        )
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    log = tmp_path / "worker.log"
    proc = start_worker(
        tuned,
        "hostile",
        log,
        MEMWORKER_SEQ_GAP_TIMEOUT_SECONDS="0.3",
        MEMWORKER_SEQ_RETRY_MS="50",
        MEMWORKER_BLOCK_MS="20",
        MEMWORKER_LOG_LEVEL="ERROR",
    )
    harness = HostileHarness(tuned, redis, proc, log)
    try:
        yield harness
        assert proc.poll() is None, "the worker crashed: " + _tail(log)
        harness.assert_key_names_are_well_formed()
        assert log_errors(log) == [], log_errors(log)[:3]
    finally:
        stop_worker(proc)
        keys = list(redis.scan_iter(match=f"{tuned.stream_prefix}:*", count=1000))
        for i in range(0, len(keys), 1000):
            redis.unlink(*keys[i : i + 1000])
        redis.close()


# -- strategies ------------------------------------------------------------------------------

HOSTILE_IDS = [
    "*",
    "?",
    "[",
    "]",
    "{",
    "}",
    "{0}",
    ":",
    "..",
    "../..",
    "a\nb",
    "\n",
    "x" * 129,
    "x" * 128,
    "",
    " ",
    "p1*",
    "*:*",
    "a/b",
    "\\",
    "ü",
    "\x00",
    "s:meta",
    "t:{0}:s:p/s",
]
hostile_ids = st.one_of(
    st.sampled_from(HOSTILE_IDS),
    st.text(alphabet=st.sampled_from(list("ab*?[]{}:./\\\n -_")), max_size=24),
    st.text(alphabet="ab:.", min_size=126, max_size=131),
    st.integers(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
ids = st.one_of(st.sampled_from(["p1", "p2", "s1", "s2", "a1"]), hostile_ids)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
odd_numbers = st.one_of(
    st.none(),
    st.integers(min_value=-5, max_value=6),
    st.integers(min_value=2**31, max_value=2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.text(max_size=4),
)


def _json(value: Any) -> bytes:
    """Python's encoder: it writes integers beyond 64 bits and Infinity, as some clients do."""
    return json.dumps(value).encode()


@st.composite
def hostile_command(draw: st.DrawFn) -> dict[bytes, bytes]:
    body: dict[str, Any] = {
        "type": draw(st.sampled_from(["spawn", "pause", "resume", "terminate", "fly", "", None])),
        "event_id": "h" + uuid.uuid4().hex,
        "project_id": draw(ids),
        "session_id": draw(ids),
        "agent_instance_id": draw(ids),
    }
    optional = {
        "seq": odd_numbers,
        "checkpoint_id": hostile_ids,
        "agent_type_id": hostile_ids,
        "correlation_id": st.one_of(st.text(max_size=140), st.integers()),
        "metadata": json_values,
        "initial_state": st.one_of(
            st.dictionaries(st.text(max_size=10), json_values, max_size=6), json_values
        ),
        "ttl_seconds": odd_numbers,
        "schema_version": odd_numbers,
        "outcome": st.sampled_from(["success", "failure", "partial", "abandoned", "nope", ""]),
        "importance": odd_numbers,
        "tokens_used": odd_numbers,
        "lessons_learned": st.one_of(st.lists(st.text(max_size=20), max_size=3), json_values),
        "clear_current": odd_numbers,
        "occurred_at": st.one_of(st.text(max_size=30), st.just("2024-01-01T00:00:00Z")),
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True, max_size=5)):
        body[name] = draw(optional[name])
    fields = {b"data": _json(body)}
    if draw(st.booleans()):
        fields[b"traceparent"] = draw(st.binary(max_size=60)) or b"x"
    return fields


junk_entries = st.one_of(
    st.binary(max_size=200).map(lambda b: {b"data": b}),
    st.binary(min_size=1, max_size=200).map(lambda b: {b"__data__": b}),
    st.just({b"other": b"field"}),
    json_values.map(lambda v: {b"data": _json(v)}),
    st.dictionaries(st.text(max_size=10), json_values, max_size=4).map(
        lambda d: {b"data": _json(d)}
    ),
    hostile_ids.filter(lambda e: not is_valid_id(e)).map(
        lambda e: {b"data": _json({"event_id": e, "type": "spawn", "project_id": "p1"})}
    ),
)


# -- tests -----------------------------------------------------------------------------------


@EXAMPLES
@given(st.lists(st.one_of(hostile_command(), junk_entries), min_size=1, max_size=8))
@example(  # found by hypothesis: orjson refuses Infinity, the worker reads it and answers
    entries=[
        {
            b"data": b'{"type": "spawn", "event_id": "e1", "project_id": "p1", "session_id":'
            b' "s1", "agent_instance_id": "a", "metadata": Infinity, "\\u0000": 1}'
        }
    ]
)
def test_junk_and_hostile_commands_each_get_a_result_a_rejection_or_a_dead_letter(
    hostile: HostileHarness, entries: list[dict[bytes, bytes]]
) -> None:
    for item, fields in zip(hostile.send(entries), entries, strict=True):
        if item.result is None:
            continue
        result = item.result
        try:  # as Python's reader reads it: Infinity, NaN and integers past 64 bits included
            sent = json.loads(fields[b"data"])
        except (KeyError, ValueError):  # no data, or no JSON at all: answered, naming nothing
            assert result["type"] == "command.rejected" and result["reason"] in REASONS
            continue
        if not isinstance(sent, dict):
            sent = {}
        for name in ("project_id", "session_id"):
            # A result names the command's own project and session, or none when invalid (the
            # write rule: '.' and '..' are no session's and no project's either).
            assert result[name] == (sent.get(name) if is_valid_write_id(sent.get(name)) else None)
        if result["type"] == "command.rejected":
            assert result["reason"] in REASONS
            assert result["detail"]
        else:
            assert is_valid_write_id(sent["project_id"]) and is_valid_write_id(sent["session_id"])


PROJECTS = ("p", "p:q")
SESSIONS = ("q:s", "s")
"""Pairs that would collide if ids were joined with ':' ("p" + "q:s" vs "p:q" + "s")."""
EXPECTED = {
    ("spawn", None): ("agent.spawned", "active"),
    ("spawn", "active"): ("already_exists", "active"),
    ("spawn", "paused"): ("already_exists", "paused"),
    ("spawn", "terminated"): ("already_terminated", "terminated"),
    ("pause", None): ("unknown_session", None),
    ("pause", "active"): ("agent.paused", "paused"),
    ("pause", "paused"): ("invalid_transition", "paused"),
    ("pause", "terminated"): ("already_terminated", "terminated"),
    ("resume", None): ("unknown_session", None),
    ("resume", "active"): ("invalid_transition", "active"),
    ("resume", "paused"): ("agent.resumed", "active"),
    ("resume", "terminated"): ("already_terminated", "terminated"),
    ("terminate", None): ("unknown_session", None),
    ("terminate", "active"): ("agent.terminated", "terminated"),
    ("terminate", "paused"): ("agent.terminated", "terminated"),
    ("terminate", "terminated"): ("already_terminated", "terminated"),
}


@EXAMPLES
@given(
    st.lists(
        st.tuples(
            st.sampled_from(PROJECTS),
            st.sampled_from(SESSIONS),
            st.sampled_from(["spawn", "pause", "resume", "terminate"]),
        ),
        min_size=1,
        max_size=14,
    )
)
def test_one_projects_ids_never_reach_another_projects_session(
    hostile: HostileHarness, steps: list[tuple[str, str, str]]
) -> None:
    run = uuid.uuid4().hex[:8]
    model: dict[tuple[str, str], str | None] = {}
    expected: list[str] = []
    entries: list[dict[bytes, bytes]] = []
    for n, (project, session, kind) in enumerate(steps):
        sid = f"{session}-{run}"
        before = model.get((project, sid))
        outcome, after = EXPECTED[(kind, before)]
        model[(project, sid)] = after
        expected.append(outcome)
        body: dict[str, Any] = {
            "type": kind,
            "event_id": f"x{run}-{n}",
            "project_id": project,
            "session_id": sid,
            "agent_instance_id": "a",
        }
        if kind == "spawn":
            body["initial_state"] = {"owner": project, f"only-{project}": True}
        entries.append({b"data": orjson.dumps(body)})
    got = hostile.send(entries)
    actual = [
        (r["type"] if r["type"] != "command.rejected" else r["reason"])
        for r in (item.result or {"type": "dead", "reason": "dead"} for item in got)
    ]
    assert actual == expected
    for item in got:
        result = item.result
        assert result is not None
        if result["type"] == "agent.terminated":
            variables = result["snapshot"]["variables"]
            assert variables == {
                "owner": result["project_id"],
                f"only-{result['project_id']}": True,
            }
    for (project, sid), state in model.items():
        meta = hostile.redis.hget(
            f"{hostile.settings.stream_prefix}:{{0}}:s:{project}/{sid}:meta", "state"
        )
        assert (meta.decode() if isinstance(meta, bytes) else None) == state


def _deep(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def _raw(**fields: Any) -> dict[bytes, bytes]:
    body = {"agent_instance_id": "a", "project_id": "p1", **fields}
    return {b"data": orjson.dumps(body)}


def test_extreme_commands_are_applied_or_rejected_and_the_worker_keeps_going(
    hostile: HostileHarness,
) -> None:
    s = hostile.settings
    big_keys = {f"k{i}": i for i in range(s.max_keys_per_session)}
    entries = [
        _raw(type="spawn", event_id="keys-10000", session_id="many", initial_state=big_keys),
        _raw(
            type="spawn",
            event_id="keys-10001",
            session_id="too-many",
            initial_state={**big_keys, "one-more": 1},
        ),
        _raw(
            type="spawn",
            event_id="huge-value",
            session_id="huge",
            initial_state={"blob": "x" * (s.max_value_bytes + 1)},
        ),
        _raw(
            type="spawn",
            event_id="huge-event",
            session_id="huge2",
            initial_state={f"b{i}": "y" * 300_000 for i in range(4)},
        ),
        _raw(type="pause", event_id="pause-many", session_id="many"),
        _raw(type="resume", event_id="resume-many", session_id="many"),
        _raw(type="terminate", event_id="term-many", session_id="many"),
    ]
    for depth in (100, 252, 253, 254, 255, 1000):
        for where in ("initial_state", "metadata"):
            name = f"deep-{where}-{depth}"
            text = (
                f'{{"type":"spawn","event_id":"{name}","project_id":"p1",'
                f'"session_id":"{name}","agent_instance_id":"a","{where}":{{"d":{_deep(depth)}}}}}'
            )
            entries.append({b"data": text.encode()})
    for depth in (100, 252, 253, 254, 255, 1000):
        name = f"deep-initial_state-{depth}"
        entries.append(_raw(type="terminate", event_id=f"end-{depth}", session_id=name))
    entries.append({b"data": _deep(1000).encode()})
    entries.append({b"data": ("[" * 100_000 + "]" * 100_000).encode()})
    for bad in HOSTILE_IDS:
        if is_valid_id(bad):
            continue
        for name in ("project_id", "session_id", "agent_instance_id", "checkpoint_id"):
            entries.append(
                {
                    b"data": orjson.dumps(
                        {
                            "type": "spawn" if name != "checkpoint_id" else "pause",
                            "event_id": "bad-" + uuid.uuid4().hex,
                            "project_id": "p1",
                            "session_id": "many",
                            "agent_instance_id": "a",
                            name: bad,
                        }
                    )
                }
            )
    got = {item.event_id or item.entry_id: item for item in hostile.send(entries, timeout=60)}

    def result(event_id: str) -> dict[str, Any]:
        found = got[event_id].result
        assert found is not None, got[event_id].dead
        return found

    assert result("keys-10000")["type"] == "agent.spawned"
    assert result("keys-10000")["initial_items"] == s.max_keys_per_session
    assert result("keys-10001")["reason"] == "limit_exceeded"
    assert result("huge-value")["reason"] == "limit_exceeded"
    assert result("huge-event")["reason"] == "limit_exceeded"
    assert result("pause-many")["items_saved"] >= s.max_keys_per_session
    assert result("resume-many")["type"] == "agent.resumed"
    terminated = result("term-many")
    assert len(terminated["snapshot"]["variables"]) == s.max_keys_per_session
    for depth in (100, 252, 253, 254, 255, 1000):
        for where in ("initial_state", "metadata"):
            out = result(f"deep-{where}-{depth}")
            assert out["type"] in ("agent.spawned", "command.rejected"), out
            if out["type"] == "command.rejected":
                assert out["reason"] == "invalid_event"
    for depth in (100, 252, 253, 254, 255, 1000):
        spawned = result(f"deep-initial_state-{depth}")["type"] == "agent.spawned"
        ended = result(f"end-{depth}")
        assert ended["type"] == ("agent.terminated" if spawned else "command.rejected")
    for item in got.values():
        if item.event_id and item.event_id.startswith("bad-"):
            assert item.result is not None and item.result["reason"] == "invalid_event"
    # The session the hostile ids aimed at is untouched by them.
    meta = hostile.redis.hgetall(f"{s.stream_prefix}:{{0}}:s:p1/many:meta")
    assert meta[b"state"] == b"terminated"  # type: ignore[index]
