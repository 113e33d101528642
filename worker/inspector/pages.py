"""The inspector's pages about memory: the project and its users, a user (pinned blocks,
facts timeline, sessions, profile), a session's messages, recall with its scores, forget (a
dry-run receipt, a confirmation, the receipt) and a pinned block's edit (with a confirmation).
Every user id and session id is checked by the id rule (a hostile one is a 4xx) and, on a
pinned server, must be its user (else 403): ``Access.user``."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from urllib.parse import quote

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from schemas.inputs import When
from worker.access.scope import AccessError
from worker.erasure.forget import forget_project
from worker.erasure.scope import InvalidForgetError, check_range
from worker.ids import validate_id
from worker.inspector import queries
from worker.inspector.app import PREFIX, Inspector, user_url

RECALL_LIMIT = 10
SESSION_MESSAGES = 200
"""Messages shown of a session (its newest, oldest first)."""
_WHEN: TypeAdapter[datetime] = TypeAdapter(When)


def _user(ui: Inspector, request: Request) -> str:
    """The path's user: a valid id the server serves (a pinned server: its own, else 403)."""
    asked = validate_id(request.path_params["user_id"], "user_id")
    user = ui.access.user(asked)
    assert user is not None
    return user


def _crumbs(user_id: str) -> list[tuple[str, str]]:
    return [(PREFIX + "/", "Users"), (user_url(user_id), user_id)]


def _int(value: str | None, field: str, default: int, low: int, high: int) -> int:
    if value is None or value == "":
        return default
    if not value.isdigit() or not low <= int(value) <= high:
        raise AccessError(f"{field}: must be a whole number from {low} to {high}", 422)
    return int(value)


async def home(request: Request, ui: Inspector) -> Response:
    access = ui.access
    q = request.query_params.get("q", "").strip()
    if len(q) > 128:
        raise AccessError("q: at most 128 characters (an id is)", 422)
    counts = await queries.project_counts(access.engine, access.project_id)
    if access.user_id is not None:  # a pinned server: its user alone, and its counts
        rows = await queries.users(access.engine, access.project_id, only=access.user_id)
        rows = rows or [queries.UserRow(access.user_id)]
        counts = rows[0].counts
    else:
        rows = await queries.users(access.engine, access.project_id, q)
    return ui.render(
        request,
        "home.html",
        f"Project {access.project_id}",
        counts=counts,
        rows=rows,
        q=q,
        shown=queries.USERS_SHOWN,
        crumbs=[],
    )


async def user(request: Request, ui: Inspector) -> Response:
    access, user_id = ui.access, _user(ui, request)
    shown = _int(
        request.query_params.get("facts"), "facts", queries.FACTS_SHOWN, 1, queries.FACTS_MAX
    )
    (facts, total), profile, blocks, sessions = await asyncio.gather(  # each its connection
        queries.facts_timeline(access.engine, access.project_id, user_id, shown),
        access.memory.profile(user_id=user_id),
        access.memory.working(user_id=user_id),
        queries.session_count(access.engine, access.project_id, user_id),
    )
    counts = queries.Counts(profile.episode_count, profile.fact_count, len(blocks), sessions)
    return ui.render(
        request,
        "user.html",
        f"User {user_id}",
        user_id=user_id,
        base=user_url(user_id),
        crumbs=[(PREFIX + "/", "Users")],
        counts=counts,
        profile=profile,
        blocks=blocks,
        facts=facts,
        facts_total=total,
        more=min(queries.FACTS_MAX, shown * 5),
    )


async def session(request: Request, ui: Inspector) -> Response:
    user_id = _user(ui, request)
    session_id = validate_id(request.path_params["session_id"], "session_id")
    messages = await ui.access.memory.session_messages(
        session_id, user_id=user_id, limit=SESSION_MESSAGES
    )
    return ui.render(
        request,
        "session.html",
        f"Session {session_id}",
        messages=messages,
        session_id=session_id,
        base=user_url(user_id),
        crumbs=_crumbs(user_id),
    )


async def recall(request: Request, ui: Inspector) -> Response:
    access, user_id = ui.access, _user(ui, request)
    q = request.query_params.get("q")
    limit = _int(request.query_params.get("limit"), "limit", RECALL_LIMIT, 1, 100)
    context: dict[str, Any] = {"q": q or "", "limit": limit, "searched": q is not None}
    if q is not None:
        matches, facts = await asyncio.gather(  # each its connection: the page waits for one
            access.memory.recall_scored(q, limit=limit, user_id=user_id),
            access.memory.recall_facts_scored(q, limit=limit, user_id=user_id),
        )
        context.update(matches=matches, unindexed=matches.unindexed, facts=facts)
    return ui.render(
        request,
        "recall.html",
        f"Recall for {user_id}",
        base=user_url(user_id),
        crumbs=_crumbs(user_id),
        floor=access.settings.recall_min_similarity,
        **context,
    )


