"""``memworker mcp --http`` as a real process against real Redis and Postgres, spoken to in raw
JSON-RPC as any client would: a session's call (the 2025 handshake) is answered with one JSON
body, not an event stream; a call of MCP's 2026-07-28 revision (no session: each request
stands alone, its version, client and tool in headers and ``_meta``) remembers and recalls,
names a bad argument, and a routing header that contradicts the body is refused."""

from __future__ import annotations

import json
from typing import Any

import httpx
from redis.asyncio import Redis

from tests.integration.test_access import AUTH, mcp_over_http
from worker.settings import Settings

MODERN = "2026-07-28"
HANDSHAKE = "2025-06-18"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
ACCEPT = {"Accept": "application/json, text/event-stream", **AUTH}


def modern_call(n: int, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, str], str]:
    """The headers and body of a 2026-07-28 ``tools/call``."""
    headers = {
        **ACCEPT,
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }
    params = {"name": tool, "arguments": arguments, "_meta": META}
    body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": params}
    return headers, json.dumps(body)


async def open_session(http: httpx.AsyncClient) -> dict[str, str]:
    """The headers of a call on a new, initialised session of the 2025 handshake."""
    opened = await http.post(
        "/mcp",
        headers=ACCEPT,
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": HANDSHAKE,
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "1"},
            },
        },
    )
    assert opened.status_code == 200, opened.text
    session = {
        **ACCEPT,
        "content-type": "application/json",
        "mcp-session-id": opened.headers["mcp-session-id"],
        "mcp-protocol-version": HANDSHAKE,
    }
    ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post("/mcp", headers=session, json=ready)).status_code == 202
    return session


def tool_result(response: httpx.Response) -> tuple[bool, Any]:
    """Whether the call failed, and the tool's JSON answer; the response one JSON body."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    result = response.json()["result"]
    return bool(result.get("isError")), json.loads(result["content"][0]["text"])


async def test_mcp_over_http_answers_json_to_a_session_and_to_the_2026_revision(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with (
        mcp_over_http(settings, database_url) as base,
        httpx.AsyncClient(base_url=base, timeout=30) as http,
    ):
        # a session of the 2025 handshake: its call answered as one JSON body
        session = await open_session(http)
        turn = {"user_id": "ann", "session_id": "c", "input": "ferry to Tangier"}
        turn["output"] = "ok"
        call = {"name": "remember", "arguments": turn}
        done = await http.post(
            "/mcp",
            headers=session,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call},
        )
        failed, answer = tool_result(done)
        assert not failed, answer

        # the 2026-07-28 revision: no session, each call alone
        headers, body = modern_call(2, "remember", {**turn, "input": "train to Fez"})
        failed, answer = tool_result(await http.post("/mcp", headers=headers, content=body))
        assert not failed and answer["id"], answer
        headers, body = modern_call(3, "recall", {"user_id": "ann", "query": "Fez Tangier"})
        failed, found = tool_result(await http.post("/mcp", headers=headers, content=body))
        assert not failed, found
        said = {m["episode"]["input"] for m in found}
        assert said == {"ferry to Tangier", "train to Fez"}, found

        # a bad argument is named; a header that contradicts the body is refused
        headers, body = modern_call(4, "recall", {"user_id": "ann", "query": "x", "limit": 0})
        failed, answer = tool_result(await http.post("/mcp", headers=headers, content=body))
        assert failed and "limit" in answer["error"], answer
        headers, body = modern_call(5, "recall", {"user_id": "ann", "query": "Fez"})
        headers["Mcp-Name"] = "forget"
        refused = await http.post("/mcp", headers=headers, content=body)
        assert refused.status_code == 400, refused.text
        assert "mcp-name" in refused.json()["error"]["message"], refused.text

        # a body that is not JSON says where; a call answered before the SDK (a lone
        # surrogate) carries the revision's resultType
        refused = await http.post("/mcp", headers=headers, content=b"{not json")
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert message == "Parse error: key must be a string at line 1 column 2", message
        headers, body = modern_call(6, "recall", {"user_id": "ann", "query": "\ud800"})
        screened = await http.post("/mcp", headers=headers, content=body)
        failed, answer = tool_result(screened)
        assert failed and "query" in answer["error"], answer
        assert screened.json()["result"]["resultType"] == "complete", screened.text

        # without the token, nothing
        headers, body = modern_call(7, "recall", {"user_id": "ann", "query": "Fez"})
        del headers["Authorization"]
        assert (await http.post("/mcp", headers=headers, content=body)).status_code == 401
