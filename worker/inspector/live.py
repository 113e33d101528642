"""The inspector's live page: the change feed as it happens (server-sent events from the
project's ``P:changes:{j}``, read with XREAD: no consumer group, so following it holds nothing
back and leaves nothing to trim), the lifecycle's live sessions and their working memory, the
streams' length, lag and pending entries, and the dead letters with their reasons, each
redriven after a confirmation (``worker.consumers.dead_letters.redrive``, which drops what a
forget covered). A server pinned to a user shows that user's sessions and changes only, the
streams' numbers, and no dead letter (they hold every user's data). The DLQ streams are
shared by every project of the prefix: a server shows and redrives only the dead letters its
own project's entries became; one whose project cannot be read (garbage, an excerpt) is
counted, not shown (``memworker dlq show`` is the operator's door to those)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import ResponseError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from worker import codec
from worker.access.scope import AccessError, failure
from worker.connections import consumer_client
from worker.consumers.dead_letters import list_dead_letters, redrive
from worker.erasure.erased import entry_scope, load_erased
from worker.ids import validate_id
from worker.inspector.app import Inspector
from worker.keys import StreamKeys, changes_dlq, changes_stream, episodes_dlq
from worker.ops.inspection import GroupStats, stream_stats

SESSIONS_SHOWN = 50
VARIABLES_SHOWN = 20
VALUE_CHARS = 200
LETTERS_SHOWN = 50
LETTERS_READ = 1000
"""Dead letters read per DLQ stream to find the project's (the streams are shared)."""
MAX_FEEDS = 16
"""Change feeds followed at once (each holds one Redis connection): more is refused 503."""
HEARTBEAT_S = 15.0
_ENTRY_ID = re.compile(r"\d{1,20}-\d{1,20}")
_feeds = 0


@dataclass
class LiveSession:
    session_id: str
    user_id: str | None
    state: str
    variables: list[tuple[str, str]]


async def live_sessions(ui: Inspector) -> list[LiveSession]:
    """Sessions of the project with working memory in Redis (a pinned server: its user's)."""
    access = ui.access
    redis: Any = access.redis
    prefix, project = access.settings.stream_prefix, access.project_id
    found: list[LiveSession] = []
    async for raw in redis.scan_iter(match=f"{prefix}:{{*}}:s:{project}/*:meta", count=1000):
        meta_key = codec.text(raw)
        meta = {codec.text(k): codec.text(v) for k, v in (await redis.hgetall(meta_key)).items()}
        user = meta.get("user_id") or None
        if access.user_id is not None and user != access.user_id:
            continue
        base = meta_key.removesuffix(":meta")
        variables = []
        raw_vars: Any = await redis.hgetall(base + ":vars")
        for key, value in sorted(raw_vars.items())[:VARIABLES_SHOWN]:
            shown = codec.text(value)
            variables.append(
                (codec.text(key), shown[:VALUE_CHARS] + ("…" if len(shown) > VALUE_CHARS else ""))
            )
        session_id = base.split(f":s:{project}/", 1)[1]
        found.append(LiveSession(session_id, user, meta.get("state", "?"), variables))
        if len(found) >= SESSIONS_SHOWN:
            break
    return sorted(found, key=lambda s: s.session_id)


async def _feed_stats(ui: Inspector) -> list[GroupStats]:
    """The project's change feed and the DLQs ``stream_stats`` leaves out: length, and each
    group's lag and pending entries."""
    redis: Any = ui.access.redis
    settings = ui.access.settings
    names = [
        changes_stream(settings.stream_prefix, ui.access.project_id, settings.shards),
        episodes_dlq(settings.stream_prefix),
        changes_dlq(settings.stream_prefix),
    ]
    rows = []
    for name in names:
        length = int(await redis.xlen(name))
        try:
            groups = await redis.xinfo_groups(name)
        except ResponseError:  # no such stream yet
            groups = []
        if not groups:
            rows.append(GroupStats(name, length, None, None, 0, None, 0))
        for group in groups:
            lag = group.get("lag")
            rows.append(
                GroupStats(
                    name,
                    length,
                    codec.text(group["name"]),
                    None if lag is None else int(lag),
                    int(group["pending"]),
                    None,
                    int(group["consumers"]),
                )
            )
    return rows


def dlq_streams(ui: Inspector) -> list[str]:
    settings = ui.access.settings
    shards = [StreamKeys(settings.stream_prefix, i).dlq for i in range(settings.shards)]
    return [*shards, episodes_dlq(settings.stream_prefix), changes_dlq(settings.stream_prefix)]


async def live(request: Request, ui: Inspector) -> Response:
    access = ui.access
    user = request.query_params.get("user") or None
    if user is not None:
        user = access.user(validate_id(user, "user"))
    redis: Any = access.redis
    streams = [*await stream_stats(redis, access.settings), *await _feed_stats(ui)]
    letters = []
    unattributed = 0
    if access.user_id is None:
        for stream in dlq_streams(ui):
            for entry_id, fields in await list_dead_letters(redis, stream, LETTERS_READ):
                project = entry_scope(fields, dead_letter=True)[0]
                if project is None:
                    unattributed += 1
                    continue
                if project != access.project_id:
                    continue
                letters.append(
                    {
                        "stream": stream,
                        "entry_id": entry_id,
                        "reason": fields.get("reason", ""),
                        "error": fields.get("error", "")[:500],
                    }
                )
    return ui.render(
        request,
        "live.html",
        "Live",
        user=user,
        streams=streams,
        sessions=await live_sessions(ui),
        letters=letters[:LETTERS_SHOWN],
        unattributed=unattributed,
        crumbs=[("/ui/", "Users")],
    )


