"""Settings from the environment (docs/reference/configuration.md lists them all).

Every setting but the two URLs is read from a ``MEMWORKER_``-prefixed variable, so operators
can configure the worker, the consolidator and the CLI from one environment.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Annotated, Literal, Self
from urllib.parse import unquote, urlsplit

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from schemas.ids import WriteId
from schemas.limits import MAX_SESSION_TTL_SECONDS

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_DATABASE_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"

LOCAL_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
"""The bundled offline embedding model (``MEMWORKER_EMBEDDING_PROVIDER=local``)."""
LOCAL_EMBEDDING_DIMENSION = 384
"""Its vector size: the ``episode_embeddings`` column the vectors migration creates."""


_CONNECT_PARAMETERS = frozenset(
    {
        # asyncpg.connect's keyword arguments a URL can give (a test keeps this list true) ...
        *("host", "port", "user", "password", "passfile", "service", "servicefile"),
        *("database", "timeout", "statement_cache_size", "max_cached_statement_lifetime"),
        *("max_cacheable_statement_size", "command_timeout", "ssl", "direct_tls"),
        *("target_session_attrs", "krbsrvname", "gsslib"),
        # ... and SQLAlchemy's own for it
        "prepared_statement_cache_size",
    }
)
"""The query parameters of DATABASE_URL that reach a connection (``sslmode`` is read as
``ssl``): any other (libpq's ``sslpassword``, ``application_name``, a typo) is refused at
start, naming it, rather than failing every connection later."""


_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""The ``sslmode`` (or ``ssl``) values asyncpg takes in DATABASE_URL: libpq's modes."""


def asyncpg_url(database_url: str) -> str:
    """``postgresql://…`` and ``postgres://…`` as ``postgresql+asyncpg://…``."""
    for plain in ("postgresql://", "postgres://"):
        if database_url.startswith(plain):
            return "postgresql+asyncpg://" + database_url[len(plain) :]
    return database_url


def _refuse_spilled_userinfo(url: str) -> None:
    """A password (or user name) holding an unencoded ``/``, ``?`` or ``#`` ends the URL's
    host part early: its rest would be read as the host, port, path or query, and an error
    naming those would show a piece of the password. Refused in one line that quotes none of
    it. (``?password=`` in the query may hold an ``@``.)"""
    rest = url.partition("://")[2]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    tail = rest[end:]
    at = tail.rfind("@")
    if "@" not in rest[:end] and at >= 0 and "password=" not in tail[:at]:
        raise ValueError(
            "the part before the host holds '/', '?' or '#': percent-encode them in a user "
            "name or password (%2F, %3F, %23)"
        )


class Settings(BaseSettings):
    """All of memworker's configuration; field ``x`` reads ``MEMWORKER_X``."""

    # An empty variable (MEMWORKER_METRICS_PORT=) is unset: its default, not a bad value.
    model_config = SettingsConfigDict(
        env_prefix="MEMWORKER_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    redis_url: str = Field(
        default=DEFAULT_REDIS_URL,
        validation_alias=AliasChoices("REDIS_URL", "MEMWORKER_REDIS_URL"),
    )
    """Redis or Valkey (`redis://`, `rediss://`, `unix://`)"""
    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        validation_alias=AliasChoices("DATABASE_URL", "MEMWORKER_DATABASE_URL"),
    )
    """PostgreSQL (`postgresql+asyncpg://`; `postgresql://` accepted too)"""
    redis_cluster: bool = False
    """REDIS_URL names one node of a Redis Cluster (shards map to the nodes of their slots)."""
    redis_sentinel_service: str | None = None
    """REDIS_URL names Sentinels (``redis://h1:26379,h2:26379/0``) watching this service."""
    redis_max_connections: int = Field(default=100, ge=1)
    """Connections a client (``WorkingMemory``, ``LifecycleClient``, the CLI, each consumer)
    opens to one Redis server at most; a call past them waits for a free one."""
    redis_pool_timeout_seconds: float = Field(default=30.0, gt=0)
    """How long a call waits for a free connection before it fails (naming the setting)."""
    redis_retry_seconds: float = Field(default=5.0, ge=0)
    """How long a call of ``WorkingMemory``, ``LifecycleClient`` or the CLI retries a lost or
    refused connection (Redis restarting, failing over) before it raises; 0: not at all."""
    stream_prefix: str = Field(default="agents", min_length=1, max_length=64)
    """prefix `P` of every stream and key"""
    shards: int = Field(default=1, ge=1, le=1024)
    """shards `S`; must be the same for every producer and worker"""

    # Working memory.
    session_ttl_seconds: int = Field(default=86_400, ge=1, le=MAX_SESSION_TTL_SECONDS)
    """A spawn's idle expiry when it names no ``ttl_seconds``; at most the spawn's maximum."""
    default_key_ttl_seconds: int | None = Field(default=None, ge=1)
    """default per-variable TTL of `WorkingMemory.set`"""
    max_keys_per_session: int = Field(default=10_000, ge=1)
    """variables per session"""
    max_value_bytes: int = Field(default=1_048_576, ge=1)
    """bytes of one variable's JSON"""
    max_session_bytes: int = Field(default=64 * 1_048_576, ge=1)
    """bytes of one session's variables (names plus JSON values; a write past it is refused)"""
    max_scratchpad_entries: int = Field(default=1_000, ge=1)
    """scratchpad length (oldest dropped)"""
    max_checkpoints_per_session: int = Field(default=50, ge=1)
    """checkpoints per session (more is refused)"""
    tombstone_ttl_seconds: int = Field(default=3_600, ge=1)
    """How long a terminated session answers late commands ``already_terminated`` (README
    "Windows": chosen so one GB of Redis sustains over 1,000 commands/s)."""
    dedupe_ttl_seconds: int = Field(default=3_600, ge=1)
    """How long an ``event_id`` is remembered: a finished session's records are kept in its
    tombstone for the longer of this and the tombstone window; a live session keeps them."""
    default_project: WriteId = "default"
    """The project of ``WorkingMemory.for_session`` when none is given."""
    memory_fallback: bool = False
    """``WorkingMemory.for_session`` opens in process memory when Redis cannot be reached."""

    # Events.
    max_event_bytes: int = Field(default=1_048_576, ge=1024)
    """a command's JSON size"""

    # Lifecycle worker.
    batch_size: int = Field(default=500, ge=1, le=10_000)
    """entries per read (every group; the consolidator and the indexer have their own below)"""
    block_ms: int = Field(default=100, ge=1)
    """`XREADGROUP` block time (every group)"""
    reclaim_idle_ms: int = Field(default=30_000, ge=100)
    """idle time before another consumer's entry is reclaimed (every group)"""
    reclaim_interval_ms: int = Field(default=1_000, ge=10)
    """how often to look for entries idle past `MEMWORKER_RECLAIM_IDLE_MS` (every group)"""
    max_deliveries: int = Field(default=5, ge=1)
    """deliveries (or failures) before the DLQ (the lifecycle worker and hooks)"""
    hook_retry_seconds: float = Field(default=30.0, ge=0)
    """How long ``LifecycleHooks`` retries a result whose hook raises (backoff 0.1 s doubling,
    at most 10 s apart; at least ``max_deliveries`` tries) before its dead letter."""
    reply_timeout_seconds: float = Field(default=30.0, gt=0)
    """A batch whose replies take longer drops its connection and is retried."""
    seq_gap_timeout_seconds: float = Field(default=60.0, gt=0)
    """how long a command waits for a `seq` gap"""
    seq_retry_ms: int = Field(default=200, ge=10)
    """how often waiting commands are retried"""
    spawn_wait_seconds: float = Field(default=10.0, ge=0)
    """How long a pause, resume or terminate with a ``seq`` above 1, for a session that does
    not exist and with no spawn of it in the stream, waits for one to be published (counted
    from its own publish) before it is answered ``unknown_session``; at most
    ``seq_gap_timeout_seconds`` (a longer one counts as that)."""

    retention_seconds: float = Field(default=600.0, ge=0)
    """Age of the lifecycle/results entries kept for replay once every group is done."""
    retention_interval_seconds: float = Field(default=60.0, gt=0)
    """how often streams are trimmed (the lifecycle worker: lifecycle and results; the
    consolidator: `P:episodes`)"""
    dlq_max_entries: int = Field(default=100_000, ge=0)
    """Dead letters kept per DLQ stream at most, the oldest trimmed first (0: no cap); with the
    other streams, every ``retention_interval_seconds``."""
    dlq_retention_seconds: float = Field(default=7 * 86_400, ge=0)
    """Age past which dead letters are trimmed (0: no limit)."""
    admission_reserve: float = Field(default=0.1, ge=0, lt=1)
    """Fraction of ``maxmemory`` kept for applying commands already accepted: past
    maxmemory × (1 − this), ``LifecycleClient`` and ``memworker publish`` are refused (0: off).
    Checked by the lifecycle worker every ``admission_interval_ms``."""
    admission_interval_ms: int = Field(default=100, ge=10)
    """how often the lifecycle worker checks `used_memory` against that limit (one `INFO
    memory`)"""
    admission_interval_near_full_ms: int = Field(default=10, ge=1)
    """The same check while a server is near its limit (less room under maxmemory less the
    reserve than the reserve itself, or 8 MB, whichever is more) or past it: a burst of
    publishes between two checks then eats less of the reserve. One ``INFO memory`` (~7 µs of
    Redis CPU) per check."""
    trim_when_full: bool = True
    """While Redis refuses writes for lack of memory, trim the lifecycle and results entries
    every group has finished with at once, replay window or not: commands already accepted
    need that memory to be applied (results stay replayable from Postgres)."""

    # Consolidator.
    consolidation_batch_size: int = Field(default=500, ge=1, le=10_000)
    """results per Postgres transaction"""
    consolidation_max_attempts: int = Field(default=10, ge=1)
    """tries before a result is dead-lettered `storage_failed`"""
    context_summary_max_chars: int = Field(default=4_000, ge=200)
    """size bound of an episode's summary"""
    lesson_facts: bool = True
    """The consolidator turns finished sessions' lessons into facts about their agent type
    (``worker.user_memory.extractors.LessonsExtractor``), every few seconds, off the hot path."""

    # Recall by meaning (worker.episodes.embedding, worker.episodes.indexer, EpisodeStore.recall).
    embedding_provider: Literal["local", "openai"] = "local"
    """`local` (all-MiniLM-L6-v2 on CPU, offline) or `openai` (an OpenAI-compatible
    `/v1/embeddings`)"""
    embedding_base_url: str | None = None
    """An OpenAI-compatible API, ending in ``/v1`` (provider ``openai``)."""
    embedding_model: str | None = None
    """provider `openai`: the model asked for and the dimension it returns"""
    embedding_dimension: int | None = Field(default=None, ge=1, le=16_000)
    """provider `openai`: the model asked for and the dimension it returns"""
    embedding_api_key: str | None = None
    """provider `openai`: sent as `Authorization: Bearer …`"""
    index_batch_size: int = Field(default=64, ge=1, le=2_048)
    """announcements the indexer embeds per batch"""
    index_max_attempts: int = Field(default=10, ge=1)
    """tries before an announcement is dead-lettered `index_failed`"""
    index_nice: int = Field(default=10, ge=0, le=19)
    """``memworker index`` lowers its CPU priority by this much: embedding is off the hot path,
    so on shared cores the consolidator and the worker go first (BENCHMARKS.md)."""
    index_max_lag_seconds: float = Field(default=300.0, gt=0)
    """The indexer's ``/readyz`` says not ready while the oldest announced episode it has not
    indexed is older than this (``worker.episodes.backlog``)."""
    recall_exact_below: int = Field(default=10_000, ge=0)
    """Recall searches a project (with its filters) of at most this many vectors exactly, not
    by the HNSW index (``worker.episodes.vector_search``); 0: always the index."""
    remember_embedding: Literal["auto", "inline", "indexer"] = "auto"
    """Who embeds a turn ``Memory.remember`` stores (``worker.user_memory.indexing``):
    ``inline``, ``remember`` itself before it returns (recallable by meaning at once);
    ``indexer``, the ``memworker index`` process (``Memory.wait_recallable`` waits for it);
    ``auto``, ``inline`` unless an indexer is running (group ``indexer`` on ``P:episodes`` has a
    consumer seen in the last 10 s; looked up at most every 2 s)."""

    recall_min_similarity: float = Field(default=0.2, ge=-1.0, le=1.0)
    """``Memory.recall``'s relevance floor: a turn whose cosine to the query is below this is
    not a match by meaning (``worker.user_memory.recall``); a query nothing matches by words
    or at the floor gets the most recent turns with score 0. Suits all-MiniLM-L6-v2 (unrelated
    texts ~0..0.2); -1 turns it off."""

    # Agent access: memworker mcp, memworker serve (worker.access).
    api_token: str | None = None
    """The bearer token every call to ``memworker serve`` (and ``memworker mcp --http``) must
    send (``Authorization: Bearer …``, the scheme in any case); unset or empty: no
    authentication, and the server listens on 127.0.0.1 only unless ``--host`` says otherwise
    (said loudly on stderr when it then listens on another address)."""
    api_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Host names ``memworker serve`` and ``mcp --http`` answer besides localhost, 127.0.0.1,
    [::1] and the address they listen on (comma-separated, or a JSON list; ``--allowed-host``
    adds more): a request naming another ``Host`` is refused 421 (DNS rebinding)."""
    api_allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Browser origins besides the server's own that may call ``memworker serve`` (its API and
    ``/ui``) and ``mcp --http``: ``https://app.example.com``, ``http://localhost:3000`` (a
    scheme, a host, a port unless the scheme's default; comma-separated, or a JSON list). A
    request whose ``Origin`` is neither the server's own (the host and port its ``Host`` names)
    nor one of these is refused 403, another local port's page included; a request without
    ``Origin`` (no browser sent it) is not judged by it."""
    api_trusted_proxies: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Addresses of the reverse proxies in front of ``memworker serve`` and ``mcp --http``
    whose ``X-Forwarded-For`` names the client (comma-separated, or a JSON list). Empty (the
    default): the connection's own address is the client, whatever a request's headers claim,
    so a sign-in lockout cannot be dodged with a forged header. Behind a proxy, set it to the
    proxy's address, or every client counts as that one address."""
    allow_default_secrets: bool = False
    """Let ``serve``, ``mcp --http``, ``run``, ``consolidate`` and ``index`` start with a secret
    this repository ships (``dev-<user>-change-me``, ``change-me``): a throwaway stack only."""
    mcp_max_sessions: int = Field(default=1_000, ge=1)
    """Streamable-HTTP sessions ``memworker mcp --http`` keeps open at most: past them the
    oldest idle one is closed, and a new one is refused 503 when none is idle."""
    mcp_session_idle_seconds: float = Field(default=900.0, gt=0)
    """A ``memworker mcp --http`` session with no request for this long is closed."""
    mcp_direct_calls: bool = True
    """``memworker mcp --http`` answers a ``tools/call`` the SDK would serve as it is without
    the SDK's dispatch (the same checks, the same answer, ~1.6× the calls a second:
    ``worker.access.mcp_direct``). Off: every request goes through the SDK."""
    api_user: WriteId | None = None
    """Pin ``memworker mcp`` and ``memworker serve`` to this user: every call reaches this
    user's memory only (a call naming another is refused). Unset: each call names its user."""
    api_max_request_bytes: int = Field(default=2_097_152, ge=1024)
    """The largest request body ``memworker serve`` (and ``mcp --http``) reads; larger: 413."""
    api_body_timeout_seconds: float = Field(default=30.0, gt=0)
    """A request body ``memworker serve`` (and ``mcp --http``) has not received whole within
    this long is answered 408 and its connection closed (a slow body holds no connection)."""
    ui_enabled: bool = True
    """Serve the memory inspector (``worker.inspector``: web pages of what memory holds, recall
    with its scores, forget, the live change feed) at ``/ui`` of ``memworker serve``, behind
    the same token and allowed hosts; false: no ``/ui`` (404, as any unknown path)."""

    # Operations.
    metrics_port: int | None = Field(default=None, ge=0, le=65_535)
    """port of `/metrics`, `/healthz`, `/readyz` (`run --workers N`: this port + n for worker n;
    `dev`: 9464 when unset)"""
    lag_probe_seconds: float = Field(default=2.0, gt=0)
    """how often lag/pending gauges (and, by sampling, the capacity gauges) are refreshed"""
    log_level: str = "INFO"
    """the log level (`DEBUG`, `INFO`, `WARNING`, `ERROR`)"""
    log_json: bool | None = None
    """JSON logs when not on a terminal"""

    @property
    def vector_dimension(self) -> int:
        """The size of the configured embedder's vectors (``embedder_from_settings``): the
        local model's, or ``MEMWORKER_EMBEDDING_DIMENSION`` with provider ``openai``. The
        migration creates the vector index of this dimension."""
        if self.embedding_provider == "openai" and self.embedding_dimension is not None:
            return self.embedding_dimension
        return LOCAL_EMBEDDING_DIMENSION

    @field_validator("database_url")
    @classmethod
    def _asyncpg_driver(cls, value: str) -> str:
        """Accept ``postgresql://`` and ``postgres://`` too (SQLAlchemy needs the driver named),
        and libpq's ``sslmode=`` (asyncpg calls it ``ssl=``)."""
        for plain in ("postgresql://", "postgres://"):
            if value.startswith(plain):
                value = "postgresql+asyncpg://" + value[len(plain) :]
                break
        value = re.sub(r"([?&])sslmode=", r"\1ssl=", value)
        if not value.startswith("postgresql+asyncpg://"):
            scheme = value.split("://", 1)[0] if "://" in value else value
            raise ValueError(
                f"memworker stores in PostgreSQL: use postgresql://user:password@host:port/db "
                f"(got {scheme!r})"
            )
        _refuse_spilled_userinfo(value)
        query = value.partition("?")[2].partition("#")[0]
        names = {pair.partition("=")[0] for pair in query.split("&") if pair}
        if unknown := sorted(names - _CONNECT_PARAMETERS):
            raise ValueError(
                f"the connection parameter(s) {', '.join(map(repr, unknown))} are not known to "
                f"asyncpg, memworker's Postgres driver (it takes: sslmode, "
                f"{', '.join(sorted(_CONNECT_PARAMETERS))})"
            )
        for pair in query.split("&"):
            name, _, mode = pair.partition("=")
            if name == "ssl" and unquote(mode) not in _SSL_MODES:
                raise ValueError(
                    f"sslmode must be one of {', '.join(_SSL_MODES)}; got {unquote(mode)!r:.40}"
                )
        return value

    @field_validator("api_token")
    @classmethod
    def _empty_token_is_unset(cls, value: str | None) -> str | None:
        """``MEMWORKER_API_TOKEN=""`` means what unset means: no authentication. A token of
        whitespace only is refused: no client can send it (a header's value is trimmed)."""
        if value and not value.strip():
            raise ValueError(
                "is only whitespace, which no client can send; unset it (or set it empty) for "
                "no authentication, or set a real token"
            )
        return value if value else None

    @field_validator("api_allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        """Each an origin a browser sends: ``http(s)://host[:port]``, nothing more."""
        for origin in value:
            try:
                parts = urlsplit(origin)
                parts.port  # noqa: B018 (raises on a port that is no number)
            except ValueError:
                parts = urlsplit("")
            if (
                parts.scheme.lower() not in ("http", "https")
                or not parts.hostname
                or parts.username
                or parts.password
                or parts.path not in ("", "/")
                or parts.query
                or parts.fragment
            ):
                raise ValueError(
                    f"{origin!r} is not an origin: write it as a browser sends it, a scheme, a "
                    "host and a port unless the default (https://app.example.com, "
                    "http://localhost:3000), no path"
                )
        return value

    @field_validator(
        "api_allowed_hosts", "api_allowed_origins", "api_trusted_proxies", mode="before"
    )
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            if value.lstrip().startswith("["):
                return json.loads(value)
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        """Fail at start, naming the variable, rather than at the first connection."""
        if not value.startswith(("redis://", "rediss://", "unix://")):
            scheme = value.split("://", 1)[0] if "://" in value else value
            raise ValueError(
                f"must start with redis://, rediss:// or unix:// (got {scheme!r}), "
                "e.g. redis://127.0.0.1:6379/0"
            )
        if not value.startswith("unix://"):
            _refuse_spilled_userinfo(value)
        netloc = urlsplit(value).netloc.rsplit("@", 1)[-1]
        if not value.startswith("unix://") and "," not in netloc:
            port = netloc.rsplit("]", 1)[-1].rpartition(":")[2] if ":" in netloc else ""
            if port and not (port.isdigit() and 0 < int(port) < 65536):
                raise ValueError(  # never quoted: it may be a piece of a password
                    "the port is not a number from 1 to 65535, e.g. redis://127.0.0.1:6379/0"
                )
        return value

    @model_validator(mode="after")
    def _host_list_needs_sentinel(self) -> Self:
        """``redis://h1:26379,h2:26379/0`` names Sentinels: only with the service they watch."""
        if self.redis_sentinel_service or self.redis_cluster:
            return self
        netloc = urlsplit(self.redis_url).netloc.rsplit("@", 1)[-1]
        if "," in netloc:
            raise ValueError(
                "REDIS_URL names several hosts (Sentinels); set "
                "MEMWORKER_REDIS_SENTINEL_SERVICE to the service they watch, or name one host"
            )
        return self


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
