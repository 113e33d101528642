"""Every field of every HTTP route and every MCP tool, sent hostile values, on real servers.

The routes are read from the FastAPI app ``memworker serve`` runs and the tools from the MCP
server's own ``tools/list``, so a new route or tool is covered (or, if it has a shape this suite
does not know, fails it). For each field of each, with the other fields valid: a NUL, a lone
surrogate, a huge value, negative and non-finite numbers, the wrong type, glob and path
characters and fullwidth look-alikes where an id is expected, times Postgres cannot hold.
Every one must be answered 4xx (HTTP) or ``isError`` (MCP) with one line naming the field,
never a 500 or a 503; the server stays up; the Postgres rows and Redis keys are exactly what
they were before (nothing half-written); no answer carries the API token.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import string
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.routing import APIRoute
from mcp import types as mcp_types
from redis.asyncio import Redis
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from schemas.ids import ID_PATTERN
from schemas.limits import MAX_REMEMBER_BATCH, MAX_VALUE_BYTES
from tests.cli_process import Memworker
from tests.helpers import spawn_session, worker_env
from tests.integration.test_access import free_port, migrated
from worker.access.http_api import create_app
from worker.settings import Settings

PROJECT = "hostile"
TOKEN = "hostile-s3cret-token-7f3a9c"
LIVE = "live-1"
OPEN_GETS = {"/healthz", "/readyz", "/metrics", "/openapi.json"}
"""The routes without a body; anything else the app serves must be a tool's POST."""
BASELINE = {"forget": {"user_id": "nobody"}}
"""Valid arguments a tool needs beyond its required fields (forget needs a selector)."""


@cache
def distinct_words(size: int) -> str:
    """``size`` bytes of distinct words: the text a tsvector grows fastest on."""
    words = ("".join(w) for w in itertools.product(string.ascii_lowercase, repeat=4))
    out, total = [], 0
    for word in words:
        out.append(word)
        total += len(word) + 1
        if total >= size:
            break
    return " ".join(out)


class Raw(str):
    """JSON text sent as it is (what ``json.dumps`` cannot build: 100,000 nested arrays)."""

    def __repr__(self) -> str:
        return f"<JSON {self[:12]}... {len(self)} bytes>"


def deep(levels: int) -> Raw:
    return Raw("[" * levels + "1" + "]" * levels)


def dumps(value: Any) -> str:
    """JSON as a hostile client sends it: NaN and Infinity bare, surrogates escaped, ``Raw``
    text as it is."""
    raws: list[str] = []

    def placeholder(item: Any) -> Any:
        if isinstance(item, Raw):
            raws.append(str(item))
            return f"@@raw{len(raws) - 1}@@"
        if isinstance(item, dict):
            return {k: placeholder(v) for k, v in item.items()}
        if isinstance(item, list):
            return [placeholder(v) for v in item]
        return item

    out = json.dumps(placeholder(value))
    for i, raw in enumerate(raws):
        out = out.replace(f'"@@raw{i}@@"', raw)
    return out


GLOB_AND_PATH = ["*", "%", "a?b", "[ab]", "../chat-a", "a/b", "a b", "ｃｈａｔ-ａ", "é", ".", ".."]
NON_FINITE = [float("nan"), float("inf"), float("-inf")]
WRONG = [12345, [], {"a": 1}, True]


def kind_of(name: str, schema: dict[str, Any]) -> str:
    """What a field is, from its JSON Schema (as the route and the tool publish it)."""
    options = [o for o in schema.get("anyOf", [schema]) if o.get("type") != "null"]
    field = options[0] if options else {}
    if field.get("pattern") == ID_PATTERN:
        return "id"
    if field.get("format") == "date-time":
        return "time"
    if field.get("type") in ("integer", "number", "boolean"):
        return str(field["type"])
    if field.get("type") == "string":
        return {"key": "key", "query": "query", "content": "content"}.get(name, "text")
    if not field or field.get("$ref", "").endswith("/JsonValue"):
        return "json"  # any JSON value
    if field.get("type") == "array" and "$ref" in field.get("items", {}):
        return "list"  # a batch of objects: each item's fields get their own cases
    raise AssertionError(f"field {name} of a shape this suite does not know: {schema}")


