"""Prometheus metrics and the /metrics, /healthz, /readyz endpoint of every service.

Only counters and histograms are touched on the hot path; gauges of stream lag and pending
counts are refreshed by a slow background probe (each group's, ``worker.consumers.lag``),
never per command.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

COMMANDS = Counter(
    "memworker_commands_total",
    "Lifecycle commands handled, by command type, outcome status and rejection reason.",
    ["command", "status", "reason"],
)
DEAD_LETTERS = Counter(
    "memworker_dead_letters_total",
    "Entries moved to a DLQ, by group and reason.",
    ["group", "reason"],
)
DELIVERIES = Counter(
    "memworker_deliveries_total",
    "Entries handed to a consumer group's handler, redeliveries included, by group.",
    ["group"],
)
BATCH_SIZE = Histogram(
    "memworker_batch_size",
    "Entries per applied batch.",
    ["group"],
    buckets=(1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500),
)
APPLY_SECONDS = Histogram(
    "memworker_batch_apply_seconds",
    "Time to apply one batch (parse, scripts, replies).",
    ["group"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
CONSOLIDATION_SECONDS = Histogram(
    "memworker_consolidation_batch_seconds",
    "Time to store one batch of results in Postgres.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RESULTS_STORED = Counter(
    "memworker_results_consolidated_total", "Results stored in lifecycle_events (or already there)."
)
EPISODES_RECORDED = Counter(
    "memworker_episodes_recorded_total", "Episodes announced on P:episodes after their COMMIT."
)
STREAM_LAG = Gauge(
    "memworker_stream_lag", "Entries not yet delivered to the group.", ["stream", "group"]
)
STREAM_PENDING = Gauge(
    "memworker_stream_pending", "Entries delivered but not acknowledged.", ["stream", "group"]
)
STREAM_REMOVED_UNREAD = Gauge(
    "memworker_stream_removed_unread",
    "1 while entries of the stream were removed before the group read them (an XADD MAXLEN, "
    "XTRIM or XDEL by a user allowed to write the stream; seen until the group reads past the "
    "gap), 0 otherwise.",
    ["stream", "group"],
)
STREAM_IDS_AHEAD = Gauge(
    "memworker_stream_ids_ahead_seconds",
    "How far the stream's last id is ahead of the clock when by more than a minute (an entry "
    "XADDed with an explicit future id; later auto ids keep its time), else 0.",
    ["stream"],
)
REDIS_CONDITIONS = Counter(
    "memworker_redis_conditions_total",
    "Server-wide Redis conditions met (full, busy, loading, readonly, unreachable, ...): the "
    "entries were held and retried, never counted as failed deliveries.",
    ["kind"],
)
TRIMMED_WHILE_FULL = Counter(
    "memworker_trimmed_while_full_total",
    "Stream entries every group had finished with, trimmed before their replay window ended "
    "because Redis was full (MEMWORKER_TRIM_WHEN_FULL).",
)
ADMISSION_CLOSED = Gauge(
    "memworker_admission_closed",
    "1 while the lifecycle worker refuses new publishes: Redis is past maxmemory less "
    "MEMWORKER_ADMISSION_RESERVE, kept for applying the commands already accepted.",
)
ACCESS_CALLS = Counter(
    "memworker_access_calls_total",
    "Tool calls of memworker mcp and memworker serve, by server, tool and HTTP status.",
    ["server", "tool", "status"],
)
ACCESS_SECONDS = Histogram(
    "memworker_access_call_seconds",
    "Time to answer one tool call of memworker mcp or memworker serve.",
    ["server", "tool"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
READY = Gauge("memworker_ready", "1 when the worker can reach its servers and is consuming.")
MCP_SESSIONS_OPEN = Gauge(
    "memworker_mcp_sessions_open",
    "Sessions open on memworker mcp --http (at most MEMWORKER_MCP_MAX_SESSIONS; idle ones are "
    "closed after MEMWORKER_MCP_SESSION_IDLE_SECONDS).",
)


async def serve_http(
    port: int, is_ready: Callable[[], bool], host: str = "0.0.0.0"
) -> asyncio.AbstractServer:
    """Serve /metrics, /healthz (the process is up) and /readyz (it can do its job).

    ``is_ready`` is asked on every request and sets the ``memworker_ready`` gauge too, so the
    gauge and /readyz never disagree."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), timeout=5)
            parts = request.decode("latin-1").split()
            path = parts[1] if len(parts) > 1 else "/"
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            ok = is_ready()  # one source of truth: /readyz and memworker_ready agree
            READY.set(1 if ok else 0)
            if path.startswith("/metrics"):
                status, ctype, body = "200 OK", CONTENT_TYPE_LATEST, generate_latest()
            elif path.startswith("/healthz"):
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif path.startswith("/readyz"):
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", b"ready\n" if ok else b"not ready\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)