class _Selector:
    """The forget form's session and times (``since``: a range's start, with ``before``),
    checked whole; ``typed``: as typed, for the form and the confirm step."""

    def __init__(self, form: Any) -> None:
        names = ("session_id", "before", "since")
        self.typed: dict[str, Any] = {k: str(form.get(k) or "").strip() for k in names}
        session = self.typed["session_id"]
        self.session_id = validate_id(session, "session_id") if session else None
        try:
            self.since, self.before = check_range(self._time("since"), self._time("before"))
        except InvalidForgetError as exc:
            raise AccessError(str(exc), 422) from None

    def _time(self, name: str) -> datetime | None:
        if not self.typed[name]:
            return None
        try:
            return _WHEN.validate_python(self.typed[name])
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise AccessError(
                f"{name}: {problem} (RFC 3339, e.g. 2026-01-01T00:00:00Z)", 422
            ) from None


async def forget_form(request: Request, ui: Inspector) -> Response:
    return _forget_page(request, ui, _user(ui, request), _Selector(request.query_params))


def _forget_page(
    request: Request,
    ui: Inspector,
    user_id: str,
    chosen: _Selector,
    receipt: Any = None,
    forgotten: Any = None,
) -> Response:
    """The forget page: the form (``chosen`` filled in) and, after a step, its receipt."""
    return ui.render(
        request,
        "forget.html",
        f"Forget {user_id}",
        user_id=user_id,
        base=user_url(user_id),
        crumbs=_crumbs(user_id),
        receipt=receipt,
        forgotten=forgotten,
        **chosen.typed,
    )


async def forget(request: Request, ui: Inspector) -> Response:
    """``step=preview``: the erasure's dry run (nothing touched); ``step=confirm``: the
    forget itself (``Memory.forget``: ``worker.erasure`` and the change feed's event)."""
    access, user_id = ui.access, _user(ui, request)
    form = await request.form()
    chosen = _Selector(form)
    session_id, before, since = chosen.session_id, chosen.before, chosen.since
    step = form.get("step")
    forgotten = None
    receipt: Any
    if step == "preview":
        settings = access.settings
        result = await forget_project(
            access.engine,
            access.project_id,
            session_id=session_id,
            before=before,
            since=since,
            redis=access.redis,  # type: ignore[arg-type]
            prefix=settings.stream_prefix,
            shards=settings.shards,
            user_id=user_id,
            dry_run=True,
        )
        receipt = result.receipt
    elif step == "confirm":
        forgotten = await access.memory.forget(
            user_id=user_id, session_id=session_id, before=before, since=since
        )
        receipt = _Done(user_id, session_id, before, since, forgotten)
    else:
        raise AccessError("step: must be preview or confirm", 422)
    return _forget_page(request, ui, user_id, chosen, receipt, forgotten)


class _Done:
    """The receipt of a confirmed forget as the page shows it."""

    dry_run = False

    def __init__(
        self,
        user_id: str,
        session_id: str | None,
        before: datetime | None,
        since: datetime | None,
        forgotten: int,
    ) -> None:
        self.scope = f"user {user_id}" + (f", session {session_id}" if session_id else "")
        if since is not None:
            self.scope += f", history from {since.isoformat()}"
        if before is not None:
            self.scope += f", history before {before.isoformat()}"
        self.forgotten = forgotten

    def lines(self) -> list[str]:
        return [f"forgot {self.scope}: {self.forgotten} episode(s), fact(s) and block(s)"]


async def block_edit(request: Request, ui: Inspector) -> Response:
    """GET: the block's editor; POST ``step=preview``: now and new side by side, to confirm;
    POST ``step=confirm``: ``Memory.update_block``, then back to the user's page."""
    access, user_id = ui.access, _user(ui, request)
    name = validate_id(request.path_params["name"], "name")
    blocks = {b.name: b.content for b in await access.memory.working(user_id=user_id)}
    base = user_url(user_id)
    action = f"{base}/blocks/{quote(name, safe='')}/edit"
    context: dict[str, Any] = {
        "name": name,
        "base": base,
        "action": action,
        "current": blocks.get(name, ""),
        "crumbs": _crumbs(user_id),
    }
    if request.method == "GET":
        return ui.render(request, "block_edit.html", f"Edit block {name}", confirm=False, **context)
    form = await request.form()
    content, step = form.get("content"), form.get("step")
    if not isinstance(content, str):
        raise AccessError("content: the block's text is missing", 422)
    content = content.replace("\r\n", "\n")
    if step == "preview":
        return ui.render(
            request,
            "block_edit.html",
            f"Edit block {name}",
            confirm=True,
            content=content,
            **context,
        )
    if step != "confirm":
        raise AccessError("step: must be preview or confirm", 422)
    await access.memory.update_block(name, content, user_id=user_id)
    from starlette.responses import RedirectResponse

    return RedirectResponse(base + "#blocks", 303)


ROUTES: list[tuple[str, Any, bool, list[str]]] = [
    ("/", home, False, ["GET"]),
    ("/users/{user_id}", user, False, ["GET"]),
    ("/users/{user_id}/sessions/{session_id}", session, False, ["GET"]),
    ("/users/{user_id}/recall", recall, False, ["GET"]),
    ("/users/{user_id}/forget", forget_form, False, ["GET"]),
    ("/users/{user_id}/forget", forget, True, ["POST"]),
    ("/users/{user_id}/blocks/{name}/edit", block_edit, False, ["GET"]),
    ("/users/{user_id}/blocks/{name}/edit", block_edit, True, ["POST"]),
]
"""(path under /ui, handler, whether it writes (a CSRF token is checked), methods)."""
