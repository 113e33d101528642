"""``mcp --http`` spoken to in MCP's 2026-07-28 revision (no session: each request alone, its
version and tool in headers and ``_meta``), as a real process whose Redis and Postgres cannot
be reached, so nothing can be written: no token is 401 with the token never echoed, and a NUL,
a huge value, a wrong type, an unknown tool or a body that is not JSON each get one line naming
what is wrong, never a 500 or a 503, and no traceback."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.security.processes import clean_env, free_port, listening

TOKEN = "modern-token-7c2d"
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def call(tool: str, arguments: Any, token: str | None = TOKEN) -> dict[str, Any]:
    """The headers and body of a 2026-07-28 ``tools/call``."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
        **({"Authorization": f"Bearer {token}"} if token else {}),
    }
    params = {"name": tool, "arguments": arguments, "_meta": META}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
    return {"headers": headers, "content": json.dumps(body)}


async def test_the_2026_revision_refuses_bad_input_naming_it_and_strangers_with_401() -> None:
    port = free_port()
    args = ["mcp", "--http", str(port), "--host", "127.0.0.1"]
    with listening(args, clean_env(MEMWORKER_API_TOKEN=TOKEN), "MCP of project") as process:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for token in (None, "wrong", TOKEN[:-1]):
                got = await http.post("/mcp", **call("recall", {"query": "x"}, token))
                assert got.status_code == 401, got.text
                assert TOKEN not in got.text
            refused = {
                "user_id": call("recall", {"query": "x", "user_id": "ann\x00"}),
                "query": call("recall", {"query": "q" * 1_000_000}),
                "limit": call("recall", {"query": "x", "limit": "five"}),
                "input": call("remember", {"session_id": "s", "input": 5, "output": ""}),
                "no tool": call("no_such_tool", {}),
            }
            for field, request in refused.items():
                got = await http.post("/mcp", **request)
                assert got.status_code < 500, (field, got.status_code, got.text[:300])
                if got.status_code == 413:  # the body limit, named
                    assert "MEMWORKER_API_MAX_REQUEST_BYTES" in got.text, got.text[:300]
                    continue
                result = got.json()["result"]
                assert result["isError"] is True, (field, got.text[:300])
                error = json.loads(result["content"][0]["text"])["error"]
                assert field in error and "\n" not in error, (field, error[:300])
            unreadable = call("recall", {"query": "x"})
            unreadable["content"] = "{not json"
            got = await http.post("/mcp", **unreadable)
            assert got.status_code == 400, got.text
            assert "line 1 column 2" in got.json()["error"]["message"], got.text
    assert "Traceback" not in "".join(process.lines)