def hostile(kind: str) -> Iterator[Any]:
    """The values a field of ``kind`` must refuse."""
    if kind in ("id", "text", "query", "key", "content"):
        yield from ["a\x00b", "a\ud800b", "\udfff", 12345, ["x"], {"x": 1}, 1.5, True]
    if kind == "id":
        yield from ["", "a" * 129, distinct_words(1 << 20), *GLOB_AND_PATH]
    if kind in ("text", "query"):
        yield distinct_words(1 << 20)
    if kind == "query":
        yield from ["   ", "\n\t"]
    if kind == "content":
        yield "y" * (MAX_VALUE_BYTES + 1)
    if kind == "key":
        yield from ["", "_reserved", "k" * 257, distinct_words(1 << 20)]
    if kind == "integer":
        yield from [0, -1, 10**30, *NON_FINITE, 1.5, "five", [], None]
    if kind == "boolean":
        yield from ["true", 1, 0, "yes", [], {"a": 1}, None]
    if kind == "number":
        yield from [-1e9, 1e308, *NON_FINITE, "high", [], {}]
    if kind == "time":
        yield from [
            "0001-01-01T00:00:00+14:00",
            "9999-12-31T23:59:59-14:00",
            "9999-12-31T23:59:59.999999Z",  # asyncpg sends it as infinity
            "0001-01-01T00:00:00Z",  # and this as -infinity
            "10000-01-01T00:00:00Z",
            "2026-13-45T00:00:00Z",
            "not a time",
            "2026-01-01T00:00:00Z\x00",
            -1e18,
            1e300,
            *NON_FINITE,
            [],
        ]
    if kind == "list":
        yield from ["x", 12345, {"a": 1}, [1], ["x"], [None], distinct_words(1 << 20)]
    if kind == "json":
        yield from [
            {"text": "\ud800"},
            float("nan"),
            [1, float("inf")],
            "v" * (MAX_VALUE_BYTES + 10),
            deep(100_000),
        ]


def valid(name: str, kind: str) -> Any:
    return {
        "id": LIVE if name == "session_id" else "ok-1",
        "time": datetime.now(UTC).isoformat(),
        "integer": 1,
        "number": 0.5,
        "boolean": False,
        "json": {"ok": True},
        "key": "plan",
    }.get(kind, "hello")


def item_schema(schema: dict[str, Any], field: dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema of the items of a ``list`` field (a ``$ref`` into ``$defs``)."""
    options = [o for o in field.get("anyOf", [field]) if o.get("type") != "null"]
    ref: str = options[0]["items"]["$ref"]
    item: dict[str, Any] = schema["$defs"][ref.rsplit("/", 1)[1]]
    return {**item, "$defs": schema["$defs"]}


def baseline(tool: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Valid arguments of ``tool``: its required fields (and what ``BASELINE`` adds); a list
    of objects holds one valid object."""
    properties: dict[str, Any] = schema.get("properties", {})
    base = {}
    for name in schema.get("required", []):
        kind = kind_of(name, properties[name])
        if kind == "list":
            base[name] = [baseline(tool, item_schema(schema, properties[name]))]
        else:
            base[name] = valid(name, kind)
    return base | BASELINE.get(tool, {})


def cases(tool: str, schema: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(the field, the arguments) for each hostile value of each field of ``tool``; for a
    list of objects, also each hostile value of each of the second object's fields (the
    field named ``list.1.field``), and one object more than the batch limit."""
    properties: dict[str, Any] = schema.get("properties", {})
    base = baseline(tool, schema)
    for name, field in properties.items():
        kind = kind_of(name, field)
        for value in hostile(kind):
            yield name, {**base, name: value}
        if kind != "list":
            continue
        item = item_schema(schema, field)
        good = baseline(tool, item)
        for inner, inner_field in item.get("properties", {}).items():
            for value in hostile(kind_of(inner, inner_field)):
                yield f"{name}.1.{inner}", {**base, name: [good, {**good, inner: value}]}
        yield f"{name}.1.nothing", {**base, name: [good, {**good, "nothing": 1}]}
        too_many = [good] * (MAX_REMEMBER_BATCH + 1)
        yield name, {**base, name: too_many}
    yield "nothing", {**base, "nothing": 1}  # an unknown field


def body(arguments: dict[str, Any]) -> bytes:
    return dumps(arguments).encode()


def http_tools() -> dict[str, dict[str, Any]]:
    """Every route of the app ``serve`` runs: a tool's POST (its body's JSON Schema) or a
    known GET; a route of another shape fails the suite (give it cases)."""
    app: Any = create_app(lambda: None, token=TOKEN, max_bytes=1 << 20)  # type: ignore[arg-type,return-value]
    while not isinstance(app, FastAPI):
        app = app.app  # the middlewares in front of it
    tools: dict[str, dict[str, Any]] = {}
    for route in app.routes:
        path = getattr(route, "path", "")
        if path in OPEN_GETS or path.startswith(("/docs", "/redoc")):
            continue
        assert isinstance(route, APIRoute) and route.methods == {"POST"}, path
        assert path.startswith("/v1/"), path
        [param] = route.dependant.body_params
        model = param.field_info.annotation
        models: list[Any] = [a for a in getattr(model, "__args__", (model,)) if a is not type(None)]
        tools[path.removeprefix("/v1/")] = models[0].model_json_schema()
    return tools


async def snapshot(redis: Redis, prefix: str, database_url: str) -> dict[str, Any]:
    """Every table's row count and every key under the prefix with its size."""
    state: dict[str, Any] = {}
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as conn:
            tables = await conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            )
            for (table,) in tables.all():
                count = await conn.execute(text(f'SELECT count(*) FROM "{table}"'))
                state[f"pg:{table}"] = count.scalar_one()
    finally:
        await engine.dispose()
    sizes = {
        "stream": "XLEN",
        "hash": "HLEN",
        "zset": "ZCARD",
        "list": "LLEN",
        "set": "SCARD",
        "string": "STRLEN",
    }
    async for key in redis.scan_iter(match=f"{prefix}:*", count=1000):
        kind: Any = await redis.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        size = await redis.execute_command(sizes[kind], key)  # type: ignore[no-untyped-call]
        state[f"redis:{key.decode()}"] = (kind, size)
    return state


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [
        f"{k}: {before.get(k)} -> {after.get(k)}"
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
    ]