INDEX_SECONDS = Histogram(
    "memworker_index_batch_seconds",
    "Time to embed and store one indexer batch.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
EPISODES_INDEXED = Counter(
    "memworker_episodes_indexed_total", "Episodes embedded and stored by the indexer."
)
EMBEDDED_AT_REMEMBER = Counter(
    "memworker_embedded_at_remember_total",
    "Turns Memory.remember embedded itself (no indexer running), by outcome (done, failed).",
    ["outcome"],
)
RECALL_WITHOUT_VECTORS = Counter(
    "memworker_recall_unindexed_total",
    "Episodes a recall looked at that had no vector of its model (not embedded yet), summed.",
)
INDEX_BACKLOG = Gauge(
    "memworker_index_backlog",
    "Episodes announced on P:episodes the indexer has not indexed yet (pending + lag of its "
    "group), every MEMWORKER_LAG_PROBE_SECONDS.",
)
INDEX_OLDEST_UNINDEXED = Gauge(
    "memworker_index_oldest_unindexed_seconds",
    "Age of the oldest announced episode the indexer has not indexed yet; 0 without backlog. "
    "Past MEMWORKER_INDEX_MAX_LAG_SECONDS the indexer's /readyz says not ready.",
)

# Capacity (worker/ops/capacity.py), refreshed with the lag gauges by sampling, never per command.
REDIS_USED_MEMORY = Gauge(
    "memworker_redis_used_memory_bytes",
    "Redis used_memory less mem_not_counted_for_evict: what maxmemory is compared with.",
)
REDIS_MAX_MEMORY = Gauge(
    "memworker_redis_max_memory_bytes", "Redis maxmemory (INFO memory); 0 when none is set."
)
BYTES_PER_LIVE_SESSION = Gauge(
    "memworker_redis_bytes_per_live_session",
    "Mean MEMORY USAGE of a live session's keys (its dedupe records included; a sample).",
)
BYTES_PER_FINISHED_SESSION = Gauge(
    "memworker_redis_bytes_per_finished_session",
    "Mean MEMORY USAGE of what a terminated session leaves: its tombstone (its dedupe records "
    "packed in) and its seq counter (a sample).",
)
BYTES_PER_DEDUPE_RECORD = Gauge(
    "memworker_redis_bytes_per_dedupe_record",
    "Mean MEMORY USAGE of a dedupe record key (commands refused before naming a session).",
)
BYTES_PER_STREAM_ENTRY = Gauge(
    "memworker_redis_bytes_per_stream_entry",
    "MEMORY USAGE of a stream divided by its length.",
    ["stream"],
)
DEAD_LETTERS_KEPT = Gauge(
    "memworker_redis_dead_letters",
    "Dead letters in every DLQ (each shard's, the indexer's, the change feed's), kept at most "
    "MEMWORKER_DLQ_MAX_ENTRIES each and MEMWORKER_DLQ_RETENTION_SECONDS.",
)
DEAD_LETTER_BYTES = Gauge(
    "memworker_redis_dead_letter_bytes",
    "MEMORY USAGE of every DLQ stream together.",
)
SECONDS_UNTIL_FULL = Gauge(
    "memworker_redis_seconds_until_full",
    "Seconds until used_memory reaches maxmemory at the current command rate; +Inf when it "
    "levels off below it, no commands arrive or no maxmemory is set.",
)
