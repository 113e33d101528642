"""``memworker mcp``: the tools (``tools.TOOLS``) as an MCP server on the official SDK's
low-level ``Server``: over stdio (what desktop assistants and agent frameworks start), or
streamable HTTP (``--http PORT``, path ``/mcp``, behind the same ``Guard`` as
``memworker serve``, with the same probes; sessions capped and closed when idle; each request
answered with one JSON body, not an event stream: the transport's ``json_response``, which also
serves a call of the 2026-07-28 revision, which has no session, inline). Listing
gives each tool's description and JSON Schema; a call answers the tool's JSON result as text,
or ``{"error": "<one line>"}`` with ``isError`` set, also for a request the SDK cannot read
but JSON can (a lone surrogate: ``mcp_intake``).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import mcp_types as types
import orjson
from mcp.server import Server, ServerRequestContext

if TYPE_CHECKING:
    from worker.access.scope import Access

SERVER = "mcp"

INSTRUCTIONS = (
    "memworker keeps what an agent knows about a user across sessions: remember each turn, "
    "recall past turns and facts by meaning or words, keep pinned blocks (persona, goals) in "
    "view, and read or set a live session's working memory. Call profile or working first to "
    "see what is known."
)


def listed() -> list[types.Tool]:
    """Every tool as MCP lists it: name, description, input schema, read-only hint (the tools,
    their models and the user-memory room load at the first listing, not at ``initialize``;
    built once: ``_LISTED``)."""
    if not _LISTED:
        from worker.access.tools import TOOLS

        _LISTED.extend(
            types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=tool.schema(),
                annotations=types.ToolAnnotations(
                    read_only_hint=tool.read_only,
                    destructive_hint=tool.name == "forget",
                    idempotent_hint=tool.read_only or tool.name in ("remember", "update_block"),
                ),
            )
            for tool in TOOLS
        )
    return list(_LISTED)


_LISTED: list[types.Tool] = []
"""The tools as listed, made at the first listing: a tool's JSON Schema is pydantic's work
over its argument model (~1 ms for all of them), and the SDK asks for it at each call of the
2026-07-28 revision (``input_schema``), which made that revision ~7× slower than a session's
call (BENCHMARKS.md, many agents at once)."""


def input_schema(name: str) -> dict[str, Any] | None:
    """A tool's input schema by name, or None (no such tool: the call itself says so): what
    the SDK checks a 2026-07-28 call's ``Mcp-Param-*`` headers against, in place of running
    ``tools/list`` for every call."""
    listed()  # made once
    return next((tool.input_schema for tool in _LISTED if tool.name == name), None)


def build(access: Callable[[], Access]) -> Server[Any]:
    """The MCP server; ``access`` is called once, on the first request, for the server's
    scope and connections (closed by ``close``)."""
    made: list[Access] = []

    def scope() -> Access:
        if not made:
            made.append(access())
        return made[0]

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed())

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        from worker.access.mcp_direct import call_text
        from worker.access.tools import invoke

        status, result = await invoke(scope(), SERVER, params.name, params.arguments)
        text, failed = call_text(status, result)
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=failed)

    server: Server[Any] = Server(
        "memworker",
        version=version("memworker"),
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=input_schema,
    )
    server.memworker_access = made  # type: ignore[attr-defined]
    server.memworker_scope = scope  # type: ignore[attr-defined]
    return server


async def close(server: Server[Any]) -> None:
    """Close the server's ``Access`` if a request opened one."""
    for made in server.memworker_access:  # type: ignore[attr-defined]
        await made.close()


