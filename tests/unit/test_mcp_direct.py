"""Which requests ``mcp --http`` answers without the SDK's dispatch (``mcp_direct``): the SDK's
HTTP app in process, no store reached (every call here is refused on its arguments before a
store is touched). A session's call and a 2026-07-28 call are answered without reaching the
SDK; ``initialize``, a call on a session never opened, and a call whose headers the SDK
refuses reach it. What the answers are, against the SDK's, is
``tests/integration/test_mcp_direct_calls.py``'s."""

from __future__ import annotations

import json
from typing import Any

import httpx
from mcp.server.transport_security import TransportSecuritySettings

from tests.integration.test_mcp_http_answers import modern_call, open_session
from worker.access import mcp_server
from worker.access.mcp_direct import DirectCalls, call_text
from worker.access.mcp_intake import HttpIntake


class Counted:
    """The SDK's app, counting the requests that reach it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.reached: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached.append(scope["path"])
        await self.app(scope, receive, send)


def call(request_id: int, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": "recall", "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def test_calls_the_sdk_would_serve_are_answered_without_it_and_the_rest_reach_it() -> None:
    server = mcp_server.build(lambda: None)  # type: ignore[arg-type, return-value]
    unguarded = TransportSecuritySettings(enable_dns_rebinding_protection=False)  # Guard's job
    sdk = Counted(server.streamable_http_app(json_response=True, transport_security=unguarded))
    app = HttpIntake(sdk, DirectCalls(server, server.memworker_scope, 60.0))  # type: ignore[attr-defined]
    transport = httpx.ASGITransport(app=app)
    async with (
        server.session_manager.run(),
        httpx.AsyncClient(transport=transport, base_url="http://localhost") as http,
    ):
        session = await open_session(http)  # initialize, initialized: the SDK's
        assert len(sdk.reached) == 2

        # a session's call: answered here, naming the bad argument, with its session
        bad = {"user_id": "ann", "query": "x", "limit": 0}
        answered = await http.post("/mcp", headers=session, json=call(1, bad))
        assert answered.status_code == 200, answered.text
        assert answered.headers["mcp-session-id"] == session["mcp-session-id"]
        result = answered.json()["result"]
        assert result["isError"] and "limit" in json.loads(result["content"][0]["text"])["error"]
        # a 2026-07-28 call: answered here too
        headers, body = modern_call(2, "recall", bad)
        answered = await http.post("/mcp", headers=headers, content=body)
        assert answered.json()["result"]["resultType"] == "complete", answered.text
        assert "limit" in json.loads(answered.json()["result"]["content"][0]["text"])["error"]
        assert len(sdk.reached) == 2

        # the SDK's to answer: a session never opened, a header contradicting the body
        unknown = {**session, "mcp-session-id": "0" * 32}
        assert (await http.post("/mcp", headers=unknown, json=call(3, {}))).status_code == 404
        headers["Mcp-Name"] = "forget"
        assert (await http.post("/mcp", headers=headers, content=body)).status_code == 400
        assert len(sdk.reached) == 4

        # a session the client closed: its calls are the SDK's again (404)
        assert (await http.delete("/mcp", headers=session)).status_code == 200
        closed = await http.post("/mcp", headers=session, json=call(4, {}))
        assert closed.status_code == 404, closed.text
        assert len(sdk.reached) == 6


def test_an_answer_nested_deeper_than_orjson_writes_is_sent_and_one_json_cannot_is_an_error() -> (
    None
):
    deep: Any = []
    for _ in range(300):  # deeper than orjson writes: a value serve's wm_set stored
        deep = [deep]
    text, failed = call_text(200, {"value": deep})
    assert not failed and json.loads(text) == {"value": deep}
    text, failed = call_text(200, {"value": object()})  # neither writes it as JSON
    assert failed and json.loads(text)["error"].startswith("the answer cannot be sent as JSON")
    assert call_text(422, {"error": "limit: too small"}) == ('{"error":"limit: too small"}', True)
    assert call_text(200, [1]) == ("[1]", False)