def judged(tool: str, field: str, value: Any, status: int, error: Any) -> str | None:
    """Why this answer is wrong, or None."""
    shown = repr(value)[:50]
    if not 400 <= status < 500 or status in (401, 403):
        return f"{tool}.{field}={shown}: status {status} {str(error)[:160]}"
    if not isinstance(error, str) or "\n" in error:
        return f"{tool}.{field}={shown}: not one line: {str(error)[:160]}"
    named = field in error or (isinstance(value, Raw) and "body" in error)  # unparsable
    if not named:
        return f"{tool}.{field}={shown}: the error does not name {field}: {error[:160]}"
    if TOKEN in error:
        return f"{tool}.{field}={shown}: the token is in the answer"
    return None


async def test_every_field_of_every_http_route_refuses_hostile_values(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    tools = http_tools()
    assert {"remember", "recall", "wm_set", "forget"} <= set(tools)
    await spawn_session(redis, settings, PROJECT, LIVE)
    port = free_port()
    env = worker_env(
        settings, MEMWORKER_API_TOKEN=TOKEN, MEMWORKER_API_MAX_REQUEST_BYTES=str(4 << 20)
    )
    process = Memworker(
        ["serve", "--project", PROJECT, "--port", str(port), "--host", "127.0.0.1"], env
    )
    auth = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    wrong: list[str] = []
    try:
        process.wait_for(f"on http://127.0.0.1:{port}")
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=60, headers=auth
        ) as http:
            for tool, schema in tools.items():  # each tool's valid call works, first
                base = baseline(tool, schema)
                done = await http.post(f"/v1/{tool}", content=body(base))
                assert done.status_code == 200, (tool, base, done.text)
            before = await snapshot(redis, settings.stream_prefix, settings.database_url)
            count = 0
            for tool, schema in tools.items():
                for field, arguments in cases(tool, schema):
                    got = await http.post(f"/v1/{tool}", content=body(arguments))
                    count += 1
                    payload = got.json() if got.content else None
                    error = payload.get("error") if isinstance(payload, dict) else payload
                    problem = judged(tool, field, arguments.get(field), got.status_code, error)
                    if problem:
                        wrong.append(problem)
            for path in sorted(OPEN_GETS):
                got = await http.get(path, params={"q": "\x00*../"})
                assert got.status_code == 200, (path, got.text)
            after = await snapshot(redis, settings.stream_prefix, settings.database_url)
            still = await http.post("/v1/recall", content=body({"query": "hello"}))
            assert still.status_code == 200, still.text
    finally:
        process.close()
    assert count > 300, count
    assert not wrong, f"{len(wrong)} of {count} answered wrong:\n" + "\n".join(wrong)
    assert not changed(before, after), "\n".join(changed(before, after))
    logged = "".join(process.lines)
    assert "Traceback" not in logged and TOKEN not in logged, logged[-2000:]


