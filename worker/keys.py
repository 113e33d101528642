"""Where everything lives in Redis.

Every key of a session carries its shard's hash tag ``{i}``, so one Lua script may touch the
session's keys and the shard's streams together, on a Redis Cluster too. Project and session
ids may contain ``:``, so they are joined with ``/`` (not an id character) to keep two
different (project, session) pairs from ever naming the same key.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

from worker.ids import ID_CHARS, validate_id

LIFECYCLE = "lifecycle"
RESULTS = "results"
DLQ = "dlq"
EPISODES = "episodes"

LIFECYCLE_GROUP = "lifecycle"
CONSOLIDATION_GROUP = "consolidation"


def shard_of(project_id: str, session_id: str, shards: int) -> int:
    """The contract's shard function: zlib CRC-32 of ``project/session`` mod ``shards``."""
    return zlib.crc32(f"{project_id}/{session_id}".encode()) % shards


def tag(shard: int) -> str:
    return "{" + str(shard) + "}"


@dataclass(frozen=True, slots=True)
class StreamKeys:
    """Names of the streams of one shard."""

    prefix: str
    shard: int

    @property
    def lifecycle(self) -> str:
        return f"{self.prefix}:{LIFECYCLE}:{tag(self.shard)}"

    @property
    def results(self) -> str:
        return f"{self.prefix}:{RESULTS}:{tag(self.shard)}"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}:{DLQ}:{tag(self.shard)}"

    @property
    def admission(self) -> str:
        """Present (with the reason) while the worker refuses new publishes: Redis is past
        maxmemory less MEMWORKER_ADMISSION_RESERVE (see ``LifecycleWorker.admission_once``)."""
        return f"{self.prefix}:admission:{tag(self.shard)}"

    def dedupe(self, project_id: str, event_id: str) -> str:
        """The record that a command was applied (or rejected): its result's stream id."""
        return f"{self.prefix}:{tag(self.shard)}:evt:{project_id}/{event_id}"


def episodes_stream(prefix: str) -> str:
    return f"{prefix}:{EPISODES}"


def episodes_dlq(prefix: str) -> str:
    """The indexer's DLQ (``P:dlq:episodes``: ``P:episodes`` is not sharded)."""
    return f"{prefix}:{DLQ}:{EPISODES}"


def changes_dlq(prefix: str) -> str:
    """The change feed's followers' DLQ (``P:dlq:changes``)."""
    return f"{prefix}:{DLQ}:changes"


CHANGES = "changes"


def changes_shard(project_id: str, shards: int) -> int:
    """The shard of a project's change feed: zlib CRC-32 of the project id mod ``shards``."""
    return zlib.crc32(project_id.encode()) % shards


def changes_stream(prefix: str, project_id: str, shards: int) -> str:
    """``P:changes:{i}``: the change feed of user memory (``worker.episodes.changes``) of
    every project whose ``changes_shard`` is ``i``, in the order the changes were published."""
    return f"{prefix}:{CHANGES}:{tag(changes_shard(project_id, shards))}"


def all_changes_streams(prefix: str, shards: int) -> list[str]:
    return [f"{prefix}:{CHANGES}:{tag(i)}" for i in range(shards)]


_SHARD_TAG = re.compile(r"\{[0-9]+\}")


def is_dlq_stream(prefix: str, stream: str) -> bool:
    """Whether ``stream`` is one of the DLQs under ``prefix`` (``P:dlq:{i}``,
    ``P:dlq:episodes``, ``P:dlq:changes``): only their entries are dead letters, written by
    the worker, whose ``source_stream``, ``source_id`` and ``original_*`` fields say what they
    kept. On any other stream such fields are a publisher's, next to its ``data``, and mean
    nothing: the entry is read by its ``data`` and dated by its own id."""
    rest = stream.removeprefix(f"{prefix}:{DLQ}:")
    if rest == stream:
        return False
    return rest in (EPISODES, CHANGES) or _SHARD_TAG.fullmatch(rest) is not None


def erased_key(prefix: str) -> str:
    """The hash of erasures (``worker.erasure.erased``): ``project``, ``project/session``
    (``@user``) → the cutoff (ms) of its latest ``forget``. Ids and times only; kept for good."""
    return f"{prefix}:erased"


def erased_ranges_key(prefix: str) -> str:
    """The hash of erasures of a time range (``worker.erasure.erased``): ``project``,
    ``project/session`` (``@user``), then ``|`` and the range's start (ms) → its end, the
    cutoff (ms). A range is never a field of ``erased_key``, whose readers take a cutoff as
    "all that is older". Ids and times only; kept for good."""
    return f"{prefix}:erased_ranges"


def owed_forgets_key(prefix: str) -> str:
    """The hash of forgets still owed that Postgres could not record (``worker.erasure.owed``):
    erasure id → the forget's scope and cutoff as JSON (ids and times only), until finished."""
    return f"{prefix}:erasure:owed"


def erased_users_key(prefix: str, shard: int) -> str:
    """The shard's hash of forgotten users (``worker.erasure.erased``): ``project@user`` → the
    cutoff in ms; in the shard's slot, for the apply function."""
    return f"{prefix}:{tag(shard)}:erased_users"


OWN_FAMILIES = (
    LIFECYCLE,
    RESULTS,
    DLQ,
    "admission",
    EPISODES,
    CHANGES,
    "erased",
    "erased_ranges",
    "erasure",
)
"""The first names under the prefix of memworker's own keys (``P:NAME`` or ``P:NAME:…``);
and every ``P:{i}:…``, a shard's keys (sessions, dedupe records, ``seq`` counters, forgotten
users). A name no other writer may take: ``memworker replay --publish-to`` refuses them."""


