"""``mcp --http`` answers a tool call without the SDK's dispatch (``worker.access.mcp_direct``):
real processes, raw JSON-RPC. Every request below, a session's and one of the 2026-07-28
revision, good and bad, gets the same answer (status, content type, JSON) from a server
answering calls directly as from one sending everything through the SDK
(``MEMWORKER_MCP_DIRECT_CALLS=false``); a session kept busy by calls answered directly is not
closed as idle, nor one whose call runs past the idle timeout, and one left idle is."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from redis.asyncio import Redis
from sqlalchemy import text

from tests.integration.test_access import mcp_over_http
from tests.integration.test_mcp_http_answers import modern_call, open_session
from worker.db.engine import create_database_engine
from worker.settings import Settings


def session_call(request_id: Any, tool: str, arguments: Any, **params: Any) -> dict[str, Any]:
    call = {"name": tool, "arguments": arguments, **params}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": call}


def nested(depth: int) -> Any:
    """A list ``depth`` lists deep."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def seen(response: httpx.Response) -> tuple[int, str, Any, bool]:
    """What a client sees of an answer (a session's id aside: each server has its own)."""
    kind = response.headers.get("content-type", "").split(";")[0]
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = response.text
    return response.status_code, kind, body, "mcp-session-id" in response.headers