async def run_stdio(access: Callable[[], Access]) -> None:
    """Serve MCP on stdin/stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    from worker.access.mcp_intake import StdioIntake
    from worker.access.mcp_screen import ScreenedStdin, claim_stdin

    server = build(access)
    wire, restore = claim_stdin()
    try:
        stdin = ScreenedStdin(wire)  # a line refused before the SDK reads it, answered
        async with stdio_server(stdin=stdin) as (read, write):
            stdin.answer_on(write)
            intake = StdioIntake(read, write)  # a line the SDK cannot read, answered
            await server.run(intake, write, server.create_initialization_options())
    finally:
        restore()
        await close(server)


def http_app(
    access: Callable[[], Access],
    *,
    token: str | None,
    max_bytes: int,
    allowed_hosts: frozenset[str] | None,
    max_sessions: int,
    allowed_origins: frozenset[str] = frozenset(),
    idle_seconds: float,
    body_timeout_s: float = 30.0,
    direct_calls: bool = True,
) -> tuple[Server[Any], Any]:
    """The streamable HTTP app (path ``/mcp``, with ``/healthz``, ``/readyz``, ``/metrics``)
    behind ``Guard`` (which checks ``Host`` and ``Origin`` for both doors), and its server. At
    most ``max_sessions`` sessions are open (a new one past them is refused 503); a session
    idle for ``idle_seconds`` is closed. With ``direct_calls`` a tool call the SDK would serve
    as it is is answered without its dispatch (``mcp_direct``)."""
    from mcp.server.transport_security import TransportSecuritySettings

    from worker.access.guard import Guard
    from worker.access.mcp_direct import DirectCalls
    from worker.access.mcp_intake import HttpIntake
    from worker.access.probes import probe_routes
    from worker.metrics import MCP_SESSIONS_OPEN

    server = build(access)
    scope = server.memworker_scope  # type: ignore[attr-defined]
    app = server.streamable_http_app(
        max_request_body_size=max_bytes,
        # one JSON body a request: an event stream's task group and memory streams a call made
        # MCP ~0.4 of serve's rate; a 2026-07-28 call is then served inline (BENCHMARKS.md)
        json_response=True,
        max_sessions=max_sessions,
        session_idle_timeout=idle_seconds,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        custom_starlette_routes=probe_routes(lambda request: scope()),
    )
    manager = server.session_manager
    # Read at each scrape: the SDK's table of open sessions (no hook to count them by).
    MCP_SESSIONS_OPEN.set_function(lambda: len(getattr(manager, "_server_instances", ())))
    direct = DirectCalls(server, scope, idle_seconds) if direct_calls else None
    capped = SessionCapMessage(HttpIntake(app, direct), max_sessions)
    guarded = Guard(
        capped,
        token=token,
        max_bytes=max_bytes,
        allowed_hosts=allowed_hosts,
        allowed_origins=allowed_origins,
        body_timeout_s=body_timeout_s,
    )
    return server, guarded


class SessionCapMessage:
    """The SDK's refusal of a session past the cap (503 ``Too many open sessions``), said with
    the limit, the setting and what to do; every other response passes untouched."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.message = (
            f"Too many open sessions: {limit} are open (MEMWORKER_MCP_MAX_SESSIONS); close "
            "yours when done (DELETE /mcp), or retry once an idle one is closed "
            "(MEMWORKER_MCP_SESSION_IDLE_SECONDS)"
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        opening = (
            scope["type"] == "http"
            and scope["path"] == "/mcp"
            and not any(name == b"mcp-session-id" for name, _ in scope.get("headers") or [])
        )
        if not opening:
            await self.app(scope, receive, send)
            return
        refused: list[Any] = []

        async def rewrite(message: Any) -> None:
            if message["type"] == "http.response.start" and message["status"] == 503:
                refused.append(message)
                return
            if refused and message["type"] == "http.response.body":
                if message.get("more_body"):
                    return
                body = orjson.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": None,
                        "error": {"code": -32603, "message": self.message},
                    }
                )
                headers = [
                    (k, v) for k, v in refused[0]["headers"] if k.lower() != b"content-length"
                ]
                headers.append((b"content-length", str(len(body)).encode()))
                await send({**refused[0], "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, rewrite)