def own_key_family(prefix: str, key: str) -> str | None:
    """The family of memworker's own keys ``key`` is of (``OWN_FAMILIES``, or ``{i}``), None
    when it is none (or not under ``prefix:``)."""
    if not key.startswith(f"{prefix}:"):
        return None
    head = key[len(prefix) + 1 :].split(":", 1)[0]
    if head.startswith("{"):
        return "{i}"
    return head if head in OWN_FAMILIES else None


FORGOTTEN_STATE = "forgotten"
"""The ``meta`` state of a forgotten session's marker: every later command is rejected
``forgotten`` (``lua/apply_command.lua``) and its working memory refuses writes."""


_SESSION_SUFFIXES = (":meta", ":vars", ":vexp", ":task", ":scratch", ":cps", ":cpdata")


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session's working memory.

    ``meta`` (hash): state, ids, ``ttl_ms``, ``last_seq``, timestamps.
    ``vars`` (hash): variable name → JSON text.  ``vexp`` (zset): variable → expiry (ms).
    ``task`` (string): task state JSON.  ``scratch`` (list): ``{content, timestamp}`` JSON.
    ``cps`` (zset): checkpoint id → creation time (ms).  ``cpdata`` (hash): per checkpoint
    ``<id>|info`` JSON and ``<id>|vars``/``|vexp``/``|scratch`` DUMP payloads, ``<id>|task`` JSON;
    and ``vbytes``, the variables' bytes (working memory writes no ``meta`` field).
    """

    prefix: str
    shard: int
    project_id: str
    session_id: str

    @classmethod
    def for_session(cls, prefix: str, shards: int, project_id: str, session_id: str) -> SessionKeys:
        validate_id(project_id, "project_id")
        validate_id(session_id, "session_id")
        return cls(prefix, shard_of(project_id, session_id, shards), project_id, session_id)

    @property
    def base(self) -> str:
        return f"{self.prefix}:{tag(self.shard)}:s:{self.project_id}/{self.session_id}"

    @property
    def meta(self) -> str:
        return self.base + ":meta"

    @property
    def vars(self) -> str:
        return self.base + ":vars"

    @property
    def vexp(self) -> str:
        return self.base + ":vexp"

    @property
    def task(self) -> str:
        return self.base + ":task"

    @property
    def scratch(self) -> str:
        return self.base + ":scratch"

    @property
    def cps(self) -> str:
        return self.base + ":cps"

    @property
    def cpdata(self) -> str:
        return self.base + ":cpdata"

    def all(self) -> list[str]:
        """The session's keys in the order every Lua script receives them (KEYS[1..7])."""
        base = self.base
        return [base + suffix for suffix in _SESSION_SUFFIXES]

    @property
    def streams(self) -> StreamKeys:
        return StreamKeys(self.prefix, self.shard)


def working_memory_key_re(
    prefix: str, project_id: str, session_id: str | None = None
) -> re.Pattern[str]:
    """Exactly the names of a project's (or a session's) working-memory keys, with groups
    ``session`` and ``kind`` (``meta``, ``vars``, …)."""
    session = re.escape(session_id) if session_id else ID_CHARS
    kinds = "|".join(suffix[1:] for suffix in _SESSION_SUFFIXES)
    return re.compile(
        rf"^{re.escape(prefix)}:\{{\d+\}}:s:{re.escape(project_id)}/(?P<session>{session}):"
        rf"(?P<kind>{kinds})$"
    )


def working_memory_pattern(prefix: str, project_id: str, session_id: str | None = None) -> str:
    """A SCAN MATCH pattern at least as wide as ``working_memory_key_re``: every session key of
    one project (or session). Ids are validated, the prefix escaped."""
    validate_id(project_id, "project_id")
    project = escape_glob(project_id)
    if session_id is None:
        return f"{escape_glob(prefix)}:{{*}}:s:{project}/*"
    validate_id(session_id, "session_id")
    return f"{escape_glob(prefix)}:{{*}}:s:{project}/{escape_glob(session_id)}:*"


_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def escape_glob(text: str) -> str:
    """Escape Redis glob metacharacters so ``text`` matches only itself."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


# -- key kinds (what `memworker stats` samples to measure bytes per session and per record) ------
# One place that knows how to tell a sampled key name's kind: change it with the layout.

SESSION_KIND = "session"
DEDUPE_KIND = "dedupe"
SEQ_KIND = "seq"
FINISHED_STATE = "terminated"
"""The ``meta`` state of a finished session (its tombstone)."""


STATE_FIELD = "state"
"""The field of a session's ``meta`` hash that holds its state."""


class KeyKinds:
    """Classifies key names of one prefix: a session's ``meta`` key (one per session), a
    dedupe record or a ``LifecycleClient`` seq counter (one per session); every other key (a
    session's other keys, streams, other applications' keys) is counted but not sampled."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        p = re.escape(prefix)
        self._pattern = re.compile(
            rf"^{p}:\{{(?P<shard>\d+)\}}:(?:s:(?P<project>[^/]+)/(?P<session>.+):meta"
            rf"|(?P<kind>evt|seq):[^/]+/[^/]+)$"
        )

    def kind_of(self, key: str) -> str | None:
        match = self._pattern.match(key)
        if match is None:
            return None
        if match["session"] is not None:
            return SESSION_KIND
        return DEDUPE_KIND if match["kind"] == "evt" else SEQ_KIND

    def session_of(self, key: str) -> SessionKeys | None:
        """The session whose ``meta`` key ``key`` is (None for any other key)."""
        match = self._pattern.match(key)
        if match is None or match["session"] is None:
            return None
        return SessionKeys(self.prefix, int(match["shard"]), match["project"], match["session"])