async def changes(request: Request, ui: Inspector) -> Response:
    """``text/event-stream``: each change of the project (of ``?user=``, or the pinned user)
    published from now on (or after ``Last-Event-ID``) as an ``event: change``."""
    global _feeds
    access = ui.access
    user = request.query_params.get("user") or None
    if user is not None:
        user = validate_id(user, "user")
    only = access.user(user)
    after = request.headers.get("last-event-id", "$")
    if after != "$" and not _ENTRY_ID.fullmatch(after):
        raise AccessError("Last-Event-ID: not a stream entry id", 400)
    if _feeds >= MAX_FEEDS:
        raise AccessError(f"{MAX_FEEDS} live feeds are open already: close one", 503)
    stream = changes_stream(
        access.settings.stream_prefix, access.project_id, access.settings.shards
    )
    _feeds += 1

    async def events() -> AsyncIterator[bytes]:
        global _feeds
        redis = consumer_client(access.settings)
        try:
            position = after if after != "$" else await _newest(redis, stream)
            yield b"retry: 2000\n\n"
            idle = 0.0
            while not await request.is_disconnected():
                read: Any = await redis.xread({stream: position}, count=100, block=1000)
                if not read:
                    idle += 1.0
                    if idle >= HEARTBEAT_S:
                        idle = 0.0
                        yield b": still here\n\n"
                    continue
                for _name, entries in read:
                    for entry_id, fields in entries:
                        position = codec.text(entry_id)
                        event = _event(fields)
                        if event is None or event.get("project_id") != access.project_id:
                            continue
                        if only is not None and event.get("user_id") != only:
                            continue
                        data = orjson.dumps(event).decode()
                        yield f"id: {position}\nevent: change\ndata: {data}\n\n".encode()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis gone or full: end the stream; the browser reconnects
            yield f": stopped: {failure(exc)[1]}\n\n".encode()
        finally:
            _feeds -= 1
            await redis.aclose()

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _newest(redis: Any, stream: str) -> str:
    """The id of the stream's newest entry ("0-0": none yet): the feed starts after it."""
    newest: Any = await redis.xrevrange(stream, count=1)
    return codec.text(newest[0][0]) if newest else "0-0"


def _event(fields: Any) -> dict[str, Any] | None:
    try:
        raw = codec.entry_data(fields)
        value = orjson.loads(raw) if raw is not None else None
    except (ValueError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


async def redrive_letter(request: Request, ui: Inspector) -> Response:
    """``step=preview``: the dead letter and a confirmation; ``step=confirm``: redriven."""
    access = ui.access
    if access.user_id is not None:
        raise AccessError(
            f"this server serves user {access.user_id} only: dead letters hold "
            "every user's data; redrive them with memworker dlq redrive",
            403,
        )
    form = await request.form()
    stream, entry_id, step = form.get("stream"), form.get("entry_id"), form.get("step")
    if not isinstance(stream, str) or stream not in dlq_streams(ui):
        raise AccessError("stream: not a dead-letter stream of this server", 422)
    if not isinstance(entry_id, str) or not _ENTRY_ID.fullmatch(entry_id):
        raise AccessError("entry_id: not a stream entry id (e.g. 1700000000000-0)", 422)
    rows = await list_dead_letters(access.redis, stream, 1, entry_id)  # type: ignore[arg-type]
    if not rows or rows[0][0] != entry_id:
        raise AccessError(f"entry_id: no dead letter {entry_id} in {stream}", 404)
    fields = rows[0][1]
    if entry_scope(fields, dead_letter=True)[0] != access.project_id:  # another's, or nobody's
        raise AccessError(f"entry_id: no dead letter {entry_id} of this project in {stream}", 404)
    if step == "preview":
        return ui.render(
            request,
            "redrive.html",
            "Redrive a dead letter",
            done=None,
            stream=stream,
            entry_id=entry_id,
            reason=fields.get("reason", ""),
            source=fields.get("source_stream", ""),
            crumbs=[("/ui/live", "Live")],
        )
    if step != "confirm":
        raise AccessError("step: must be preview or confirm", 422)
    erased = await load_erased(access.redis, access.settings.stream_prefix)  # type: ignore[arg-type]
    done = await redrive(access.redis, stream, [entry_id], erased)  # type: ignore[arg-type]
    return ui.render(
        request, "redrive.html", "Redrive a dead letter", done=done, crumbs=[("/ui/live", "Live")]
    )


ROUTES: list[tuple[str, Any, bool, list[str]]] = [
    ("/live", live, False, ["GET"]),
    ("/live/changes", changes, False, ["GET"]),
    ("/live/redrive", redrive_letter, True, ["POST"]),
]
"""(path under /ui, handler, whether it writes (a CSRF token is checked), methods)."""