async def test_a_call_answered_directly_is_answered_as_the_sdk_answers_it(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with (
        mcp_over_http(settings, database_url) as direct_base,
        mcp_over_http(settings, database_url, MEMWORKER_MCP_DIRECT_CALLS="false") as sdk_base,
        httpx.AsyncClient(base_url=direct_base, timeout=30) as direct,
        httpx.AsyncClient(base_url=sdk_base, timeout=30) as sdk,
    ):
        sessions = {direct: await open_session(direct), sdk: await open_session(sdk)}
        turn = {"user_id": "ann", "session_id": "c", "input": "ferry to Tangier", "output": "ok"}
        remembered = await direct.post(
            "/mcp", headers=sessions[direct], json=session_call(1, "remember", turn)
        )
        assert seen(remembered)[:2] == (200, "application/json"), remembered.text
        assert not remembered.json()["result"]["isError"], remembered.text

        recall = {"user_id": "ann", "query": "Tangier"}
        session_cases: list[tuple[dict[str, str], dict[str, Any]]] = [
            ({}, session_call(2, "recall", recall)),
            ({}, session_call("two", "profile", {"user_id": "ann"})),
            ({}, session_call(3, "recall", {**recall, "limit": 0})),  # a bad argument
            ({}, session_call(4, "remember", {"user_id": "ann"})),  # fields missing
            ({}, session_call(5, "nope", {})),  # no such tool
            ({}, session_call(6, "recall", recall, _meta={"progressToken": 1})),
            ({}, session_call(7, "recall", "ten")),  # arguments not an object
            ({}, {**session_call(8, "recall", recall), "extra": 1}),
            ({"mcp-session-id": "no-such-session"}, session_call(9, "recall", recall)),
            ({"content-type": "text/plain"}, session_call(10, "recall", recall)),
            ({"Accept": "text/html"}, session_call(11, "recall", recall)),
            # read by the SDK's parser: an integer past 64 bits exact, nesting past its depth
            ({}, session_call(12, "recall", {**recall, "limit": 2**64 + 1})),
            ({}, session_call(13, "recall", {**recall, "query": nested(201)})),
            ({"content-type": "text/plain, application/json"}, session_call(14, "remember", turn)),
        ]
        statuses = []
        for extra, request in session_cases:
            answers = [
                seen(
                    await client.post(
                        "/mcp",
                        headers={**sessions[client], **extra},
                        content=json.dumps(request),
                    )
                )
                for client in (direct, sdk)
            ]
            assert answers[0] == answers[1], (extra, request, answers)
            statuses.append(answers[0][0])
        # the good calls and the bad arguments answered, the rest refused as the SDK refuses
        assert statuses == [200] * 8 + [404, 400, 406, 200, 400, 400], statuses
        ok = await direct.post("/mcp", headers=sessions[direct], json=session_cases[0][1])
        found = json.loads(ok.json()["result"]["content"][0]["text"])
        assert [m["episode"]["input"] for m in found] == ["ferry to Tangier"], found

        modern_cases: list[tuple[Any, str]] = []
        headers, body = modern_call(20, "recall", recall)
        modern_cases.append((headers, body))
        headers, body = modern_call(21, "recall", {**recall, "limit": "ten"})
        modern_cases.append((headers, body))
        headers, body = modern_call(22, "recall", recall)
        modern_cases.append(({**headers, "Mcp-Name": "forget"}, body))  # contradicts the body
        headers, body = modern_call(23, "recall", recall)
        modern_cases.append(({**headers, "Mcp-Param-Query": "Tangier"}, body))
        headers, body = modern_call(24, "nope", {})
        modern_cases.append((headers, body))
        headers, body = modern_call(25, "recall", recall)
        message = json.loads(body)
        message["params"]["_meta"]["io.modelcontextprotocol/clientInfo"] = 5
        modern_cases.append((headers, json.dumps(message)))
        del message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"]
        modern_cases.append((headers, json.dumps(message)))
        headers, body = modern_call(26, "recall", recall)
        modern_cases.append(({**headers, "MCP-Protocol-Version": "2099-01-01"}, body))
        headers, body = modern_call(27, "recall", recall)
        modern_cases.append(([*headers.items(), ("Mcp-Method", "tools/call")], body))
        headers, body = modern_call(28, "remember", turn)  # no Content-Type, a wrong one
        modern_cases.append(({k: v for k, v in headers.items() if k != "Content-Type"}, body))
        modern_cases.append(({**headers, "Content-Type": "text/plain"}, body))
        headers, body = modern_call(29, "recall", {**recall, "limit": -(2**70)})
        modern_cases.append((headers, body))
        for headers, body in modern_cases:
            answers = [
                seen(await client.post("/mcp", headers=headers, content=body))
                for client in (direct, sdk)
            ]
            assert answers[0] == answers[1], (headers, body, answers)
        first = await direct.post("/mcp", headers=modern_cases[0][0], content=modern_cases[0][1])
        assert first.json()["result"]["resultType"] == "complete", first.text
        assert first.json()["result"]["_meta"]["io.modelcontextprotocol/serverInfo"], first.text


async def test_a_session_busy_with_calls_answered_directly_stays_open_and_an_idle_one_closes(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    async with (
        mcp_over_http(settings, database_url, MEMWORKER_MCP_SESSION_IDLE_SECONDS="2") as base,
        httpx.AsyncClient(base_url=base, timeout=30) as http,
    ):
        session = await open_session(http)
        call = session_call(1, "profile", {"user_id": "ann"})
        # a call that runs past the idle timeout (its write waits on a lock) holds the session
        engine = create_database_engine(database_url)
        try:
            async with engine.connect() as conn:
                await conn.execute(text("LOCK TABLE episodes IN ACCESS EXCLUSIVE MODE"))
                turn = {"user_id": "ann", "session_id": "c", "input": "slow", "output": "ok"}
                slow = asyncio.ensure_future(
                    http.post("/mcp", headers=session, json=session_call(0, "remember", turn))
                )
                await asyncio.sleep(3.0)
                assert not slow.done()
                await conn.rollback()  # the lock released
        finally:
            await engine.dispose()
        assert (await slow).status_code == 200, slow.result().text
        after = await http.post("/mcp", headers=session, json=call)
        assert after.status_code == 200, after.text
        for _ in range(10):  # 5 s of calls, none more than 0.5 s after the last
            answered = await http.post("/mcp", headers=session, json=call)
            assert answered.status_code == 200, answered.text
            await asyncio.sleep(0.5)
        await asyncio.sleep(3.5)  # then idle past the 2 s
        closed = await http.post("/mcp", headers=session, json=call)
        assert closed.status_code == 404, closed.text