class McpStdio:
    """``memworker mcp`` over stdio spoken to in raw JSON-RPC lines, so a request may hold
    what an SDK client would never send (bare NaN, escaped lone surrogates: answered naming
    the field, ``worker.access.mcp_intake``)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.next_id = 0

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method})
        message = line[:-1] + ', "params": ' + dumps(params) + "}\n"
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(message.encode())
        await self.proc.stdin.drain()
        try:
            mcp_types.jsonrpc_message_adapter.validate_json(message, by_name=False)
        except ValueError:
            try:  # what JSON reads (a lone surrogate, NaN) is answered naming the field
                json.loads(message)
            except (ValueError, RecursionError):  # not JSON at all: dropped, unanswered
                assert "result" in await self.request("ping", {}), "the server stopped"
                return {"transport_refused": True}
        while True:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout=60)
            assert raw, "the MCP server closed stdout"
            answer: dict[str, Any] = json.loads(raw)
            if answer.get("id") == self.next_id:
                return answer

    async def notify(self, method: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", "method": method}) + "\n").encode())
        await self.proc.stdin.drain()


async def test_every_field_of_every_mcp_tool_refuses_hostile_values(
    redis: Redis, settings: Settings, database_url: str
) -> None:
    settings = await migrated(settings, database_url)
    await spawn_session(redis, settings, PROJECT, LIVE)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.cli",
        "mcp",
        "--project",
        PROJECT,
        env=worker_env(settings),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=16 << 20,
    )
    mcp = McpStdio(proc)
    wrong: list[str] = []
    count = 0
    try:
        started = await mcp.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "hostile", "version": "1"},
            },
        )
        assert "result" in started, started
        await mcp.notify("notifications/initialized")
        listed = (await mcp.request("tools/list", {}))["result"]["tools"]
        tools = {t["name"]: t["inputSchema"] for t in listed}
        assert set(tools) == set(http_tools()), "the doors serve the same tools"
        before = await snapshot(redis, settings.stream_prefix, settings.database_url)
        for tool, schema in tools.items():
            for field, arguments in cases(tool, schema):
                answer = await mcp.request("tools/call", {"name": tool, "arguments": arguments})
                count += 1
                value = arguments.get(field)
                if "transport_refused" in answer:  # never reached a tool: nothing to name
                    continue
                if "error" in answer:  # refused by the protocol layer: must name the field
                    message = str(answer["error"].get("message", ""))
                    if field not in message and "JSON" not in message:
                        wrong.append(f"{tool}.{field}={value!r:.50}: {answer['error']}")
                    continue
                result = answer["result"]
                error = json.loads(result["content"][0]["text"]).get("error")
                status = 422 if result.get("isError") else 200
                if (problem := judged(tool, field, value, status, error)) is not None:
                    wrong.append(problem)
        ghost = {"session_id": "ghost1", "key": "stray", "value": 1}
        answer = await mcp.request("tools/call", {"name": "wm_set", "arguments": ghost})
        assert answer["result"]["isError"], answer  # a door never creates a session
        assert "unknown_session: session_id ghost1" in answer["result"]["content"][0]["text"]
        after = await snapshot(redis, settings.stream_prefix, settings.database_url)
        still = await mcp.request("tools/call", {"name": "recall", "arguments": {"query": "x"}})
        assert not still["result"].get("isError"), still
    finally:
        if proc.returncode is None:
            proc.kill()
        stderr = (await proc.communicate())[1].decode(errors="replace")
    assert count > 300, count
    assert not wrong, f"{len(wrong)} of {count} answered wrong:\n" + "\n".join(wrong)
    assert not changed(before, after), "\n".join(changed(before, after))
    # a 5xx is logged as "tool call failed": none may be
    assert "tool call failed" not in stderr and "Traceback" not in stderr, stderr[-3000:]
