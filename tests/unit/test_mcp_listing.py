"""The MCP tools' listing is made once: a 2026-07-28 call makes the SDK look up the called
tool's input schema (``mcp_server.input_schema``), and building every tool's JSON Schema for
each call made that revision ~7× slower than a session's call."""

from __future__ import annotations

import pytest

from worker.access import mcp_server
from worker.access.tools import TOOLS, Tool


def test_the_tools_schemas_are_built_once_for_listings_and_lookups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    schema = Tool.schema

    def counted(tool: Tool) -> dict[str, object]:
        built.append(tool.name)
        return schema(tool)

    monkeypatch.setattr(Tool, "schema", counted)
    monkeypatch.setattr(mcp_server, "_LISTED", [])
    first = mcp_server.listed()
    for _ in range(10):
        for tool in TOOLS:
            assert mcp_server.input_schema(tool.name) == tool.arguments.model_json_schema()
    assert [t.name for t in mcp_server.listed()] == [t.name for t in first]
    assert sorted(built) == sorted(tool.name for tool in TOOLS)
    assert mcp_server.input_schema("no-such-tool") is None
