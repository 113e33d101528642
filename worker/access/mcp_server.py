"""``memworker mcp``: the tools (``tools.TOOLS``) as an MCP server on the official SDK's
low-level ``Server``: over stdio (what desktop assistants and agent frameworks start), or
streamable HTTP (``--http PORT``, path ``/mcp``, behind the same ``Guard`` as
``memworker serve``). Listing gives each tool's description and JSON Schema; a call answers
the tool's JSON result as text, or ``{"error": "<one line>"}`` with ``isError`` set.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

import mcp_types as types
import orjson
from mcp.server import Server, ServerRequestContext

from worker.access.tools import TOOLS, invoke

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
    """Every tool as MCP lists it: name, description, input schema, read-only hint."""
    return [
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
    ]


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
        status, result = await invoke(scope(), SERVER, params.name, params.arguments)
        text = orjson.dumps(result).decode()
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=status >= 400)

    server: Server[Any] = Server(
        "memworker",
        version=version("memworker"),
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    server.memworker_access = made  # type: ignore[attr-defined]
    return server


async def close(server: Server[Any]) -> None:
    """Close the server's ``Access`` if a request opened one."""
    for made in server.memworker_access:  # type: ignore[attr-defined]
        await made.close()


async def run_stdio(access: Callable[[], Access]) -> None:
    """Serve MCP on stdin/stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    server = build(access)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await close(server)


def http_app(
    access: Callable[[], Access], *, host: str, token: str | None, max_bytes: int
) -> tuple[Server[Any], Any]:
    """The streamable HTTP app (path ``/mcp``) behind ``Guard``, and its server."""
    from worker.access.guard import Guard

    server = build(access)
    app = server.streamable_http_app(host=host, max_request_body_size=max_bytes)
    return server, Guard(app, token=token, max_bytes=max_bytes)
