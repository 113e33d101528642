"""The inspector as an ASGI app (``inspector_app``) and ``with_inspector``, which serves it at
``/ui`` beside ``memworker serve``'s API: its requests pass the same ``Guard`` (the allowed
hosts, the Origin rule, the body limit), then the inspector's own sign-in (``auth``)."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from worker.access.guard import LOCAL_HOSTS, Guard
from worker.access.guesses import GuessLimiter
from worker.inspector import live, pages
from worker.inspector.app import (
    HERE,
    PREFIX,
    Inspector,
    Shared,
    login,
    logout,
    page,
    score,
    when,
)
from worker.inspector.auth import Keys


def inspector_app(
    shared: Shared, token: str | None, guesses: GuessLimiter | None = None
) -> Starlette:
    """The inspector's pages (``pages``, ``live``) under ``/ui``; ``guesses``: the server's
    count of wrong tokens (default: the app's own)."""
    templates = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
    )
    templates.filters["when"] = when
    templates.filters["score"] = score
    routes: list[BaseRoute] = [
        Route(PREFIX, lambda r: RedirectResponse(PREFIX + "/", 307)),
        Route(PREFIX + "/login", login, methods=["GET", "POST"]),
        Route(PREFIX + "/logout", page(logout, writes=True), methods=["POST"]),
        *[Route(PREFIX + path, page(h, writes=w), methods=m) for path, h, w, m in pages.ROUTES],
        *[Route(PREFIX + path, page(h, writes=w), methods=m) for path, h, w, m in live.ROUTES],
        Mount(PREFIX + "/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.ui = Inspector(
        shared, Keys(token), templates, guesses if guesses is not None else GuessLimiter()
    )

    async def not_found(request: Request, exc: Exception) -> Response:
        ui: Inspector = request.app.state.ui
        code = getattr(exc, "status_code", 404)
        line = "no such page" if code == 404 else f"{request.method} is not allowed here"
        return ui.error(request, code, f"{line}: {request.url.path[:200]}")

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_found)
    return app


class WithInspector:
    """``api`` with the inspector at ``/ui``: a request under it goes to ``ui`` (behind its own
    ``Guard``), everything else (and the lifespan) to ``api``."""

    def __init__(self, api: Any, ui: Any) -> None:
        self.api, self.ui = api, ui

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path == PREFIX or path.startswith(PREFIX + "/")):
            await self.ui(scope, receive, send)
        else:
            await self.api(scope, receive, send)


def with_inspector(
    api: Any,
    shared: Shared,
    *,
    token: str | None,
    max_bytes: int,
    allowed_hosts: frozenset[str] | None = LOCAL_HOSTS,
    body_timeout_s: float = 30.0,
    guesses: GuessLimiter | None = None,
    allowed_origins: frozenset[str] = frozenset(),
) -> WithInspector:
    """``api`` (``http_api.create_app`` made with ``shared`` as its ``access``) with the
    inspector at ``/ui``: the same host rule, token and body limit, and ``guesses`` (pass the
    API's, so a wrong token counts once whichever door it is sent to)."""
    guarded = Guard(
        inspector_app(shared, token, guesses),
        token=None,  # the inspector signs in by cookie or header itself (``auth``)
        max_bytes=max_bytes,
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
        body_timeout_s=body_timeout_s,
    )
    return WithInspector(api, guarded)
