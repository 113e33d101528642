"""``memworker serve``: the tools (``tools.TOOLS``) as an HTTP API, one ``POST /v1/<tool>`` each
with the tool's argument model as its JSON body (read as JSON whatever its ``Content-Type``:
``json_bodies``), so the OpenAPI document (``/openapi.json``)
carries the same schemas an MCP client sees. ``/healthz``, ``/readyz`` and ``/metrics`` as every
memworker service serves them. Every error is ``{"error": "<one line>"}``: 4xx for bad input
(the argument model's message, or the library's), 401 without the token, 413 past the body
limit, 503 when Redis or Postgres cannot be reached; never a stack trace.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from worker.access.guard import LOCAL_HOSTS, Guard
from worker.access.guesses import GuessLimiter
from worker.access.json_bodies import JsonBodies
from worker.access.probes import probe_routes
from worker.access.scope import Access, failure
from worker.access.tools import TOOLS, Tool, invoke

SERVER = "http"
RETRY_AFTER_SECONDS = 2
"""The ``Retry-After`` of a 503 (a server-wide condition: Redis or Postgres unreachable, Redis
nearly full or full): a client backs off at least this long before it retries."""


def _invalid(exc: RequestValidationError, request: Request) -> str:
    """The argument model's problems as one line, as ``scope.invalid_arguments`` words them
    (the body's fields, without FastAPI's ``body`` prefix). A body that is not JSON says where
    it stops being JSON (FastAPI's ``loc`` holds that character's index, not a field) and, when
    that is its end, that the body ends at its ``Content-Length`` (what came after is not read)."""
    problems = []
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "json_invalid":
            problems.append(_not_json(error, request))
            continue
        problems.append(f"{'.'.join(loc) or 'body'}: {message}")
    return "invalid arguments: " + "; ".join(problems)


def _not_json(error: Any, request: Request) -> str:
    where = [p for p in error.get("loc", ()) if isinstance(p, int)]
    reason = str((error.get("ctx") or {}).get("error", "")).strip()
    line = "body: the body is not JSON"
    if where:
        line += f" at character {where[0]}" + (f" ({reason})" if reason else "")
    length = request.headers.get("content-length", "")
    if where and length.isdigit() and where[0] >= int(length) > 0:
        line += (
            f": it ends there, at its Content-Length of {int(length):,} bytes (bytes sent past "
            "the Content-Length are not read)"
        )
    return line


_UNREADABLE = "There was an error parsing the body"
"""FastAPI's 400 for a body its JSON reader failed on other than by a syntax error."""


def _unreadable(exc: HTTPException) -> str:
    """What ``_UNREADABLE`` was: nesting past the reader's depth, or text that is not UTF-8."""
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return (
            "invalid arguments: body: arrays and objects nested too deep to read (JSON within "
            "JSON a thousand levels or so): nest fewer levels"
        )
    if isinstance(cause, UnicodeDecodeError):
        return f"invalid arguments: body: not UTF-8 text (byte {cause.start})"
    return f"invalid arguments: body: the body could not be read as JSON ({type(cause).__name__})"


def _endpoint(tool: Tool) -> Callable[..., Awaitable[Response]]:
    """``POST /v1/<tool>``: the body parsed by the tool's model, then ``invoke``."""
    optional = not any(f.is_required() for f in tool.arguments.model_fields.values())

    async def endpoint(request: Request, arguments: Any) -> Response:
        given = arguments if arguments is not None else tool.arguments()
        status, result = await invoke(request.app.state.access, SERVER, tool.name, given)
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
        return JSONResponse(result, status_code=status, headers=headers)

    default = Body(default=None) if optional else Body()
    annotation = tool.arguments | None if optional else tool.arguments
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
            ),
            inspect.Parameter(
                "arguments",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=annotation,
                default=default,
            ),
        ]
    )
    endpoint.__name__ = tool.name
    return endpoint


def create_app(
    access: Callable[[], Access],
    *,
    token: str | None,
    max_bytes: int,
    allowed_hosts: frozenset[str] | None = LOCAL_HOSTS,
    body_timeout_s: float = 30.0,
    guesses: GuessLimiter | None = None,
    allowed_origins: frozenset[str] = frozenset(),
) -> Any:
    """The ASGI app: the API behind ``Guard`` (host, token, body limit). ``access`` makes the
    server's ``Access`` when the app starts; it is closed when the app stops. ``guesses``: the
    server's count of wrong tokens (shared with the inspector; default: the app's own)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.access = access()
        try:
            yield
        finally:
            await app.state.access.close()

    app = FastAPI(
        title="memworker",
        version=version("memworker"),
        summary="A user's long-term memory and a live session's working memory, for agents.",
        description="The tools of `memworker mcp` over HTTP: `POST /v1/<tool>` with the "
        "tool's arguments as a JSON object. Send `Authorization: Bearer <MEMWORKER_API_TOKEN>` "
        'when the server has one. Errors are `{"error": "<one line>"}`.',
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    for tool in TOOLS:
        app.add_api_route(
            f"/v1/{tool.name}",
            _endpoint(tool),
            methods=["POST"],
            summary=tool.name,
            description=tool.description,
            tags=["reads" if tool.read_only else "writes"],
            response_class=JSONResponse,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return JSONResponse({"error": _invalid(exc, request)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and detail == _UNREADABLE:
            detail = _unreadable(exc)
        elif exc.status_code == 404:
            detail = f"no such path {request.url.path}: the tools are POST /v1/<tool>"
        elif exc.status_code == 405:
            detail = f"{request.method} {request.url.path}: use POST"
        return JSONResponse({"error": detail}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        status, line = failure(exc)
        # 503: a server-wide condition (Redis or Postgres down, Redis nearly full): retry.
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
        return JSONResponse({"error": line}, status_code=status, headers=headers)

    app.router.routes.extend(probe_routes(lambda request: request.app.state.access))

    return Guard(
        JsonBodies(app),
        token=token,
        max_bytes=max_bytes,
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
        body_timeout_s=body_timeout_s,
        guesses=guesses,
    )
